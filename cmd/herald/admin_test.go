package main

import (
	"io"
	"net/http"
	"regexp"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/heraldpush/herald/db/dbtest"
)

// TestAdminListener: with HERALD_ADMIN_ADDR set, /metrics moves off the
// public port to the operators' listener, which also serves Go's profiles.
func TestAdminListener(t *testing.T) {
	t.Parallel()
	tdb := dbtest.New(t)
	base, out, _ := startServeOut(t, map[string]string{
		"DATABASE_URL": tdb.URL, "HERALD_API_KEYS": testAPIKey, "HERALD_ADMIN_ADDR": "127.0.0.1:0",
	}, "--role", "api")
	m := regexp.MustCompile(`admin listener on (http://\S+)`).FindStringSubmatch(out.String())
	require.NotNil(t, m, "serve never said where its admin listener is:\n%s", out.String())
	admin := m[1]

	get := func(url string) (int, string) {
		t.Helper()
		resp, err := http.Get(url)
		require.NoError(t, err)
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, string(body)
	}
	status, body := get(admin + "/metrics")
	require.Equal(t, http.StatusOK, status)
	require.Contains(t, body, "herald_build_info{")
	status, body = get(admin + "/debug/pprof/")
	require.Equal(t, http.StatusOK, status)
	require.Contains(t, body, "goroutine")
	status, _ = get(admin + "/debug/pprof/heap")
	require.Equal(t, http.StatusOK, status)
	status, _ = get(base + "/metrics")
	require.Equal(t, http.StatusNotFound, status, "/metrics is off the public port when the admin listener has it")
	status, _ = get(base + "/debug/pprof/")
	require.NotEqual(t, http.StatusOK, status, "profiles are never on the public port")
}
