package main

import (
	"bytes"
	"context"
	"crypto/ecdh"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/heraldpush/herald/db/dbtest"
	"github.com/heraldpush/herald/jobs/apps"
	"github.com/heraldpush/herald/jobs/push/fake"
)

// checkCredentials runs `herald credentials check` with vars as its whole
// environment, and returns what it printed and its error.
func checkCredentials(t *testing.T, vars map[string]string, args ...string) (string, error) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	err := run(context.Background(), append([]string{"herald", "credentials", "check"}, args...), env(vars), &stdout, &stderr)
	require.Empty(t, stderr.String())
	return stdout.String(), err
}

// requireLine checks that out has exactly one line starting with prefix,
// and that it says each of says.
func requireLine(t *testing.T, out, prefix string, says ...string) {
	t.Helper()
	var found []string
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, prefix) {
			found = append(found, line)
		}
	}
	require.Len(t, found, 1, "one line starting %q in:\n%s", prefix, out)
	for _, s := range says {
		require.Contains(t, found[0], s, "the line starting %q", prefix)
	}
}

// requireNoSecret checks that out shows none of secrets, nor any PEM key.
func requireNoSecret(t *testing.T, out string, secrets ...string) {
	t.Helper()
	require.NotContains(t, out, "PRIVATE KEY")
	for _, s := range secrets {
		require.NotEmpty(t, s)
		require.NotContains(t, out, s, "a secret was printed")
	}
}

// startCheckFakepush starts a fakepush whose token endpoint the checks
// mint FCM tokens from, and whose apps' keys they check.
func startCheckFakepush(t *testing.T) *fake.Server {
	t.Helper()
	fp, err := fake.New(fake.Config{Addr: "127.0.0.1:0", TLSDir: t.TempDir()})
	require.NoError(t, err)
	require.NoError(t, fp.Start(context.Background()))
	t.Cleanup(func() { _ = fp.Close() })
	return fp
}

// p384KeyPEM is a PKCS #8 key that is not P-256, which Apple never makes.
func p384KeyPEM(t *testing.T) string {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	require.NoError(t, err)
	der, err := x509.MarshalPKCS8PrivateKey(key)
	require.NoError(t, err)
	return string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}))
}

// otherVAPIDPrivateKey is the private half of a new pair: not the one of
// any public key a test has.
func otherVAPIDPrivateKey(t *testing.T) string {
	t.Helper()
	key, err := ecdh.P256().GenerateKey(rand.Reader)
	require.NoError(t, err)
	return base64.RawURLEncoding.EncodeToString(key.Bytes())
}

// withUnknownKey is a service account's JSON with its private key
// replaced by a new one, which its token endpoint does not know.
func withUnknownKey(t *testing.T, serviceAccount []byte) string {
	t.Helper()
	var sa map[string]any
	require.NoError(t, json.Unmarshal(serviceAccount, &sa))
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	require.NoError(t, err)
	der, err := x509.MarshalPKCS8PrivateKey(key)
	require.NoError(t, err)
	sa["private_key"] = string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}))
	out, err := json.Marshal(sa)
	require.NoError(t, err)
	return string(out)
}

// serviceAccountOf is what a service account's JSON says of itself.
func serviceAccountOf(t *testing.T, serviceAccount []byte) (sa struct {
	ClientEmail  string `json:"client_email"`
	PrivateKeyID string `json:"private_key_id"`
}) {
	t.Helper()
	require.NoError(t, json.Unmarshal(serviceAccount, &sa))
	require.NotEmpty(t, sa.ClientEmail)
	return sa
}

// writeFile writes content to a new file of the test's and returns its
// path.
func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	require.NoError(t, os.WriteFile(path, []byte(content), 0o600))
	return path
}

// TestCredentialsCheckEnvironment: `herald credentials check` holds the
// default app's credentials of the environment to what their providers
// take, each channel on a line of its own, and fails naming the variable
// to fix: a good set passes, with an FCM token minted by fakepush, and
// each bad one fails alone while the other channels pass.
func TestCredentialsCheckEnvironment(t *testing.T) {
	t.Parallel()
	fp := startCheckFakepush(t)
	good := fp.Env()
	goodSA, err := os.ReadFile(good["FCM_CREDENTIALS_FILE"])
	require.NoError(t, err)
	sa := serviceAccountOf(t, goodSA)

	for _, tc := range []struct {
		name string
		set  map[string]string
		// fails is the failing line's start and what it says; none when
		// every channel passes.
		fails []string
		// offlinePasses: with --offline the set passes.
		offlinePasses bool
	}{
		{name: "good", offlinePasses: true},
		{name: "APNs key not P-256", set: map[string]string{"APNS_KEY_FILE": writeFile(t, "p384.p8", p384KeyPEM(t))},
			fails: []string{"FAIL default apns (environment): ", "APNS_KEY_FILE: must be a P-256 key"}},
		{name: "APNs key id wrong", set: map[string]string{"APNS_KEY_ID": "abc123"},
			fails: []string{"FAIL default apns (environment): ", "APNS_KEY_ID: must be the key's ten-character id", `"abc123"`}},
		{name: "APNs ids without a key", set: map[string]string{"APNS_KEY_FILE": ""},
			fails: []string{"FAIL default apns (environment): ", "APNS_KEY_FILE is not, so APNs is off"}},
		{name: "FCM file malformed", set: map[string]string{"FCM_CREDENTIALS_FILE": writeFile(t, "sa.json", `{"type": "service_account",`)},
			fails: []string{"FAIL default fcm (environment): ", "FCM_CREDENTIALS_FILE: must be the service account's JSON key file"}},
		{name: "FCM key unknown to its token endpoint", set: map[string]string{"FCM_CREDENTIALS_FILE": writeFile(t, "sa.json", withUnknownKey(t, goodSA))},
			fails:         []string{"FAIL default fcm (environment): ", fp.URL() + "/token refused it", "invalid_grant", "set FCM_CREDENTIALS_FILE"},
			offlinePasses: true},
		{name: "VAPID halves do not match", set: map[string]string{"VAPID_PRIVATE_KEY": otherVAPIDPrivateKey(t)},
			fails: []string{"FAIL default webpush (environment): ", "VAPID_PRIVATE_KEY: is not the private half"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			vars := map[string]string{}
			for k, v := range good {
				vars[k] = v
			}
			for k, v := range tc.set {
				vars[k] = v
			}
			out, err := checkCredentials(t, vars)
			requireNoSecret(t, out, good["VAPID_PRIVATE_KEY"], vars["VAPID_PRIVATE_KEY"])
			lines := map[string][]string{
				"apns":    {"ok   default apns (environment) ", "key " + good["APNS_KEY_ID"], "team " + good["APNS_TEAM_ID"], "topic " + good["APNS_TOPIC"]},
				"fcm":     {"ok   default fcm (environment) ", "project herald-fake", "as " + sa.ClientEmail, "key " + sa.PrivateKeyID, "(token minted)"},
				"webpush": {"ok   default webpush (environment) ", "public key " + good["VAPID_PUBLIC_KEY"], "subject " + good["VAPID_SUBJECT"]},
			}
			if tc.fails != nil {
				channel := strings.Fields(tc.fails[0])[2]
				lines[channel] = tc.fails
				require.EqualError(t, err, "1 of 3 credentials failed")
			} else {
				require.NoError(t, err)
			}
			for _, want := range lines {
				requireLine(t, out, want[0], want[1:]...)
			}
			require.Equal(t, 3, strings.Count(out, "\n"), "a line a channel:\n%s", out)

			out, err = checkCredentials(t, vars, "--offline")
			if tc.offlinePasses {
				require.NoError(t, err, "--offline mints no token:\n%s", out)
				requireLine(t, out, "ok   default fcm (environment) ", "(no token minted: --offline)")
			} else {
				require.Error(t, err, "--offline checks shapes still")
			}
		})
	}
}

// TestCredentialsCheckStored: with DATABASE_URL, every app's live stored
// credential is opened with HERALD_SECRET_KEY and checked, a retiring one
// too and a retired one not, each bad one failing with the command that
// replaces it; an FCM key its token endpoint refuses fails online and
// passes --offline; and credentials sealed with a key the process does not
// hold fail naming that key.
func TestCredentialsCheckStored(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	fp := startCheckFakepush(t)
	tdb := dbtest.New(t)
	sealer, err := apps.ParseSealKeys(testSecretKey)
	require.NoError(t, err)
	store := &apps.Store{Pool: tdb.Pool, Sealer: sealer}
	stored := func(app string, ins ...apps.Input) {
		t.Helper()
		_, _, err := store.Create(ctx, app)
		require.NoError(t, err)
		for _, in := range ins {
			_, err := store.Rotate(ctx, app, in)
			require.NoError(t, err)
		}
	}
	apnsOf := func(a fake.App) *apps.APNs {
		return &apps.APNs{KeyID: a.APNs.KeyID, TeamID: a.APNs.TeamID, Topic: a.APNs.Topic, Key: a.APNs.KeyPEM}
	}
	webPushOf := func(a fake.App) *apps.WebPush {
		return &apps.WebPush{PublicKey: a.WebPush.PublicKey, PrivateKey: a.WebPush.PrivateKey, Subject: a.WebPush.Subject}
	}

	// brand-b's are good: APNs rotated once (v1 retired), Web Push too (v1
	// retiring, still serving its subscriptions).
	b, _, err := fp.AddApp("brand-b")
	require.NoError(t, err)
	b2, err := fp.RotateAppKey("brand-b", "webpush")
	require.NoError(t, err)
	stored("brand-b",
		apps.Input{APNs: apnsOf(b)}, apps.Input{APNs: apnsOf(b)},
		apps.Input{FCM: &apps.FCM{ServiceAccount: b.FCM.ServiceAccountJSON}},
		apps.Input{WebPush: webPushOf(b)}, apps.Input{WebPush: webPushOf(b2)})
	// brand-c's are bad, each its own way (stored past the API's check).
	c, _, err := fp.AddApp("brand-c")
	require.NoError(t, err)
	badAPNs := apnsOf(c)
	badAPNs.Key = p384KeyPEM(t)
	badWebPush := webPushOf(c)
	badWebPush.PrivateKey = otherVAPIDPrivateKey(t)
	stored("brand-c", apps.Input{APNs: badAPNs}, apps.Input{FCM: &apps.FCM{ServiceAccount: `{"type": "service_account",`}},
		apps.Input{WebPush: badWebPush})
	// brand-d's FCM key is well formed, but deleted at Google: fakepush.
	d, _, err := fp.AddApp("brand-d")
	require.NoError(t, err)
	stored("brand-d", apps.Input{FCM: &apps.FCM{ServiceAccount: d.FCM.ServiceAccountJSON}})
	require.NoError(t, fp.RevokeAppKey("brand-d", "fcm", ""))

	vars := map[string]string{"DATABASE_URL": tdb.URL, "HERALD_SECRET_KEY": testSecretKey, "SSL_CERT_FILE": fp.Env()["SSL_CERT_FILE"]}
	goodLines := [][]string{
		{"ok   brand-b apns v2 ", "key " + b.APNs.KeyID, "team " + b.APNs.TeamID, "topic " + b.APNs.Topic},
		{"ok   brand-b webpush v1 (retiring) ", "public key " + b.WebPush.PublicKey},
		{"ok   brand-b webpush v2 ", "public key " + b2.WebPush.PublicKey, "subject " + b2.WebPush.Subject},
		{"FAIL brand-c apns v1: ", "apns.key: must be a P-256 key", "herald apps set-credentials brand-c --apns-key FILE"},
		{"FAIL brand-c fcm v1: ", "fcm.service_account: must be the service account's JSON key file", "herald apps set-credentials brand-c --fcm-service-account FILE"},
		{"FAIL brand-c webpush v1: ", "webpush.private_key: is not the private half", "herald apps set-credentials brand-c --vapid-public-key"},
	}
	secrets := []string{b.WebPush.PrivateKey, b2.WebPush.PrivateKey, c.WebPush.PrivateKey, badWebPush.PrivateKey}

	out, err := checkCredentials(t, vars)
	require.EqualError(t, err, "4 of 8 credentials failed", out)
	requireNoSecret(t, out, secrets...)
	for _, want := range goodLines {
		requireLine(t, out, want[0], want[1:]...)
	}
	requireLine(t, out, "ok   brand-b fcm v1 ", "project "+b.FCM.ProjectID, "as "+serviceAccountOf(t, []byte(b.FCM.ServiceAccountJSON)).ClientEmail, "key "+b.FCM.KeyID, "(token minted)")
	requireLine(t, out, "FAIL brand-d fcm v1: ", fp.URL()+"/token refused it", "invalid_grant", "herald apps set-credentials brand-d --fcm-service-account FILE")
	require.NotContains(t, out, "brand-b apns v1", "a retired credential is not checked")
	require.Equal(t, 8, strings.Count(out, "\n"), "a line a live credential:\n%s", out)

	out, err = checkCredentials(t, vars, "--offline")
	require.EqualError(t, err, "3 of 8 credentials failed", out)
	for _, want := range goodLines {
		requireLine(t, out, want[0], want[1:]...)
	}
	requireLine(t, out, "ok   brand-d fcm v1 ", "project "+d.FCM.ProjectID, "(no token minted: --offline)")

	// Sealed with a key the process does not hold, or with none at all:
	// every stored credential says which key it needs.
	keyID := sealer.KeyID()
	other := base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{7}, 32))
	for secretKey, says := range map[string]string{
		other: "the credential was sealed with key " + keyID + ", which HERALD_SECRET_KEY does not hold",
		"":    "it was sealed with key " + keyID + " and HERALD_SECRET_KEY is not set",
	} {
		vars["HERALD_SECRET_KEY"] = secretKey
		out, err = checkCredentials(t, vars, "--offline")
		require.EqualError(t, err, "8 of 8 credentials failed", out)
		requireLine(t, out, "FAIL brand-b apns v2: ", "cannot be opened", says, "or if that key is lost, store a working one: herald apps set-credentials brand-b --apns-key")
		requireLine(t, out, "FAIL brand-b webpush v1 (retiring): ", "cannot be opened", says, "or if that key is lost, retire it: herald apps retire brand-b webpush --version 1")
		require.Equal(t, 8, strings.Count(out, "FAIL "), out)
	}
}

// TestCredentialsCheckNothingToCheck: with no credential anywhere the
// check fails saying so, whether or not it has a database to read; and
// the command is listed and answers --help.
func TestCredentialsCheckNothingToCheck(t *testing.T) {
	t.Parallel()
	out, err := checkCredentials(t, nil)
	require.ErrorContains(t, err, "no credentials to check")
	require.ErrorContains(t, err, "DATABASE_URL is not set")
	require.Empty(t, out)

	out, err = checkCredentials(t, map[string]string{"DATABASE_URL": dbtest.New(t).URL})
	require.ErrorContains(t, err, "no app has a live stored one")
	require.Empty(t, out)

	var help bytes.Buffer
	require.NoError(t, run(context.Background(), []string{"herald", "credentials", "check", "--help"}, env(nil), &help, &bytes.Buffer{}))
	for _, want := range []string{"Usage: herald credentials check [--offline]", "-offline", "FCM_CREDENTIALS_FILE", "HERALD_SECRET_KEY", "SSL_CERT_FILE"} {
		require.Contains(t, help.String(), want)
	}
	help.Reset()
	require.NoError(t, run(context.Background(), []string{"herald", "help"}, env(nil), &help, &bytes.Buffer{}))
	require.Contains(t, help.String(), "herald credentials check [--offline]")
	require.Error(t, run(context.Background(), []string{"herald", "credentials", "verify"}, env(nil), &bytes.Buffer{}, &bytes.Buffer{}))
}
