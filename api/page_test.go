package api

import (
	"encoding/base64"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestPaginate checks the cut of one page from limit+1 rows: a full page
// and one more row gives a cursor after the page's last row, under the
// listing's filter only; fewer rows are the last page.
func TestPaginate(t *testing.T) {
	t.Parallel()
	key := func(id int64) int64 { return id }
	for _, tc := range []struct {
		name     string
		rows     []int64
		want     []int64
		wantNext int64 // 0: no next page
	}{
		{"empty", []int64{}, []int64{}, 0},
		{"short page", []int64{5, 6}, []int64{5, 6}, 0},
		{"exactly full", []int64{5, 6, 7}, []int64{5, 6, 7}, 0},
		{"one more", []int64{9, 8, 7, 6}, []int64{9, 8, 7}, 7},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p := pageRequest{limit: 3, filter: "things:x"}
			require.EqualValues(t, 4, p.fetch())
			rows, next := paginate(p, tc.rows, key)
			require.Equal(t, tc.want, rows)
			if tc.wantNext == 0 {
				require.Nil(t, next)
				return
			}
			require.NotNil(t, next)
			cur, err := decodeCursor(*next, "things:x")
			require.NoError(t, err)
			require.Equal(t, tc.wantNext, cur.After)
			_, err = decodeCursor(*next, "things:y")
			require.Error(t, err, "a cursor is refused under another filter")
		})
	}
	require.EqualValues(t, 42, pageRequest{}.afterOr(42), "the first page starts at first")
	require.EqualValues(t, 7, pageRequest{after: 7}.afterOr(42))
}

// TestAttackForgedCursors is issue #26's item 7: a cursor is opaque, but
// it is base64 of JSON a caller can write, and one holding \u0000 in its
// key reached PostgreSQL (22021) as a 500. A cursor Herald did not make is
// a 400 invalid_cursor naming cursor on every listing, whatever it holds.
func TestAttackForgedCursors(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.population(t, "u", 3, 1)
	for _, id := range []string{"seg_a", "seg_b"} {
		status, body := b.do(t, http.MethodPut, "/v1/segments/"+id, map[string]any{"name": id})
		require.Less(t, status, 300, body)
	}
	status, body := b.do(t, http.MethodPost, "/v1/segments/seg_a/members", map[string]any{"user_ids": []string{"u0", "u1", "u2"}})
	require.Less(t, status, 300, body)

	forge := func(raw string) string { return base64.RawURLEncoding.EncodeToString([]byte(raw)) }
	forged := map[string]string{
		"NUL in the key":           forge(`{"k":"seg\u0000","f":"segments"}`),
		"NUL alone":                forge(`{"k":"\u0000","f":"segments"}`),
		"bytes that are not UTF-8": forge("{\"k\":\"seg\xff\xfe\",\"f\":\"segments\"}"),
		"a control character":      forge(`{"k":"seg\u0007","f":"segments"}`),
		"a key too long":           forge(`{"k":"` + strings.Repeat("x", 4096) + `","f":"segments"}`),
		"an unknown member":        forge(`{"k":"seg_a","f":"segments","x":1}`),
		"members reordered":        forge(`{"f":"segments","k":"seg_a"}`),
		"a duplicate member":       forge(`{"k":"seg_a","k":"seg\u0000","f":"segments"}`),
		"both a key and a number":  forge(`{"a":1,"k":"seg_a","f":"segments"}`),
		"padded base64":            base64.URLEncoding.EncodeToString([]byte(`{"k":"seg_a","f":"segments"}`)),
		"not base64":               "%00",
		"not JSON":                 forge(`seg_a`),
		"JSON null":                forge(`null`),
		"huge":                     strings.Repeat("A", 10000),
	}
	for name, cursor := range forged {
		for _, path := range []string{"/v1/segments", "/v1/segments/seg_a/members", "/v1/messages", "/v1/users/u0/devices"} {
			t.Run(name+path, func(t *testing.T) {
				t.Parallel()
				rec := b.call(t, request{method: http.MethodGet, path: path + "?limit=1&cursor=" + url.QueryEscape(cursor)})
				requireError(t, rec, http.StatusBadRequest, "invalid_cursor", "cursor")
			})
		}
	}

	// Herald's own cursors still page.
	_, first := b.do(t, http.MethodGet, "/v1/segments/seg_a/members?limit=1", nil)
	next, ok := first["next_cursor"].(string)
	require.True(t, ok, first)
	status, second := b.do(t, http.MethodGet, "/v1/segments/seg_a/members?limit=1&cursor="+next, nil)
	require.Equal(t, http.StatusOK, status, second)
}
