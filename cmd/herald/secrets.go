package main

import (
	"fmt"
	"os"
	"strings"
)

// secretVars are the variables that hold secrets. Each may instead be given
// as a file, NAME_FILE naming it, as Kubernetes and systemd mount secrets:
// the environment of a process is visible to more than its files are (in
// /proc to the same user, in crash reports, in `docker inspect`). APNS_KEY_FILE
// and FCM_CREDENTIALS_FILE are files already.
var secretVars = []string{"DATABASE_URL", "HERALD_API_KEYS", "HERALD_ADMIN_PASSWORD", "VAPID_PRIVATE_KEY", "HERALD_SECRET_KEY"}

// maxSecretFile bounds what a NAME_FILE may hold: a secret is a line, a
// list of API keys a few lines; more is a wrong path.
const maxSecretFile = 64 << 10

// withSecretFiles returns getenv with each secret variable read from the
// file its NAME_FILE names, if that is set: the file's content less its
// trailing line breaks (an editor's or `echo`'s). Both NAME and NAME_FILE
// set is an error, as is a file that cannot be read; a file is read once.
func withSecretFiles(getenv func(string) string) (func(string) string, error) {
	fromFiles := map[string]string{}
	for _, name := range secretVars {
		path := getenv(name + "_FILE")
		if path == "" {
			continue
		}
		if getenv(name) != "" {
			return nil, fmt.Errorf("%s and %s_FILE are both set: give the secret one way", name, name)
		}
		b, err := readAtMost(path, maxSecretFile)
		if err != nil {
			return nil, fmt.Errorf("%s_FILE: %w", name, err)
		}
		fromFiles[name] = strings.TrimRight(string(b), "\r\n")
	}
	return func(name string) string {
		if v, ok := fromFiles[name]; ok {
			return v
		}
		return getenv(name)
	}, nil
}

// readAtMost reads a file of at most limit bytes: a secret is a line, a
// list of API keys a few lines; more is a wrong path.
func readAtMost(path string, limit int64) ([]byte, error) {
	info, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if info.Size() > limit {
		return nil, fmt.Errorf("%s holds %d bytes, more than a secret (%d at most)", path, info.Size(), limit)
	}
	return os.ReadFile(path)
}
