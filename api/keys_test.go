package api

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// makeKey stores a key of scope and returns its secret; the server takes it
// at its next refresh, which makeKey does.
func (b *bundle) makeKey(t testing.TB, name string, scope Scope, expires *time.Time) string {
	t.Helper()
	_, secret, err := CreateKey(context.Background(), b.db.Pool, NewKey{Name: name, Scope: scope, ExpiresAt: expires})
	require.NoError(t, err)
	require.NoError(t, b.srv.keys.refresh(context.Background()))
	return secret
}

// as is a request made with secret instead of the test's bootstrap key.
func as(secret string, r request) request {
	if r.header == nil {
		r.header = map[string]string{}
	}
	r.header["Authorization"] = "Bearer " + secret
	return r
}

// TestScopesOfEveryRoute calls every /v1 route with a key of each scope:
// a key whose scope is below the operation's x-herald-scope in openapi.yaml
// is refused with 403 forbidden naming the scope needed, and one at or above
// it is not. So the document and routes.go cannot disagree, and a route
// added without a scope fails here (a read key would reach it).
func TestScopesOfEveryRoute(t *testing.T) {
	t.Parallel()
	doc, _ := openAPIRouter(t)
	b := setup(t)
	secrets := map[Scope]string{}
	for _, scope := range append(slices.Clone(scopes), ScopeApps) {
		secrets[scope] = b.makeKey(t, "every-route-"+string(scope), scope, nil)
	}
	seen := 0
	for _, r := range b.srv.echo.Routes() {
		switch r.Method {
		case http.MethodGet, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete:
		default:
			continue // Echo's own catch-alls
		}
		if !strings.HasPrefix(r.Path, "/v1/") {
			continue
		}
		path := echoParam.ReplaceAllString(r.Path, "{$1}")
		item := doc.Paths.Find(path)
		require.NotNil(t, item, "%s %s", r.Method, path)
		op := item.GetOperation(r.Method)
		require.NotNil(t, op, "%s %s", r.Method, path)
		raw, ok := op.Extensions["x-herald-scope"].(string)
		require.True(t, ok, "%s %s has no x-herald-scope in openapi.yaml", r.Method, path)
		if raw == publicScope {
			// Taken without a key, and never refused for one's scope.
			rec := b.call(t, request{method: r.Method, path: echoParam.ReplaceAllString(r.Path, "x1"), body: "{}", noAuth: true})
			require.NotEqual(t, "unauthorized", decodeBody(t, rec)["error"].(map[string]any)["code"], "%s %s", r.Method, path)
			for _, secret := range secrets {
				rec := b.call(t, as(secret, request{method: r.Method, path: echoParam.ReplaceAllString(r.Path, "x1"), body: "{}"}))
				require.NotEqual(t, http.StatusForbidden, rec.Code, "%s %s", r.Method, path)
			}
			seen++
			continue
		}
		need, err := ParseScope(raw)
		require.NoError(t, err, "%s %s", r.Method, path)
		if r.Method == http.MethodGet {
			require.NotEqual(t, ScopeSend, need, "%s %s: a read needs read or admin", r.Method, path)
			require.NotEqual(t, ScopeApps, need, "%s %s: a read needs read or admin", r.Method, path)
		} else {
			require.NotEqual(t, ScopeRead, need, "%s %s: a change needs send, apps or admin", r.Method, path)
		}
		seen++
		for scope, secret := range secrets {
			target := echoParam.ReplaceAllString(r.Path, "x1")
			rec := b.call(t, as(secret, request{method: r.Method, path: target, body: "{}"}))
			if scope.allows(need) {
				require.NotEqual(t, http.StatusForbidden, rec.Code, "%s %s with a %s key: %s", r.Method, path, scope, rec.Body.String())
				continue
			}
			requireError(t, rec, http.StatusForbidden, "forbidden", "")
			require.Equal(t, string(need), decodeBody(t, rec)["error"].(map[string]any)["scope_needed"], "%s %s", r.Method, path)
		}
	}
	require.Greater(t, seen, 25)
}

// TestSendKeyCannotEraseOrManageKeys: an application's key (send) may
// register and send but not erase a user, make or list keys, or read the
// audit log; a read key cannot change anything. Each refusal is a 403 that
// names the scope needed, and changes nothing.
func TestSendKeyCannotEraseOrManageKeys(t *testing.T) {
	t.Parallel()
	b := setup(t)
	send := b.makeKey(t, "app", ScopeSend, nil)
	read := b.makeKey(t, "dashboards", ScopeRead, nil)

	rec := b.call(t, as(send, request{method: http.MethodPost, path: "/v1/devices", body: map[string]any{"user_id": "u1", "channel": "fcm", "token": "fcm-u1"}}))
	require.Equal(t, http.StatusCreated, rec.Code, rec.Body.String())

	for _, r := range []request{
		{method: http.MethodDelete, path: "/v1/users/u1"},
		{method: http.MethodPost, path: "/v1/keys", body: map[string]any{"name": "mine", "scope": "admin"}},
		{method: http.MethodGet, path: "/v1/keys"},
		{method: http.MethodDelete, path: "/v1/keys/app"},
		{method: http.MethodGet, path: "/v1/audit"},
	} {
		rec := b.call(t, as(send, r))
		requireError(t, rec, http.StatusForbidden, "forbidden", "")
		require.Contains(t, rec.Body.String(), `"scope_needed":"admin"`, "%s %s", r.method, r.path)
		require.Contains(t, rec.Body.String(), `key \"app\" has scope send`, "%s %s", r.method, r.path)
	}
	rec = b.call(t, as(read, request{method: http.MethodPost, path: "/v1/messages",
		body: map[string]any{"audience": map[string]any{"type": "users", "ids": []string{"u1"}}, "payload": map[string]any{"title": "hi"}}}))
	requireError(t, rec, http.StatusForbidden, "forbidden", "")
	require.Contains(t, rec.Body.String(), `"scope_needed":"send"`)
	require.Equal(t, http.StatusOK, b.call(t, as(read, request{method: http.MethodGet, path: "/v1/users/u1"})).Code)

	var users, keys, messages int
	require.NoError(t, b.db.Pool.QueryRow(context.Background(),
		`SELECT (SELECT count(*) FROM users), (SELECT count(*) FROM api_keys), (SELECT count(*) FROM messages)`).Scan(&users, &keys, &messages))
	require.Equal(t, []int{1, 2, 0}, []int{users, keys, messages}, "a refused call changed something")
}

// TestExpiredKeyIsRefused: a key past its expires_at is a 401 that says
// so, on the process that holds it in memory as soon as the clock passes
// it, and is no longer read once the database's clock has passed it.
func TestExpiredKeyIsRefused(t *testing.T) {
	t.Parallel()
	b := setup(t)
	expires := time.Now().Add(time.Hour)
	secret := b.makeKey(t, "temp", ScopeRead, &expires)
	require.Equal(t, http.StatusOK, b.call(t, as(secret, request{method: http.MethodGet, path: "/v1/providers"})).Code)

	b.srv.keys.now = func() time.Time { return expires.Add(time.Second) }
	rec := b.call(t, as(secret, request{method: http.MethodGet, path: "/v1/providers"}))
	requireError(t, rec, http.StatusUnauthorized, "unauthorized", "")
	require.Contains(t, rec.Body.String(), `the API key \"temp\" expired at`)

	b.srv.keys.now = time.Now
	_, err := b.db.Pool.Exec(context.Background(), `UPDATE api_keys SET expires_at = now() - interval '1 second' WHERE name = 'temp'`)
	require.NoError(t, err)
	require.NoError(t, b.srv.keys.refresh(context.Background()))
	rec = b.call(t, as(secret, request{method: http.MethodGet, path: "/v1/providers"}))
	requireError(t, rec, http.StatusUnauthorized, "unauthorized", "")
}

// TestKeysAPI makes, lists and revokes keys through /v1/keys: the secret is
// in the answer that makes a key and never again, it works at once, and
// once revoked it is refused at once by this process.
func TestKeysAPI(t *testing.T) {
	t.Parallel()
	b := setup(t)
	expires := time.Now().Add(48 * time.Hour).UTC().Truncate(time.Second)
	rec := b.call(t, request{method: http.MethodPost, path: "/v1/keys",
		body: map[string]any{"name": "billing", "scope": "send", "expires_at": expires}})
	require.Equal(t, http.StatusCreated, rec.Code, rec.Body.String())
	var made struct {
		Key
		Secret string `json:"secret"`
	}
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &made))
	require.Equal(t, "billing", made.Name)
	require.Equal(t, ScopeSend, made.Scope)
	require.True(t, expires.Equal(*made.ExpiresAt))
	require.True(t, strings.HasPrefix(made.Secret, secretPrefix), made.Secret)
	require.Greater(t, len(made.Secret), 40)

	rec = b.call(t, as(made.Secret, request{method: http.MethodPut, path: "/v1/users/u1", body: map[string]any{}}))
	require.Equal(t, http.StatusCreated, rec.Code, rec.Body.String())

	rec = b.call(t, request{method: http.MethodGet, path: "/v1/keys"})
	require.Equal(t, http.StatusOK, rec.Code)
	require.NotContains(t, rec.Body.String(), made.Secret)
	var page struct {
		Items []Key `json:"items"`
	}
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &page))
	require.Len(t, page.Items, 1)
	require.Equal(t, "billing", page.Items[0].Name)
	require.Nil(t, page.Items[0].RevokedAt)

	for _, tc := range []struct {
		body        map[string]any
		status      int
		code, field string
	}{
		{map[string]any{"name": "billing", "scope": "read"}, http.StatusConflict, "conflict", "name"},
		{map[string]any{"name": "has space", "scope": "read"}, http.StatusBadRequest, "invalid_field", "name"},
		{map[string]any{"name": "bootstrap:0011223344556677", "scope": "read"}, http.StatusBadRequest, "invalid_field", "name"},
		{map[string]any{"scope": "read"}, http.StatusBadRequest, "invalid_field", "name"},
		{map[string]any{"name": "x", "scope": "root"}, http.StatusBadRequest, "invalid_field", "scope"},
		{map[string]any{"name": "x", "scope": "read", "expires_at": "2001-01-01T00:00:00Z"}, http.StatusBadRequest, "invalid_field", "expires_at"},
	} {
		rec := b.call(t, request{method: http.MethodPost, path: "/v1/keys", body: tc.body})
		requireError(t, rec, tc.status, tc.code, tc.field)
	}

	require.Equal(t, http.StatusNoContent, b.call(t, request{method: http.MethodDelete, path: "/v1/keys/billing"}).Code)
	rec = b.call(t, as(made.Secret, request{method: http.MethodGet, path: "/v1/users/u1"}))
	requireError(t, rec, http.StatusUnauthorized, "unauthorized", "")
	require.Equal(t, http.StatusNoContent, b.call(t, request{method: http.MethodDelete, path: "/v1/keys/billing"}).Code, "revoking twice")
	requireError(t, b.call(t, request{method: http.MethodDelete, path: "/v1/keys/nobody"}), http.StatusNotFound, "not_found", "")
	requireError(t, b.call(t, request{method: http.MethodDelete, path: "/v1/keys/" + callerName(t, b, testKey)}), http.StatusConflict, "bootstrap_key", "")

	rec = b.call(t, request{method: http.MethodGet, path: "/v1/keys"})
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &page))
	require.NotNil(t, page.Items[0].RevokedAt)
}

// TestKeyUseIsRecorded: when a stored key was last used is noted in
// memory on each request and written in one statement for all keys.
func TestKeyUseIsRecorded(t *testing.T) {
	t.Parallel()
	b := setup(t)
	used := b.makeKey(t, "used", ScopeRead, nil)
	b.makeKey(t, "idle", ScopeRead, nil)
	require.Equal(t, http.StatusOK, b.call(t, as(used, request{method: http.MethodGet, path: "/v1/providers"})).Code)
	require.NoError(t, b.srv.keys.flushUse(context.Background()))
	keys, err := ListKeys(context.Background(), b.db.Pool)
	require.NoError(t, err)
	require.Len(t, keys, 2)
	require.NotNil(t, keys[0].LastUsedAt)
	require.WithinDuration(t, time.Now(), *keys[0].LastUsedAt, time.Minute)
	require.Nil(t, keys[1].LastUsedAt, "a key not used")
}

// callerName is the name of the key whose secret is given, as the audit
// log and the request log have it.
func callerName(t testing.TB, b *bundle, secret string) string {
	t.Helper()
	key, ok := b.srv.keys.match(secret)
	require.True(t, ok)
	return key.name
}

// TestBootstrapKeysAreAdminsNamedByFingerprint: HERALD_API_KEYS's keys may
// do everything, and are named by a fingerprint that is not the secret.
func TestBootstrapKeysAreAdminsNamedByFingerprint(t *testing.T) {
	t.Parallel()
	b := setup(t)
	name := callerName(t, b, testKey)
	require.Regexp(t, `^bootstrap:[0-9a-f]{16}$`, name)
	require.NotContains(t, name, testKey)
	require.NotEqual(t, name, callerName(t, b, "another-key-0123456789"))
	require.Equal(t, http.StatusOK, b.call(t, request{method: http.MethodGet, path: "/v1/audit"}).Code)
}

// TestAuditLogRecordsErasuresAndCancels: an erasure and a cancel are each
// recorded with the key's name, the route, the target and the status, and
// the request id the caller was answered with; a call refused for its
// scope is recorded too, one refused for its key is not. Only an admin key
// reads the log, a page at a time, by key.
func TestAuditLogRecordsErasuresAndCancels(t *testing.T) {
	t.Parallel()
	b := setup(t)
	admin := b.makeKey(t, "ops", ScopeAdmin, nil)
	send := b.makeKey(t, "app", ScopeSend, nil)
	b.population(t, "p", 2, 1)

	erase := b.call(t, as(admin, request{method: http.MethodDelete, path: "/v1/users/p0"}))
	require.Equal(t, http.StatusNoContent, erase.Code, erase.Body.String())
	made := b.call(t, as(send, request{method: http.MethodPost, path: "/v1/messages", body: map[string]any{
		"audience": map[string]any{"type": "users", "ids": []string{"p1"}}, "payload": map[string]any{"title": "later"},
		"dispatch_at": time.Now().Add(time.Hour).UTC().Format(time.RFC3339)}}))
	require.Equal(t, http.StatusAccepted, made.Code, made.Body.String())
	id := decodeBody(t, made)["message_id"].(string)
	cancel := b.call(t, as(send, request{method: http.MethodDelete, path: "/v1/messages/" + id}))
	require.Equal(t, http.StatusNoContent, cancel.Code, cancel.Body.String())
	refused := b.call(t, as(send, request{method: http.MethodDelete, path: "/v1/users/p1"}))
	require.Equal(t, http.StatusForbidden, refused.Code)
	b.call(t, as("not-a-key-0123456789", request{method: http.MethodDelete, path: "/v1/users/p1"}))

	requireError(t, b.call(t, as(send, request{method: http.MethodGet, path: "/v1/audit"})), http.StatusForbidden, "forbidden", "")

	type entry = auditEntry
	read := func(query string) ([]entry, *string) {
		rec := b.call(t, as(admin, request{method: http.MethodGet, path: "/v1/audit" + query}))
		require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
		var page auditPage
		require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &page))
		for i := range page.Items {
			// When, to the second; the rest is compared whole.
			require.WithinDuration(t, time.Now(), page.Items[i].At, time.Minute)
			page.Items[i].At = time.Time{}
		}
		return page.Items, page.NextCursor
	}
	str := func(s string) *string { return &s }
	ops, _ := read("?key_name=ops")
	require.Equal(t, []entry{{KeyName: str("ops"), Method: "DELETE", Route: "/v1/users/{user_id}", TargetID: str("p0"),
		Status: http.StatusNoContent, RequestID: erase.Header().Get("X-Request-Id")}}, ops)
	app, _ := read("?key_name=app")
	require.Equal(t, []entry{
		{KeyName: str("app"), Method: "DELETE", Route: "/v1/users/{user_id}", TargetID: str("p1"), Status: http.StatusForbidden, RequestID: refused.Header().Get("X-Request-Id")},
		{KeyName: str("app"), Method: "DELETE", Route: "/v1/messages/{message_id}", TargetID: &id, Status: http.StatusNoContent, RequestID: cancel.Header().Get("X-Request-Id")},
		{KeyName: str("app"), Method: "POST", Route: "/v1/messages", TargetID: &id, Status: http.StatusAccepted, RequestID: made.Header().Get("X-Request-Id")},
	}, app)

	// Pages, newest first; a cursor is its filter's alone.
	first, next := read("?key_name=app&limit=2")
	require.Len(t, first, 2)
	require.NotNil(t, next)
	rest, last := read("?key_name=app&limit=2&cursor=" + *next)
	require.Equal(t, app[2:], rest)
	require.Nil(t, last)
	rec := b.call(t, as(admin, request{method: http.MethodGet, path: "/v1/audit?key_name=ops&cursor=" + *next}))
	requireError(t, rec, http.StatusBadRequest, "invalid_cursor", "cursor")
	rec = b.call(t, as(admin, request{method: http.MethodGet, path: "/v1/audit?key_name=no%20such"}))
	requireError(t, rec, http.StatusBadRequest, "invalid_field", "key_name")

	// The population's batch and the two calls of each key: nothing more
	// (the call with no valid key is not there, nor the reads).
	all, _ := read("?limit=1000")
	require.Len(t, all, 5)
}

// TestAuditLogKeepsCallsWithIdsItCannotStore: an id that is not text
// PostgreSQL can store (invalid UTF-8, NUL) or is very long still leaves an
// entry, with the id made storable and cut short, so that no call goes
// unrecorded for its id.
func TestAuditLogKeepsCallsWithIdsItCannotStore(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, id := range []string{"%FF%FEu", "u%00x", strings.Repeat("long", 200)} {
		rec := b.call(t, request{method: http.MethodDelete, path: "/v1/users/" + id})
		require.Equal(t, http.StatusNotFound, rec.Code)
	}
	var targets []string
	rows, err := b.db.Pool.Query(context.Background(), "SELECT target_id FROM audit_log ORDER BY id")
	require.NoError(t, err)
	for rows.Next() {
		var s string
		require.NoError(t, rows.Scan(&s))
		targets = append(targets, s)
	}
	require.NoError(t, rows.Err())
	require.Equal(t, []string{"\uFFFDu", "u\uFFFDx", strings.Repeat("long", 64)}, targets)
}

// TestAuditLogRecordsTheDashboardsChanges: what an operator changes through
// the dashboard is recorded under the operator's name.
func TestAuditLogRecordsTheDashboardsChanges(t *testing.T) {
	t.Parallel()
	b := setupDashboard(t)
	ck, csrf := b.login(t)
	rec := b.browse(http.MethodDelete, "/ui/api/messages/msg_404", "", ck, map[string]string{csrfHeader: csrf})
	require.Equal(t, http.StatusNotFound, rec.Code)
	rec = b.browse(http.MethodPost, "/riverui/api/jobs/cancel", `{"ids":["1"]}`, ck, nil)
	require.Equal(t, http.StatusOK, rec.Code)
	rec = b.call(t, request{method: http.MethodGet, path: "/v1/audit?operator=admin"})
	require.Equal(t, http.StatusOK, rec.Code)
	var page auditPage
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &page))
	require.Len(t, page.Items, 2)
	admin, msg := adminUser, "msg_404"
	for i := range page.Items {
		page.Items[i].At, page.Items[i].RequestID = time.Time{}, ""
	}
	require.Equal(t, []auditEntry{
		{Operator: &admin, Method: "POST", Route: "/riverui/api/jobs/cancel", Status: http.StatusOK},
		{Operator: &admin, Method: "DELETE", Route: "/ui/api/messages/{message_id}", TargetID: &msg, Status: http.StatusNotFound},
	}, page.Items)
}

// TestRequestLogNamesTheKey: each API request's log line says which key
// made it.
func TestRequestLogNamesTheKey(t *testing.T) {
	t.Parallel()
	var log syncLog
	b := setupWith(t, dbtestNew(t), Config{Logger: log.logger()})
	secret := b.makeKey(t, "reporting", ScopeRead, nil)
	b.call(t, as(secret, request{method: http.MethodGet, path: "/v1/segments"}))
	require.Contains(t, log.String(), `"route":"/v1/segments"`)
	var line map[string]any
	for _, l := range strings.Split(log.String(), "\n") {
		if strings.Contains(l, `"route":"/v1/segments"`) {
			require.NoError(t, json.Unmarshal([]byte(l), &line))
		}
	}
	require.Equal(t, "reporting", line["key"], log.String())
}

// TestUnknownKeysNeverReachTheDatabase: a flood of made-up keys is answered
// from memory; not one of them takes a connection from the pool.
func TestUnknownKeysNeverReachTheDatabase(t *testing.T) {
	t.Parallel()
	b := setup(t)
	before := b.db.Pool.Stat().AcquireCount()
	for i := range 50 {
		req := httptest.NewRequest(http.MethodDelete, "/v1/users/u1", nil)
		req.Header.Set("Authorization", "Bearer made-up-key-"+strings.Repeat("x", i))
		rec := httptest.NewRecorder()
		b.srv.ServeHTTP(rec, req)
		require.Equal(t, http.StatusUnauthorized, rec.Code)
	}
	require.Equal(t, before, b.db.Pool.Stat().AcquireCount(), "a request with an unknown key used the database")
}

// syncLog is a JSON log kept in memory, safe to write from handlers while
// the test reads it.
type syncLog struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *syncLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *syncLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

func (l *syncLog) logger() *slog.Logger { return slog.New(slog.NewJSONHandler(l, nil)) }
