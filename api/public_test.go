package api

import (
	"context"
	"crypto/ecdh"
	"crypto/rand"
	"encoding/base64"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// vapidPair is a fresh VAPID key pair as a webpush credential's body.
func vapidPair(t *testing.T) (public string, body map[string]any) {
	t.Helper()
	key, err := ecdh.P256().GenerateKey(rand.Reader)
	require.NoError(t, err)
	public = base64.RawURLEncoding.EncodeToString(key.PublicKey().Bytes())
	return public, map[string]any{"webpush": map[string]string{
		"public_key": public, "private_key": base64.RawURLEncoding.EncodeToString(key.Bytes()), "subject": "mailto:push@example.com",
	}}
}

// TestVAPIDPublicKeyIsPublic: a page reads an app's VAPID key without a
// key, from any origin, and after a rotation reads the new one; an app
// without one, or no app, is a 404 that says which.
func TestVAPIDPublicKeyIsPublic(t *testing.T) {
	t.Parallel()
	b := setup(t)
	get := func(query string) *httptest.ResponseRecorder {
		return b.call(t, request{method: http.MethodGet, path: "/v1/vapid-public-key" + query, noAuth: true})
	}
	requireError(t, get(""), http.StatusNotFound, "not_found", "app")
	requireError(t, get("?app=brand-b"), http.StatusNotFound, "not_found", "")

	rec := b.call(t, request{method: http.MethodPost, path: "/v1/apps", body: map[string]string{"name": "brand-b"}})
	require.Equal(t, http.StatusCreated, rec.Code, rec.Body.String())
	require.NoError(t, b.srv.cfg.Apps.Refresh(context.Background()))
	requireError(t, get("?app=brand-b"), http.StatusNotFound, "not_found", "app")

	first, cred := vapidPair(t)
	rec = b.call(t, request{method: http.MethodPost, path: "/v1/apps/brand-b/credentials", body: cred})
	require.Equal(t, http.StatusCreated, rec.Code, rec.Body.String())
	require.NoError(t, b.srv.cfg.Apps.Refresh(context.Background()))
	rec = get("?app=brand-b")
	require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
	require.Equal(t, map[string]any{"app": "brand-b", "vapid_public_key": first}, decodeBody(t, rec))
	require.Equal(t, "*", rec.Header().Get("Access-Control-Allow-Origin"))

	second, cred := vapidPair(t)
	rec = b.call(t, request{method: http.MethodPost, path: "/v1/apps/brand-b/credentials", body: cred})
	require.Equal(t, http.StatusCreated, rec.Code, rec.Body.String())
	require.NoError(t, b.srv.cfg.Apps.Refresh(context.Background()))
	require.Equal(t, second, decodeBody(t, get("?app=brand-b"))["vapid_public_key"], "a rotation's key is the one answered")
}

// deviceRoute reports whether method and path are a route a device may
// call: the public listener's.
func deviceRoute(method, path string) bool {
	switch {
	case path == "/v1/receipts" && (method == http.MethodPost || method == http.MethodOptions):
		return true
	case path == "/v1/vapid-public-key" && method == http.MethodGet:
		return true
	case path == "/sdk/*" && method == http.MethodGet:
		return true
	case path == "/v1/preferences" && (method == http.MethodGet || method == http.MethodPut):
		return true
	case (path == "/preferences" || path == "/preferences/*") && method == http.MethodGet:
		return true
	}
	return false
}

// TestPublicHandlerServesDeviceRoutesAlone: the public listener's handler
// answers what a device calls (receipts and their preflight, the VAPID
// key, the web kit, a user's own preferences form and what it calls) and
// 404s every other route the main listener serves, the keyed API (the
// link to the form too), the dashboard, River UI, health and metrics
// alike.
func TestPublicHandlerServesDeviceRoutesAlone(t *testing.T) {
	t.Parallel()
	b := setup(t)
	public := b.srv.PublicHandler()
	call := func(method, path, body string) *httptest.ResponseRecorder {
		req := httptest.NewRequest(method, path, strings.NewReader(body))
		if body != "" {
			req.Header.Set("Content-Type", "application/json")
		}
		req.Header.Set("Authorization", "Bearer "+testKey) // worth nothing there
		rec := httptest.NewRecorder()
		public.ServeHTTP(rec, req)
		return rec
	}

	rec := call(http.MethodPost, "/v1/receipts", `{"receipts":[{"token":"AQGforgedforgedforgedforgedforged","event":"delivered"}]}`)
	require.Equal(t, http.StatusUnauthorized, rec.Code, rec.Body.String())
	require.Contains(t, rec.Body.String(), `"forged"`)
	require.Equal(t, http.StatusNoContent, call(http.MethodOptions, "/v1/receipts", "").Code)
	rec = call(http.MethodGet, "/v1/vapid-public-key", "")
	require.Equal(t, http.StatusNotFound, rec.Code, "the route answers: the default app has no key here")
	require.Contains(t, rec.Body.String(), "has no Web Push key")
	for _, f := range []string{"herald-sw.js", "herald.js", "example.html", "example.js"} {
		rec = call(http.MethodGet, "/sdk/"+f, "")
		require.Equal(t, http.StatusOK, rec.Code, f)
		require.Equal(t, "no-cache", rec.Header().Get("Cache-Control"), f)
	}
	require.Contains(t, call(http.MethodGet, "/sdk/herald-sw.js", "").Header().Get("Content-Type"), "javascript")
	require.Equal(t, http.StatusNotFound, call(http.MethodGet, "/sdk/", "").Code, "no directory listing")
	require.Equal(t, http.StatusNotFound, call(http.MethodGet, "/sdk/nothing.js", "").Code)
	// The form: its page and files, and its calls, which take the link's
	// token and not a key.
	rec = call(http.MethodGet, "/preferences", "")
	require.Equal(t, http.StatusOK, rec.Code)
	require.Contains(t, rec.Body.String(), `<form id="form"`)
	require.Equal(t, http.StatusOK, call(http.MethodGet, "/preferences/form.js", "").Code)
	requireError(t, call(http.MethodGet, "/v1/preferences", ""), http.StatusUnauthorized, "invalid_token", "")
	requireError(t, call(http.MethodPut, "/v1/preferences", `{"opt_outs":[]}`), http.StatusUnauthorized, "invalid_token", "")

	checked := 0
	for _, r := range b.srv.echo.Routes() {
		switch r.Method {
		case http.MethodGet, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete:
		default:
			continue
		}
		if deviceRoute(r.Method, r.Path) {
			continue
		}
		path := echoParam.ReplaceAllString(r.Path, "x")
		path = strings.ReplaceAll(path, "*", "x")
		rec := call(r.Method, path, "{}")
		require.Equal(t, http.StatusNotFound, rec.Code, "%s %s on the public listener: %s", r.Method, path, rec.Body.String())
		checked++
	}
	require.Greater(t, checked, 40, "the main listener's routes were all tried")
	for _, path := range []string{"/", "/healthz", "/readyz", "/metrics", "/openapi.yaml", "/riverui/", "/assets/app.js", "/login"} {
		require.Equal(t, http.StatusNotFound, call(http.MethodGet, path, "").Code, path)
	}
}

// TestWebKitAnswersHEAD: a monitor or a CDN asks for the kit's files with
// HEAD, and gets their headers.
func TestWebKitAnswersHEAD(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, h := range []http.Handler{b.srv, b.srv.PublicHandler()} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodHead, "/sdk/herald.js", nil))
		require.Equal(t, http.StatusOK, rec.Code)
		require.Contains(t, rec.Header().Get("Content-Type"), "javascript")
		require.Empty(t, rec.Body.String())
	}
}
