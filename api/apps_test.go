package api

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// p8 is a fresh APNs signing key, as Apple's .p8 files hold one.
func p8(t *testing.T) string {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	der, err := x509.MarshalPKCS8PrivateKey(key)
	require.NoError(t, err)
	return string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}))
}

// TestAppsAreManagedWithoutTheirSecrets: an app is made once (201, then
// 200), takes credentials that are checked first (a bad one is a 400
// naming the field, which quotes no secret), answers its versions and
// public parts and never the private key, and is audited with its name; a
// key of scope apps manages apps but cannot send, and a send key cannot
// manage them.
func TestAppsAreManagedWithoutTheirSecrets(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rec := b.call(t, request{method: http.MethodPost, path: "/v1/apps", body: map[string]string{"name": "brand-b"}})
	require.Equal(t, http.StatusCreated, rec.Code, rec.Body.String())
	rec = b.call(t, request{method: http.MethodPost, path: "/v1/apps", body: map[string]string{"name": "brand-b"}})
	require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
	rec = b.call(t, request{method: http.MethodPost, path: "/v1/apps", body: map[string]string{"name": "Brand B"}})
	requireError(t, rec, http.StatusBadRequest, "invalid_field", "name")

	key := p8(t)
	cred := map[string]any{"apns": map[string]string{"key_id": "ABCDE12345", "team_id": "TEAM123456", "topic": "com.example.b", "key": key}}
	rec = b.call(t, request{method: http.MethodPost, path: "/v1/apps/brand-b/credentials", body: cred})
	require.Equal(t, http.StatusCreated, rec.Code, rec.Body.String())
	require.Equal(t, float64(1), decodeBody(t, rec)["version"])
	rec = b.call(t, request{method: http.MethodPost, path: "/v1/apps/brand-b/credentials", body: cred})
	require.Equal(t, float64(2), decodeBody(t, rec)["version"], "storing again rotates")

	bad := map[string]any{"apns": map[string]string{"key_id": "ABCDE12345", "team_id": "TEAM123456", "topic": "com.example.b", "key": key[:len(key)/2]}}
	rec = b.call(t, request{method: http.MethodPost, path: "/v1/apps/brand-b/credentials", body: bad})
	requireError(t, rec, http.StatusBadRequest, "invalid_field", "apns.key")
	body := strings.Split(strings.TrimSpace(key), "\n")[1]
	require.NotContains(t, rec.Body.String(), body[:20])

	rec = b.call(t, request{method: http.MethodGet, path: "/v1/apps/brand-b"})
	require.Equal(t, http.StatusOK, rec.Code)
	require.NotContains(t, rec.Body.String(), body[:20])
	require.Contains(t, rec.Body.String(), `"state":"retired"`)
	require.Contains(t, rec.Body.String(), `"state":"active"`)

	rec = b.call(t, request{method: http.MethodDelete, path: "/v1/apps/brand-b/credentials/apns?version=2"})
	require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
	require.Len(t, decodeBody(t, rec)["retired"], 1)
	rec = b.call(t, request{method: http.MethodGet, path: "/v1/apps/nope"})
	requireError(t, rec, http.StatusNotFound, "not_found", "")

	rec = b.call(t, request{method: http.MethodGet, path: "/v1/audit"})
	require.Contains(t, rec.Body.String(), `"app":"brand-b"`)
	require.NotContains(t, rec.Body.String(), body[:20])

	apps := b.makeKey(t, "credentials-bot", ScopeApps, nil)
	send := b.makeKey(t, "backend", ScopeSend, nil)
	rec = b.call(t, as(apps, request{method: http.MethodPatch, path: "/v1/apps/brand-b", body: map[string]bool{"disabled": true}}))
	require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
	require.Equal(t, true, decodeBody(t, rec)["disabled"])
	rec = b.call(t, as(apps, request{method: http.MethodPost, path: "/v1/messages", body: map[string]any{
		"audience": map[string]any{"type": "users", "ids": []string{"u1"}}, "payload": map[string]string{"title": "x"}}}))
	requireError(t, rec, http.StatusForbidden, "forbidden", "")
	rec = b.call(t, as(send, request{method: http.MethodPost, path: "/v1/apps", body: map[string]string{"name": "brand-c"}}))
	requireError(t, rec, http.StatusForbidden, "forbidden", "")
	rec = b.call(t, request{method: http.MethodPatch, path: "/v1/apps/default", body: map[string]bool{"disabled": true}})
	requireError(t, rec, http.StatusBadRequest, "invalid_field", "disabled")
}

// TestKeysLimitedToApps: a key limited to brand-b registers devices of
// brand-b alone (its one app is the default for a registration that names
// none), sends to brand-b alone (a message that names no app is brand-b's),
// cannot make apps and sees only its own.
func TestKeysLimitedToApps(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, name := range []string{"brand-b", "brand-c"} {
		rec := b.call(t, request{method: http.MethodPost, path: "/v1/apps", body: map[string]string{"name": name}})
		require.Equal(t, http.StatusCreated, rec.Code, rec.Body.String())
	}
	_, secret, err := CreateKey(context.Background(), b.db.Pool, NewKey{Name: "partner", Scope: ScopeSend, Apps: []string{"brand-b"}})
	require.NoError(t, err)
	require.NoError(t, b.srv.keys.refresh(context.Background()))
	_, _, err = CreateKey(context.Background(), b.db.Pool, NewKey{Name: "nobody", Scope: ScopeSend, Apps: []string{"brand-z"}})
	require.ErrorContains(t, err, `no app is named "brand-z"`)

	rec := b.call(t, as(secret, request{method: http.MethodPost, path: "/v1/devices", body: map[string]any{"user_id": "u1", "channel": "fcm", "token": "fcm-u1"}}))
	require.Equal(t, http.StatusCreated, rec.Code, rec.Body.String())
	require.Equal(t, "brand-b", decodeBody(t, rec)["app"], "its one app")
	rec = b.call(t, as(secret, request{method: http.MethodPost, path: "/v1/devices", body: map[string]any{"user_id": "u1", "channel": "fcm", "token": "fcm-u1c", "app": "brand-c"}}))
	requireError(t, rec, http.StatusForbidden, "forbidden", "app")
	rec = b.call(t, as(secret, request{method: http.MethodPost, path: "/v1/devices/batch", body: map[string]any{"devices": []map[string]any{
		{"user_id": "u2", "channel": "fcm", "token": "fcm-u2", "app": "brand-b"},
		{"user_id": "u2", "channel": "fcm", "token": "fcm-u2d", "app": "default"},
	}}}))
	requireError(t, rec, http.StatusForbidden, "forbidden", "devices[1].app")

	rec = b.call(t, as(secret, request{method: http.MethodPost, path: "/v1/messages", body: map[string]any{
		"audience": map[string]any{"type": "users", "ids": []string{"u1"}}, "payload": map[string]string{"title": "x"}}}))
	require.Equal(t, http.StatusAccepted, rec.Code, rec.Body.String())
	id := decodeBody(t, rec)["message_id"].(string)
	rec = b.call(t, request{method: http.MethodGet, path: "/v1/messages/" + id})
	require.Equal(t, []any{"brand-b"}, decodeBody(t, rec)["apps"], "a limited key's message is for its apps")
	rec = b.call(t, as(secret, request{method: http.MethodPost, path: "/v1/messages", body: map[string]any{
		"audience": map[string]any{"type": "users", "ids": []string{"u1"}, "apps": []string{"brand-c"}}, "payload": map[string]string{"title": "x"}}}))
	requireError(t, rec, http.StatusForbidden, "forbidden", "audience.apps[0]")

	rec = b.call(t, as(secret, request{method: http.MethodGet, path: "/v1/apps"}))
	require.Equal(t, http.StatusOK, rec.Code)
	items := decodeBody(t, rec)["items"].([]any)
	require.Len(t, items, 1)
	require.Equal(t, "brand-b", items[0].(map[string]any)["name"])
	rec = b.call(t, as(secret, request{method: http.MethodGet, path: "/v1/apps/brand-c"}))
	requireError(t, rec, http.StatusNotFound, "not_found", "")

	rec = b.call(t, request{method: http.MethodGet, path: "/v1/keys"})
	require.Contains(t, rec.Body.String(), `"apps":["brand-b"]`)
}
