package api

import (
	"bytes"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestAttackRequestID is issue #26's item 9: X-Request-Id was taken from
// the caller at any size and in any spelling, echoed and logged, so that
// anyone, without a key, could write 28 MiB of log in 3 s or forge log
// lines. A caller's id is kept only when it is a short token; anything
// else is replaced by a generated one, in the answer and in the log alike.
func TestAttackRequestID(t *testing.T) {
	t.Parallel()
	// The subtests run one by one: they share the log.
	var log bytes.Buffer
	tdb := dbtestNew(t)
	srv, err := NewServer(Config{
		Logger: slog.New(slog.NewJSONHandler(&log, nil)), Pool: tdb.Pool,
		River: insertOnlyRiver(t, tdb), APIKeys: []string{testKey},
	})
	require.NoError(t, err)
	call := func(t *testing.T, ids ...string) string {
		req := httptest.NewRequest(http.MethodGet, "/v1/providers", nil) // no key: a 401
		for _, id := range ids {
			req.Header.Add("X-Request-Id", id)
		}
		rec := httptest.NewRecorder()
		srv.ServeHTTP(rec, req)
		require.Equal(t, http.StatusUnauthorized, rec.Code)
		got := rec.Header().Values("X-Request-Id")
		require.Len(t, got, 1)
		return got[0]
	}

	for _, id := range []string{"abc", "req-42.retry_1", strings.Repeat("a", 64), "0f8fad5b-d9cb-469f-a165-70867728950e"} {
		t.Run("kept "+id, func(t *testing.T) {
			require.Equal(t, id, call(t, id))
		})
	}
	for name, id := range map[string]string{
		"one MiB":          strings.Repeat("x", 1<<20),
		"65 characters":    strings.Repeat("a", 65),
		"a space":          "a b",
		"a forged line":    "x\" level=ERROR msg=\"breach",
		"a slash":          "a/b",
		"not ASCII":        "é",
		"a tab":            "a\tb",
		"markup":           "<script>",
		"a percent-escape": "a%0Ab",
	} {
		t.Run("replaced "+name, func(t *testing.T) {
			got := call(t, id)
			require.NotEqual(t, id, got)
			require.True(t, acceptableRequestID(got), "the generated id %q is not a token", got)
		})
	}
	t.Run("replaced when repeated", func(t *testing.T) {
		got := call(t, "one", "two")
		require.NotContains(t, []string{"one", "two"}, got)
	})
	t.Run("the log keeps the id answered", func(t *testing.T) {
		got := call(t, strings.Repeat("y", 100000))
		require.Contains(t, log.String(), `"request_id":"`+got+`"`)
		require.NotContains(t, log.String(), strings.Repeat("y", 65))
	})
}
