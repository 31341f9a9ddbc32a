package main

import (
	"context"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/heraldpush/herald/api/client"
	"github.com/heraldpush/herald/db/dbtest"
)

// TestPublicListener: with HERALD_PUBLIC_ADDR set, serve binds a second
// listener that answers the device routes (receipts, the VAPID key, the web
// kit) and 404s the keyed API, the dashboard, River UI and the probes,
// while HERALD_ADDR goes on serving everything; a worker is refused one.
func TestPublicListener(t *testing.T) {
	t.Parallel()
	tdb := dbtest.New(t)
	_, _, vars := e2eEnvOn(t, tdb)
	vars["HERALD_PUBLIC_ADDR"] = "127.0.0.1:0"
	base, out, _ := startServeOut(t, vars, "--role", "api")
	m := regexp.MustCompile(`public listener on (http://\S+)`).FindStringSubmatch(out.String())
	require.NotNil(t, m, "serve never said where its public listener is:\n%s", out.String())
	public := m[1]

	do := func(method, url, body string, key bool) (int, string) {
		t.Helper()
		req, err := http.NewRequest(method, url, strings.NewReader(body))
		require.NoError(t, err)
		if body != "" {
			req.Header.Set("Content-Type", "application/json")
		}
		if key {
			req.Header.Set("Authorization", "Bearer "+testAPIKey)
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, string(b)
	}
	key, err := newAPIClient(t, public, "").GetVAPIDPublicKeyWithResponse(context.Background(), &client.GetVAPIDPublicKeyParams{})
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, key.StatusCode(), "%s", key.Body)
	require.Equal(t, vars["VAPID_PUBLIC_KEY"], key.JSON200.VapidPublicKey)
	require.Equal(t, "default", key.JSON200.App)
	status, body := do(http.MethodPost, public+"/v1/receipts", `{"receipts":[{"token":"AQGforgedforgedforgedforgedforged","event":"opened"}]}`, false)
	require.Equal(t, http.StatusUnauthorized, status, body)
	status, body = do(http.MethodGet, public+"/sdk/herald-sw.js", "", false)
	require.Equal(t, http.StatusOK, status)
	require.Contains(t, body, "pushsubscriptionchange")

	for _, path := range []string{"/v1/messages", "/v1/apps", "/v1/keys", "/", "/riverui/", "/healthz", "/readyz", "/metrics", "/openapi.yaml"} {
		status, body := do(http.MethodGet, public+path, "", true)
		require.Equal(t, http.StatusNotFound, status, "%s on the public listener: %s", path, body)
	}
	status, _ = do(http.MethodPost, public+"/v1/messages", `{"audience":{"type":"users","ids":["u"]},"payload":{"title":"x"}}`, true)
	require.Equal(t, http.StatusNotFound, status)

	// The main listener still serves both.
	status, _ = do(http.MethodGet, base+"/v1/messages", "", true)
	require.Equal(t, http.StatusOK, status)
	status, _ = do(http.MethodGet, base+"/v1/vapid-public-key", "", false)
	require.Equal(t, http.StatusOK, status)

	err = run(context.Background(), []string{"herald", "serve", "--role", "worker"}, env(vars), io.Discard, io.Discard)
	require.ErrorContains(t, err, "HERALD_PUBLIC_ADDR")
}
