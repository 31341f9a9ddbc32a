package api

import (
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// fakeClock is a clock that moves only when the test says.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// TestRateLimiterForgetsRefilledBuckets: a limiter keyed by client address
// keeps at most maxBuckets buckets. Past it, those that have refilled go
// (a new bucket is the same), and one still spending keeps its debt; if
// none has refilled, all go.
func TestRateLimiterForgetsRefilledBuckets(t *testing.T) {
	t.Parallel()
	clock := &fakeClock{now: time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)}
	l := newRateLimiter(1, 2, clock.Now)
	l.maxBuckets = 3
	for _, addr := range []string{"a", "a", "b", "c"} {
		ok, _ := l.take(addr)
		require.True(t, ok)
	}
	// a is spent; b and c refill within a second, a within two.
	clock.Add(1500 * time.Millisecond)
	ok, _ := l.take("d")
	require.True(t, ok)
	require.Len(t, l.buckets, 2, "b and c forgotten, a and d kept")
	require.Contains(t, l.buckets, "a")

	// a, d and e all still spending, none refilled: every bucket goes.
	l.take("e")
	l.take("e")
	ok, _ = l.take("f")
	require.True(t, ok)
	require.Len(t, l.buckets, 1)
}

func TestRateLimiterBucket(t *testing.T) {
	t.Parallel()
	clock := &fakeClock{now: time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)}
	l := newRateLimiter(2, 3, clock.Now)

	// A burst of three, then nothing until a token has come back.
	for range 3 {
		ok, _ := l.take("a")
		require.True(t, ok)
	}
	ok, wait := l.take("a")
	require.False(t, ok)
	require.Equal(t, 500*time.Millisecond, wait, "two a second: one every half second")

	// Another scope has a bucket of its own.
	ok, _ = l.take("b")
	require.True(t, ok)

	clock.Add(250 * time.Millisecond)
	ok, wait = l.take("a")
	require.False(t, ok)
	require.Equal(t, 250*time.Millisecond, wait)
	clock.Add(250 * time.Millisecond)
	ok, _ = l.take("a")
	require.True(t, ok)

	// Idle time refills no more than the burst.
	clock.Add(time.Hour)
	for range 3 {
		ok, _ := l.take("a")
		require.True(t, ok)
	}
	ok, _ = l.take("a")
	require.False(t, ok)
	require.Len(t, l.buckets, 2)
}

func TestRateLimitedPerAPIKey(t *testing.T) {
	t.Parallel()
	b := setupWith(t, dbtestNew(t), Config{RateLimit: 0.5, RateBurst: 2})
	for range 2 {
		require.Equal(t, http.StatusOK, b.call(t, request{method: http.MethodGet, path: "/v1/providers"}).Code)
	}
	rec := b.call(t, request{method: http.MethodGet, path: "/v1/providers"})
	requireError(t, rec, http.StatusTooManyRequests, "rate_limited", "")
	// Half a token a second: the next one is about two seconds off.
	retry, err := strconv.Atoi(rec.Header().Get("Retry-After"))
	require.NoError(t, err)
	require.GreaterOrEqual(t, retry, 1)
	require.LessOrEqual(t, retry, 2)

	// The other configured key is its own caller.
	rec = b.call(t, request{method: http.MethodGet, path: "/v1/providers", header: map[string]string{"Authorization": "Bearer another-key-0123456789"}})
	require.Equal(t, http.StatusOK, rec.Code)
	// Requests without a valid key are refused before they are counted.
	rec = b.call(t, request{method: http.MethodGet, path: "/v1/providers", header: map[string]string{"Authorization": "Bearer not-a-key-at-all-00000"}})
	require.Equal(t, http.StatusUnauthorized, rec.Code)
	require.Len(t, b.srv.limiter.buckets, 2)
}

func TestRateLimitedDashboardIsItsOwnCaller(t *testing.T) {
	t.Parallel()
	b := setupWith(t, dbtestNew(t), Config{AdminPassword: testAdminPassword, RiverUI: http.NotFoundHandler(), RateLimit: 0.5, RateBurst: 3})
	d := &dashBundle{bundle: b}
	ck, _ := d.login(t) // the session's own call is the dashboard's first
	for range 2 {
		require.Equal(t, http.StatusOK, b.call(t, request{method: http.MethodGet, path: "/v1/providers"}).Code)
	}
	require.Equal(t, http.StatusOK, d.browse(http.MethodGet, "/ui/api/providers", "", ck, nil).Code)
	require.Equal(t, http.StatusOK, b.call(t, request{method: http.MethodGet, path: "/v1/providers"}).Code)
	requireError(t, b.call(t, request{method: http.MethodGet, path: "/v1/providers"}), http.StatusTooManyRequests, "rate_limited", "")
	// The key's flood left the dashboard its last token, and then it too is
	// refused.
	require.Equal(t, http.StatusOK, d.browse(http.MethodGet, "/ui/api/providers", "", ck, nil).Code)
	rec := d.browse(http.MethodGet, "/ui/api/providers", "", ck, nil)
	require.Equal(t, http.StatusTooManyRequests, rec.Code, rec.Body.String())
	require.NotEmpty(t, rec.Header().Get("Retry-After"))
}
