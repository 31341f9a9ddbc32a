package api

import (
	"fmt"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"
)

func userIDs(prefix string, n int) []string {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("%s%d", prefix, i)
	}
	return ids
}

func TestSegmentLifecycle(t *testing.T) {
	t.Parallel()
	b := setup(t)

	status, resp := b.do(t, http.MethodPut, "/v1/segments/seg_morning", map[string]any{"name": "Morning digest"})
	require.Equal(t, http.StatusCreated, status, resp)
	require.Equal(t, map[string]any{"segment_id": "seg_morning", "name": "Morning digest", "member_count": float64(0)}, resp)

	status, resp = b.do(t, http.MethodPut, "/v1/segments/seg_morning", map[string]any{"name": "Morning"})
	require.Equal(t, http.StatusOK, status, resp)
	require.Equal(t, "Morning", resp["name"])

	// 10,000 new users in one call; they are created.
	status, resp = b.do(t, http.MethodPost, "/v1/segments/seg_morning/members", map[string]any{"user_ids": userIDs("m", maxMembersPerCall)})
	require.Equal(t, http.StatusOK, status, resp)
	require.EqualValues(t, maxMembersPerCall, resp["added"])
	require.EqualValues(t, maxMembersPerCall, resp["member_count"])
	status, _ = b.do(t, http.MethodGet, "/v1/users/m9999/devices", nil)
	require.Equal(t, http.StatusOK, status)

	// Adding again (with a repeat inside the call) changes nothing.
	status, resp = b.do(t, http.MethodPost, "/v1/segments/seg_morning/members", map[string]any{"user_ids": []string{"m1", "m1", "m2"}})
	require.Equal(t, http.StatusOK, status, resp)
	require.EqualValues(t, 0, resp["added"])

	status, resp = b.do(t, http.MethodDelete, "/v1/segments/seg_morning/members", map[string]any{"user_ids": []string{"m1", "m2", "not_a_member"}})
	require.Equal(t, http.StatusOK, status, resp)
	require.EqualValues(t, 2, resp["removed"])
	require.EqualValues(t, maxMembersPerCall-2, resp["member_count"])

	status, resp = b.do(t, http.MethodGet, "/v1/segments/seg_morning", nil)
	require.Equal(t, http.StatusOK, status)
	require.Equal(t, map[string]any{"segment_id": "seg_morning", "name": "Morning", "member_count": float64(maxMembersPerCall - 2)}, resp)
}

func TestSegmentRejectsBadInput(t *testing.T) {
	t.Parallel()
	b := setup(t)
	requireError(t, b.call(t, request{method: http.MethodGet, path: "/v1/segments/nope"}), http.StatusNotFound, "not_found", "")
	requireError(t, b.call(t, request{method: http.MethodPost, path: "/v1/segments/nope/members", body: map[string]any{"user_ids": []string{"a"}}}),
		http.StatusNotFound, "not_found", "")
	requireError(t, b.call(t, request{method: http.MethodDelete, path: "/v1/segments/nope/members", body: map[string]any{"user_ids": []string{"a"}}}),
		http.StatusNotFound, "not_found", "")

	status, _ := b.do(t, http.MethodPut, "/v1/segments/s1", map[string]any{"name": "s"})
	require.Equal(t, http.StatusCreated, status)
	cases := []struct {
		name  string
		body  any
		code  string
		field string
	}{
		{"empty", map[string]any{"user_ids": []string{}}, "invalid_field", "user_ids"},
		{"missing", map[string]any{}, "invalid_field", "user_ids"},
		{"too many", map[string]any{"user_ids": userIDs("x", maxMembersPerCall+1)}, "invalid_field", "user_ids"},
		{"bad id", map[string]any{"user_ids": []string{"ok", "not ok"}}, "invalid_field", "user_ids[1]"},
		{"wrong type", map[string]any{"user_ids": []any{"ok", 7}}, "invalid_type", "user_ids"},
		{"malformed", `{"user_ids": [`, "malformed_json", ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rec := b.call(t, request{method: http.MethodPost, path: "/v1/segments/s1/members", body: tc.body})
			requireError(t, rec, http.StatusBadRequest, tc.code, tc.field)
		})
	}
	_, resp := b.do(t, http.MethodGet, "/v1/segments/s1", nil)
	require.EqualValues(t, 0, resp["member_count"])

	rec := b.call(t, request{method: http.MethodPut, path: "/v1/segments/s1", body: map[string]any{"name": 3}})
	requireError(t, rec, http.StatusBadRequest, "invalid_type", "name")
	rec = b.call(t, request{method: http.MethodPut, path: "/v1/segments/s%20x", body: map[string]any{"name": "x"}})
	requireError(t, rec, http.StatusBadRequest, "invalid_field", "segment_id")
}
