package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestSecretsFromFiles: each secret may be given as a file, as Kubernetes
// and systemd mount them; the file's trailing line break is not part of
// it; both forms at once, or a file that is not there, are refused.
func TestSecretsFromFiles(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, []byte(content), 0o600))
		return p
	}
	env := map[string]string{
		"DATABASE_URL_FILE":          write("db", "postgres://u:p@db/herald\n"),
		"HERALD_API_KEYS_FILE":       write("keys", "first-key-0123456789,second-key-0123456789\r\n"),
		"HERALD_ADMIN_PASSWORD_FILE": write("admin", "a long admin password"),
	}
	cfg, err := loadConfig(func(k string) string { return env[k] })
	require.NoError(t, err)
	require.Equal(t, "postgres://u:p@db/herald", cfg.DatabaseURL)
	require.Equal(t, []string{"first-key-0123456789", "second-key-0123456789"}, cfg.APIKeys)
	require.Equal(t, "a long admin password", cfg.AdminPassword)

	env["HERALD_API_KEYS"] = "third-key-0123456789"
	_, err = loadConfig(func(k string) string { return env[k] })
	require.ErrorContains(t, err, "HERALD_API_KEYS and HERALD_API_KEYS_FILE are both set")
	delete(env, "HERALD_API_KEYS")

	env["VAPID_PRIVATE_KEY_FILE"] = filepath.Join(dir, "missing")
	_, err = loadConfig(func(k string) string { return env[k] })
	require.ErrorContains(t, err, "VAPID_PRIVATE_KEY_FILE")
}
