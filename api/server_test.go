package api

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/riverqueue/river"
	"github.com/stretchr/testify/require"

	"github.com/heraldpush/herald/db"
	"github.com/heraldpush/herald/db/dbtest"
	"github.com/heraldpush/herald/jobs"
	"github.com/heraldpush/herald/jobs/apps"
	"github.com/heraldpush/herald/jobs/push"
)

const testKey = "test-key-0123456789abcdef"

// bundle holds what a test of the API needs. It keeps no testing.TB of its
// own: each helper takes the t of the (sub)test it runs in, so a failure
// inside a subtest fails that subtest and reports its own error.
type bundle struct {
	srv *Server
	db  *dbtest.DB
	q   *db.Queries
}

func setup(t testing.TB) *bundle {
	t.Helper()
	return setupWith(t, dbtest.New(t), Config{})
}

// dbtestNew is dbtest.New, for tests that build their own Config around it.
func dbtestNew(t testing.TB) *dbtest.DB { return dbtest.New(t) }

// setupWith builds a server on tdb; cfg's zero fields get the test defaults.
func setupWith(t testing.TB, tdb *dbtest.DB, cfg Config) *bundle {
	t.Helper()
	cfg.Logger, cfg.Pool = cmp.Or(cfg.Logger, discard), tdb.Pool
	if cfg.River == nil {
		cfg.River = insertOnlyRiver(t, tdb)
	}
	cfg.APIKeys = []string{"another-key-0123456789", testKey}
	if cfg.WebPushEgress == nil {
		// The tests' subscriptions name a push service of their own, which
		// an operator would add to HERALD_WEBPUSH_HOSTS.
		egress, err := push.NewEgressPolicy([]string{"push.example.test"})
		require.NoError(t, err)
		cfg.WebPushEgress = egress
	}
	if cfg.Metrics == nil {
		cfg.Metrics = promhttp.HandlerFor(prometheus.NewRegistry(), promhttp.HandlerOpts{})
	}
	if cfg.AppStore == nil {
		// Credentials sealed with a key of the test's own, as
		// HERALD_SECRET_KEY gives a process one.
		sealer, err := apps.NewSealer(bytes.Repeat([]byte{7}, apps.SealKeySize))
		require.NoError(t, err)
		cfg.Apps = apps.NewRegistry(apps.RegistryConfig{Pool: tdb.Pool, Sealer: sealer, Logger: discard})
		require.NoError(t, cfg.Apps.Refresh(context.Background()))
		cfg.AppStore = &apps.Store{Pool: tdb.Pool, Sealer: sealer}
	}
	srv, err := NewServer(cfg)
	require.NoError(t, err)
	require.NoError(t, srv.Refresh(context.Background()))
	return &bundle{srv: srv, db: tdb, q: db.On(tdb.Pool)}
}

var discard = slog.New(slog.NewTextHandler(io.Discard, nil))

// insertOnlyRiver is the River client of an api-role process: it enqueues
// and works nothing.
func insertOnlyRiver(t testing.TB, tdb *dbtest.DB) *river.Client[pgx.Tx] {
	t.Helper()
	client, err := jobs.NewRiverClient(tdb.Pool, jobs.RiverConfig{Logger: discard})
	require.NoError(t, err)
	return client
}

// request describes one call; body is marshalled unless it is a string,
// bytes or a reader, which are sent as they are.
type request struct {
	method, path string
	body         any
	header       map[string]string
	noAuth       bool
}

func (b *bundle) call(t testing.TB, r request) *httptest.ResponseRecorder {
	t.Helper()
	var body io.Reader
	switch v := r.body.(type) {
	case nil:
	case string:
		body = bytes.NewBufferString(v)
	case []byte:
		body = bytes.NewReader(v)
	case io.Reader:
		body = v
	default:
		raw, err := json.Marshal(v)
		require.NoError(t, err)
		body = bytes.NewReader(raw)
	}
	req := httptest.NewRequest(r.method, r.path, body)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if !r.noAuth {
		req.Header.Set("Authorization", "Bearer "+testKey)
	}
	for k, v := range r.header {
		req.Header.Set(k, v)
	}
	rec := httptest.NewRecorder()
	b.srv.ServeHTTP(rec, req)
	checkAgainstSpec(t, req, rec)
	return rec
}

// do makes an authenticated call and decodes the JSON answer into a map.
func (b *bundle) do(t testing.TB, method, path string, body any) (int, map[string]any) {
	t.Helper()
	rec := b.call(t, request{method: method, path: path, body: body})
	return rec.Code, decodeBody(t, rec)
}

func decodeBody(t testing.TB, rec *httptest.ResponseRecorder) map[string]any {
	t.Helper()
	if rec.Body.Len() == 0 {
		return nil
	}
	require.Equal(t, "application/json", mediaType(rec.Header().Get("Content-Type")), "body: %s", rec.Body.String())
	var m map[string]any
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &m), "body: %s", rec.Body.String())
	return m
}

func mediaType(ct string) string {
	for i, c := range ct {
		if c == ';' {
			return ct[:i]
		}
	}
	return ct
}

// requireError checks an error response's status, code and (when given) field.
func requireError(t testing.TB, rec *httptest.ResponseRecorder, status int, code, field string) {
	t.Helper()
	require.Equal(t, status, rec.Code, "body: %s", rec.Body.String())
	m := decodeBody(t, rec)
	e, ok := m["error"].(map[string]any)
	require.True(t, ok, "error object missing: %s", rec.Body.String())
	require.Equal(t, code, e["code"], "body: %s", rec.Body.String())
	require.NotEmpty(t, e["message"])
	if field != "" {
		require.Equal(t, field, e["field"], "body: %s", rec.Body.String())
	}
}

func TestHealthAndReadiness(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rec := b.call(t, request{method: http.MethodGet, path: "/healthz", noAuth: true})
	require.Equal(t, http.StatusOK, rec.Code)
	rec = b.call(t, request{method: http.MethodGet, path: "/readyz", noAuth: true})
	require.Equal(t, http.StatusOK, rec.Code)
	require.NotEmpty(t, rec.Header().Get("X-Request-Id"))
}

// TestReadinessFailsWhenNotReady checks that /readyz says not ready, and
// that why (which names the database) goes to the log, not to the
// anonymous caller.
func TestReadinessFailsWhenNotReady(t *testing.T) {
	t.Parallel()
	tdb := dbtest.NewEmpty(t)
	var log bytes.Buffer
	var why error
	srv, err := NewServer(Config{
		Logger: slog.New(slog.NewTextHandler(&log, nil)),
		Pool:   tdb.Pool,
		River:  insertOnlyRiver(t, tdb),
		Ready: func(ctx context.Context) error {
			why = db.CheckMigrated(ctx, tdb.Pool)
			return why
		},
	})
	require.NoError(t, err)
	rec := httptest.NewRecorder()
	srv.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
	requireError(t, rec, http.StatusServiceUnavailable, "not_ready", "")
	require.Error(t, why)
	require.NotContains(t, rec.Body.String(), why.Error())
	require.Contains(t, log.String(), why.Error())
}

func TestAPIKeyRequired(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for name, header := range map[string]map[string]string{
		"missing":      nil,
		"wrong key":    {"Authorization": "Bearer not-a-key-at-all-000000"},
		"wrong scheme": {"Authorization": "Basic " + testKey},
		"empty bearer": {"Authorization": "Bearer "},
	} {
		t.Run(name, func(t *testing.T) {
			rec := b.call(t, request{method: http.MethodGet, path: "/v1/users/u1/devices", noAuth: true, header: header})
			requireError(t, rec, http.StatusUnauthorized, "unauthorized", "")
			require.NotEmpty(t, rec.Header().Get("WWW-Authenticate"))
		})
	}
	// Both configured keys work.
	rec := b.call(t, request{method: http.MethodPut, path: "/v1/users/u1", body: map[string]any{},
		noAuth: true, header: map[string]string{"Authorization": "Bearer another-key-0123456789"}})
	require.Equal(t, http.StatusCreated, rec.Code, rec.Body.String())
}

func TestNoAPIKeysRefusesEverything(t *testing.T) {
	t.Parallel()
	tdb := dbtest.New(t)
	srv, err := NewServer(Config{Logger: discard, Pool: tdb.Pool, River: insertOnlyRiver(t, tdb)})
	require.NoError(t, err)
	for _, key := range []string{"", "anything-at-all-000000"} {
		req := httptest.NewRequest(http.MethodGet, "/v1/users/u1/devices", nil)
		if key != "" {
			req.Header.Set("Authorization", "Bearer "+key)
		}
		rec := httptest.NewRecorder()
		srv.ServeHTTP(rec, req)
		requireError(t, rec, http.StatusUnauthorized, "unauthorized", "")
	}
}

func TestUnknownRouteAndMethod(t *testing.T) {
	t.Parallel()
	b := setup(t)
	requireError(t, b.call(t, request{method: http.MethodGet, path: "/v1/nothing-here"}), http.StatusNotFound, "not_found", "")
	requireError(t, b.call(t, request{method: http.MethodPut, path: "/healthz"}), http.StatusMethodNotAllowed, "method_not_allowed", "")
}

// TestBodyThatDoesNotArriveIs408 checks that a body cut off by the server's
// read timeout is a 408 that says so, not a 400 quoting the network error,
// which names the server's own address.
func TestBodyThatDoesNotArriveIs408(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, path := range []string{"/v1/devices", "/v1/messages"} {
		body := io.MultiReader(strings.NewReader(`{"user_id":`), iotest.ErrReader(os.ErrDeadlineExceeded))
		rec := b.call(t, request{method: http.MethodPost, path: path, body: body})
		requireError(t, rec, http.StatusRequestTimeout, "request_timeout", "")
		require.NotContains(t, rec.Body.String(), "deadline", path)
	}
}

// TestDatabaseUnavailable checks that a call that needs the database while
// it cannot be reached answers 503 unavailable with Retry-After, not 500,
// and works again once the database is back, by itself.
func TestDatabaseUnavailable(t *testing.T) {
	t.Parallel()
	tdb := dbtest.New(t)
	proxy := dbtest.NewProxy(t, tdb.URL)
	pool, err := db.Open(context.Background(), proxy.URL, db.PoolConfig{MaxConns: 2})
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	b := setupWith(t, &dbtest.DB{Pool: pool, URL: proxy.URL}, Config{})
	device := map[string]any{"user_id": "u1", "channel": "fcm", "token": "fcm-token-1"}

	proxy.Down()
	for _, r := range []request{
		{method: http.MethodGet, path: "/v1/messages/msg_1"},
		{method: http.MethodPost, path: "/v1/devices", body: device},
	} {
		rec := b.call(t, r)
		requireError(t, rec, http.StatusServiceUnavailable, "unavailable", "")
		require.Equal(t, "2", rec.Header().Get("Retry-After"), "%s %s", r.method, r.path)
	}
	proxy.Up()
	rec := b.call(t, request{method: http.MethodPost, path: "/v1/devices", body: device})
	require.Equal(t, http.StatusCreated, rec.Code, rec.Body.String())
}
