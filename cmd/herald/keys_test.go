package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/heraldpush/herald/api/client"
	"github.com/heraldpush/herald/db/dbtest"
)

// herald runs a command of this binary in-process and returns its stdout
// and stderr and its error.
func herald(t *testing.T, vars map[string]string, args ...string) (string, string, error) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	err := run(context.Background(), append([]string{"herald"}, args...), env(vars), &stdout, &stderr)
	return stdout.String(), stderr.String(), err
}

// TestKeysCommandRoundTrip makes, lists and revokes keys with `herald keys`:
// the secret is printed once, alone on stdout, and never listed; a revoked
// key is listed as revoked; bad input is refused with a reason.
func TestKeysCommandRoundTrip(t *testing.T) {
	t.Parallel()
	tdb := dbtest.New(t)
	vars := map[string]string{"DATABASE_URL": tdb.URL}

	secret, note, err := herald(t, vars, "keys", "create", "--name", "billing", "--scope", "send", "--expires-in", "720h")
	require.NoError(t, err)
	secret = strings.TrimSpace(secret)
	require.Regexp(t, `^herald_[A-Za-z0-9_-]{43}$`, secret)
	require.Contains(t, note, `made key "billing", scope send, expires `)
	out, _, err := herald(t, vars, "keys", "create", "--name", "reports", "--scope", "read")
	require.NoError(t, err)
	other := strings.TrimSpace(out)

	list, _, err := herald(t, vars, "keys", "list")
	require.NoError(t, err)
	require.NotContains(t, list, secret)
	require.NotContains(t, list, other)
	lines := strings.Split(strings.TrimSpace(list), "\n")
	require.Len(t, lines, 3, list)
	require.Regexp(t, `^NAME\s+SCOPE\s+CREATED\s+EXPIRES\s+LAST USED\s+REVOKED$`, lines[0])
	require.Regexp(t, `^billing\s+send\s+\S+Z\s+\S+Z\s+-\s+-$`, lines[1])
	require.Regexp(t, `^reports\s+read\s+\S+Z\s+never\s+-\s+-$`, lines[2])

	out, _, err = herald(t, vars, "keys", "revoke", "billing")
	require.NoError(t, err)
	require.Contains(t, out, `revoked key "billing"`)
	list, _, err = herald(t, vars, "keys", "list")
	require.NoError(t, err)
	require.Regexp(t, `(?m)^billing\s+send\s+\S+Z\s+\S+Z\s+-\s+\S+Z$`, list)
	require.Regexp(t, `(?m)^reports\s+read\s+\S+Z\s+never\s+-\s+-$`, list)

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"keys", "create", "--name", "billing", "--scope", "read"}, `a key named "billing" exists already`},
		{[]string{"keys", "create", "--name", "x", "--scope", "root"}, `scope "root" is not one of read, send, apps, admin`},
		{[]string{"keys", "create", "--scope", "read"}, "name is required"},
		{[]string{"keys", "create", "--name", "x", "--scope", "read", "--expires-in", "-1h"}, "positive duration"},
		{[]string{"keys", "revoke"}, "give the name"},
		{[]string{"keys", "revoke", "nobody"}, `key "nobody" does not exist`},
		{[]string{"keys", "rotate"}, "usage: herald keys"},
	} {
		_, _, err := herald(t, vars, tc.args...)
		require.ErrorContains(t, err, tc.want, strings.Join(tc.args, " "))
	}
	_, _, err = herald(t, map[string]string{"DATABASE_URL": dbtest.NewEmpty(t).URL}, "keys", "list")
	require.ErrorContains(t, err, "herald migrate")
}

// TestOperatorsCommand makes operators with the password on stdin or in a
// file, lists and removes them, and refuses a password too short.
func TestOperatorsCommand(t *testing.T) {
	t.Parallel()
	tdb := dbtest.New(t)
	vars := map[string]string{"DATABASE_URL": tdb.URL}
	operators := func(vars map[string]string, stdin string, args ...string) (string, error) {
		var stdout bytes.Buffer
		err := runOperators(context.Background(), args, env(vars), strings.NewReader(stdin), &stdout, io.Discard)
		return stdout.String(), err
	}
	out, err := operators(vars, "a long password for alice\n", "create", "--name", "alice")
	require.NoError(t, err)
	require.Contains(t, out, `made operator "alice"`)
	file := filepath.Join(t.TempDir(), "pw")
	require.NoError(t, os.WriteFile(file, []byte("bob's long password\n"), 0o600))
	_, err = operators(map[string]string{"DATABASE_URL": tdb.URL, passwordFileVar: file}, "", "create", "--name", "bob")
	require.NoError(t, err)

	_, err = operators(vars, "short\n", "create", "--name", "carol")
	require.ErrorContains(t, err, "at least 12")
	_, err = operators(vars, "two lines of\npassword here\n", "create", "--name", "carol")
	require.ErrorContains(t, err, "more than one line")
	_, err = operators(vars, "a long enough password", "create", "--name", "admin")
	require.ErrorContains(t, err, "HERALD_ADMIN_PASSWORD")
	_, err = operators(vars, "a long enough password", "create", "--name", "alice")
	require.ErrorContains(t, err, "exists already")

	out, err = operators(vars, "", "list")
	require.NoError(t, err)
	require.Regexp(t, `^NAME\s+CREATED\nalice\s+\S+Z\nbob\s+\S+Z\n$`, out)
	out, err = operators(vars, "", "remove", "bob")
	require.NoError(t, err)
	require.Contains(t, out, `removed operator "bob"`)
	_, err = operators(vars, "", "remove", "bob")
	require.ErrorContains(t, err, `no such operator named "bob"`)
	out, err = operators(vars, "", "list")
	require.NoError(t, err)
	require.NotContains(t, out, "bob")
}

// processPair is two `herald serve --role api` processes on one database,
// as behind a load balancer.
type processPair struct {
	vars     map[string]string
	one, two *serveProcess
}

func startPair(t *testing.T) *processPair {
	t.Helper()
	tdb := dbtest.New(t)
	vars := map[string]string{
		"DATABASE_URL": tdb.URL, "HERALD_API_KEYS": testAPIKey, "HERALD_ADMIN_PASSWORD": signInPassword, "HERALD_LOG_LEVEL": "warn",
	}
	return &processPair{vars: vars, one: startServeProcess(t, vars, "--role", "api"), two: startServeProcess(t, vars, "--role", "api")}
}

// status calls base with key and returns the answer's status.
func status(t *testing.T, method, url, key string) int {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// TestKeyRevokedOnOneProcessIsRefusedByAnother: a key made with `herald
// keys create` is taken by both processes without a restart; revoked
// through one's API, it is refused by that one at once and by the other
// within seconds.
func TestKeyRevokedOnOneProcessIsRefusedByAnother(t *testing.T) {
	t.Parallel()
	p := startPair(t)
	out, _, err := herald(t, p.vars, "keys", "create", "--name", "app", "--scope", "send")
	require.NoError(t, err)
	secret := strings.TrimSpace(out)

	for _, proc := range []*serveProcess{p.one, p.two} {
		require.Eventually(t, func() bool {
			return status(t, http.MethodGet, proc.base+"/v1/providers", secret) == http.StatusOK
		}, 30*time.Second, 50*time.Millisecond, "a new key was not taken by %s", proc.base)
	}
	// A send key cannot revoke keys, its own included.
	require.Equal(t, http.StatusForbidden, status(t, http.MethodDelete, p.one.base+"/v1/keys/app", secret))

	require.Equal(t, http.StatusNoContent, status(t, http.MethodDelete, p.one.base+"/v1/keys/app", testAPIKey))
	require.Equal(t, http.StatusUnauthorized, status(t, http.MethodGet, p.one.base+"/v1/providers", secret))
	require.Eventually(t, func() bool {
		return status(t, http.MethodGet, p.two.base+"/v1/providers", secret) == http.StatusUnauthorized
	}, 30*time.Second, 50*time.Millisecond, "the other process still takes a revoked key")
	require.Equal(t, http.StatusOK, status(t, http.MethodGet, p.two.base+"/v1/providers", testAPIKey))
}

// sessionCSRF reads a session's CSRF token (and operator) from base.
func sessionCSRF(t *testing.T, base string, session *http.Cookie) (int, string, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, base+"/ui/api/session", nil)
	require.NoError(t, err)
	req.AddCookie(session)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	var info struct {
		User      string `json:"user"`
		CSRFToken string `json:"csrf_token"`
	}
	if resp.StatusCode == http.StatusOK {
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&info))
	}
	return resp.StatusCode, info.User, info.CSRFToken
}

// TestDashboardSessionServedByEveryProcess: a session begun on one process
// is served by the other (no sticky routing needed), and signing out on
// the other ends it on both; an operator made with `herald operators
// create` signs in.
func TestDashboardSessionServedByEveryProcess(t *testing.T) {
	t.Parallel()
	p := startPair(t)
	resp := signIn(t, p.one.base, signInPassword, "/", nil)
	require.Equal(t, http.StatusSeeOther, resp.StatusCode)
	session := sessionCookie(resp)
	require.NotNil(t, session)

	code, user, csrf := sessionCSRF(t, p.two.base, session)
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, "admin", user)
	req, err := http.NewRequest(http.MethodPost, p.two.base+"/logout", nil)
	require.NoError(t, err)
	req.AddCookie(session)
	req.Header.Set("X-CSRF-Token", csrf)
	out, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	out.Body.Close()
	require.Equal(t, http.StatusNoContent, out.StatusCode)
	for _, proc := range []*serveProcess{p.one, p.two} {
		code, _, _ := sessionCSRF(t, proc.base, session)
		require.Equal(t, http.StatusUnauthorized, code, "a signed-out session still works on %s", proc.base)
	}

	file := filepath.Join(t.TempDir(), "pw")
	require.NoError(t, os.WriteFile(file, []byte("dana's long password"), 0o600))
	vars := map[string]string{"DATABASE_URL": p.vars["DATABASE_URL"], passwordFileVar: file}
	_, _, err = herald(t, vars, "operators", "create", "--name", "dana")
	require.NoError(t, err)
	resp = signInAs(t, p.two.base, "dana", "dana's long password", "/", nil)
	require.Equal(t, http.StatusSeeOther, resp.StatusCode)
	code, user, _ = sessionCSRF(t, p.one.base, sessionCookie(resp))
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, "dana", user)
}

// TestKeysScopesAndAuditThroughTheClient drives keys and the audit log
// through the generated client, as an operator's tooling would: an
// application's key (send) is made, schedules and cancels a message but
// cannot erase or read the log; the bootstrap key erases; the log shows the
// erasure and the cancel under each key's name; the revoked key is refused.
func TestKeysScopesAndAuditThroughTheClient(t *testing.T) {
	t.Parallel()
	tdb := dbtest.New(t)
	base, _ := startServe(t, map[string]string{"DATABASE_URL": tdb.URL, "HERALD_API_KEYS": testAPIKey, "HERALD_LOG_LEVEL": "warn"}, "--role", "api")
	ctx := t.Context()
	admin := newAPIClient(t, base, testAPIKey)

	made, err := admin.CreateKeyWithResponse(ctx, client.NewKey{Name: "app", Scope: client.ScopeSend})
	secret := answered(t, http.StatusCreated, made, err).JSON201.Secret
	app := newAPIClient(t, base, secret)

	put, err := app.PutUserWithResponse(ctx, "u1", client.UserUpdate{})
	answered(t, http.StatusCreated, put, err)
	device, err := app.RegisterDeviceWithResponse(ctx, client.DeviceRegistration{UserID: "u1", Channel: client.ChannelFCM, Token: new("fcm-token-of-u1")})
	deviceID := answered(t, http.StatusCreated, device, err).JSON201.DeviceID
	later, err := app.CreateMessageWithResponse(ctx, nil, client.NewMessage{DispatchAt: new(time.Now().Add(time.Hour)), Audience: toUsers("u1"), Payload: titled("later")})
	id := answered(t, http.StatusAccepted, later, err).JSON202.MessageID
	cancelled, err := app.CancelMessageWithResponse(ctx, id)
	answered(t, http.StatusNoContent, cancelled, err)
	refused, err := app.DeleteUserWithResponse(ctx, "u1")
	require.Equal(t, client.ScopeAdmin, answered(t, http.StatusForbidden, refused, err).JSON403.Error.ScopeNeeded)
	log, err := app.ListAuditWithResponse(ctx, nil)
	answered(t, http.StatusForbidden, log, err)
	erased, err := admin.DeleteUserWithResponse(ctx, "u1")
	answered(t, http.StatusNoContent, erased, err)

	type row struct {
		key, method, route, target string
		status                     int
	}
	entries := func(key string) []row {
		res, err := admin.ListAuditWithResponse(ctx, &client.ListAuditParams{KeyName: &key})
		var rows []row
		for _, e := range answered(t, http.StatusOK, res, err).JSON200.Items {
			rows = append(rows, row{*e.KeyName, e.Method, e.Route, *e.TargetID, e.Status})
		}
		return rows
	}
	bootstrap := "bootstrap:" + fingerprint(testAPIKey)
	require.Equal(t, []row{
		{bootstrap, "DELETE", "/v1/users/{user_id}", "u1", http.StatusNoContent},
		{bootstrap, "POST", "/v1/keys", "app", http.StatusCreated},
	}, entries(bootstrap))
	require.Equal(t, []row{
		{"app", "DELETE", "/v1/users/{user_id}", "u1", http.StatusForbidden},
		{"app", "DELETE", "/v1/messages/{message_id}", id, http.StatusNoContent},
		{"app", "POST", "/v1/messages", id, http.StatusAccepted},
		{"app", "POST", "/v1/devices", deviceID, http.StatusCreated},
		{"app", "PUT", "/v1/users/{user_id}", "u1", http.StatusCreated},
	}, entries("app"))

	keys, err := admin.ListKeysWithResponse(ctx, nil)
	listed := answered(t, http.StatusOK, keys, err).JSON200.Items
	require.Len(t, listed, 1)
	require.Equal(t, "app", listed[0].Name)
	require.NotContains(t, string(keys.Body), secret)
	revoked, err := admin.RevokeKeyWithResponse(ctx, "app")
	answered(t, http.StatusNoContent, revoked, err)
	again, err := app.GetUserWithResponse(ctx, "u1")
	answered(t, http.StatusUnauthorized, again, err)
}

// fingerprint is what names a bootstrap key: the first 16 hex digits of its
// SHA-256.
func fingerprint(secret string) string {
	sum := sha256.Sum256([]byte(secret))
	return hex.EncodeToString(sum[:8])
}
