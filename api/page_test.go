package api

import (
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
