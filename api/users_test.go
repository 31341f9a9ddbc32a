package api

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestPutUserTimezone(t *testing.T) {
	t.Parallel()
	b := setup(t)

	status, resp := b.do(t, http.MethodPut, "/v1/users/u_tz", map[string]any{"timezone": "Asia/Kolkata"})
	require.Equal(t, http.StatusCreated, status, resp)
	require.Equal(t, map[string]any{"user_id": "u_tz", "timezone": "Asia/Kolkata", "locale": nil}, resp)

	status, resp = b.do(t, http.MethodPut, "/v1/users/u_tz", map[string]any{"timezone": "America/New_York"})
	require.Equal(t, http.StatusOK, status, resp)
	require.Equal(t, "America/New_York", resp["timezone"])

	// Null clears it.
	status, resp = b.do(t, http.MethodPut, "/v1/users/u_tz", map[string]any{"timezone": nil})
	require.Equal(t, http.StatusOK, status, resp)
	require.Nil(t, resp["timezone"])

	// The user now exists for the directory.
	status, _ = b.do(t, http.MethodGet, "/v1/users/u_tz/devices", nil)
	require.Equal(t, http.StatusOK, status)
}

func TestPutUserLocale(t *testing.T) {
	t.Parallel()
	b := setup(t)
	status, resp := b.do(t, http.MethodPut, "/v1/users/u_loc", map[string]any{"locale": "pt-br"})
	require.Equal(t, http.StatusCreated, status, resp)
	require.Equal(t, map[string]any{"user_id": "u_loc", "timezone": nil, "locale": "pt-BR"}, resp, "kept in canonical case")

	status, resp = b.do(t, http.MethodPut, "/v1/users/u_loc", map[string]any{"locale": "zh-hant-tw", "timezone": "Asia/Taipei"})
	require.Equal(t, http.StatusOK, status, resp)
	require.Equal(t, "zh-Hant-TW", resp["locale"])

	// PUT replaces: without a locale the user has none.
	status, resp = b.do(t, http.MethodPut, "/v1/users/u_loc", map[string]any{"timezone": "Asia/Taipei"})
	require.Equal(t, http.StatusOK, status, resp)
	require.Nil(t, resp["locale"])

	for _, bad := range []string{"", "german", "de_AT", "de-AT-CH", "en-x-private", "12"} {
		rec := b.call(t, request{method: http.MethodPut, path: "/v1/users/u_loc", body: map[string]any{"locale": bad}})
		requireError(t, rec, http.StatusBadRequest, "invalid_field", "locale")
	}
}

func TestPutUserRejectsBadInput(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, tz := range []string{"Mars/Olympus_Mons", "Local", "", "../../etc/passwd", "Europe/"} {
		rec := b.call(t, request{method: http.MethodPut, path: "/v1/users/u1", body: map[string]any{"timezone": tz}})
		requireError(t, rec, http.StatusBadRequest, "invalid_field", "timezone")
	}
	rec := b.call(t, request{method: http.MethodPut, path: "/v1/users/u1", body: map[string]any{"timezone": 5}})
	requireError(t, rec, http.StatusBadRequest, "invalid_type", "timezone")
	rec = b.call(t, request{method: http.MethodPut, path: "/v1/users/u1", body: `{"timezone":`})
	requireError(t, rec, http.StatusBadRequest, "malformed_json", "")
	rec = b.call(t, request{method: http.MethodPut, path: "/v1/users/bad%21id", body: map[string]any{}})
	requireError(t, rec, http.StatusBadRequest, "invalid_field", "user_id")
	requireError(t, b.call(t, request{method: http.MethodGet, path: "/v1/users/u1/devices"}), http.StatusNotFound, "not_found", "")
}
