package api

import (
	"fmt"
	"math"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/labstack/echo/v4"
)

const (
	// DefaultRateLimit is the requests a second each caller may make of one
	// process, after its burst: about a quarter of what one process serves
	// on two cores (docs/performance.md, "Scheduling and the directory", has
	// the figure), so that one key's flood leaves most of a process to the
	// others, and far above what an app's steady traffic, `herald bench` or
	// the tests make.
	DefaultRateLimit = 500
	// DefaultRateBurst is how many requests a caller may make at once
	// before the rate applies: two seconds' worth.
	DefaultRateBurst = 2 * DefaultRateLimit
)

// DefaultReceiptRateLimit and DefaultReceiptRateBurst bound the receipts
// one client address may post to one process (POST /v1/receipts takes no
// key): requests a second, and at once. Phones behind a carrier's NAT share
// an address, and a message reaches them all within seconds, so the burst
// is deep; a flood from one address is refused before its tokens are
// checked or its body read.
const (
	DefaultReceiptRateLimit = 200
	DefaultReceiptRateBurst = 2000
)

// maxRateBuckets bounds the buckets of a limiter keyed by client address,
// which any client can add to: past it, the buckets that have refilled
// (the same as a new one) are forgotten, and if that is not enough, all.
const maxRateBuckets = 100_000

// rateLimiter keeps one token bucket per caller scope: each API key, and
// the dashboard. A scope is only ever one of the configured keys' or the
// dashboard's, set after authentication, so the buckets are as many as the
// configured keys plus one however many requests or forged keys arrive. The
// receipts' limiter keys its buckets by client address instead, which are
// as many as the clients; maxRateBuckets bounds them.
type rateLimiter struct {
	rate  float64 // tokens a second
	burst float64
	now   func() time.Time
	// maxBuckets is maxRateBuckets, but for the tests.
	maxBuckets int

	mu      sync.Mutex
	buckets map[string]*bucket
}

type bucket struct {
	tokens float64
	at     time.Time
}

func newRateLimiter(rate float64, burst int, now func() time.Time) *rateLimiter {
	return &rateLimiter{rate: rate, burst: float64(burst), now: now, maxBuckets: maxRateBuckets, buckets: map[string]*bucket{}}
}

// take spends one of scope's tokens. When none is left it returns false
// and how long until one is.
func (l *rateLimiter) take(scope string) (bool, time.Duration) {
	now := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	b, ok := l.buckets[scope]
	if !ok {
		if len(l.buckets) >= l.maxBuckets {
			l.forgetLocked(now)
		}
		b = &bucket{tokens: l.burst, at: now}
		l.buckets[scope] = b
	}
	if elapsed := now.Sub(b.at); elapsed > 0 {
		b.tokens = min(l.burst, b.tokens+elapsed.Seconds()*l.rate)
		b.at = now
	}
	if b.tokens >= 1 {
		b.tokens--
		return true, 0
	}
	return false, time.Duration((1 - b.tokens) / l.rate * float64(time.Second))
}

// forgetLocked drops the buckets that have refilled by now, which a new
// bucket would equal, and every bucket if none has.
func (l *rateLimiter) forgetLocked(now time.Time) {
	for key, b := range l.buckets {
		if b.tokens+now.Sub(b.at).Seconds()*l.rate >= l.burst {
			delete(l.buckets, key)
		}
	}
	if len(l.buckets) >= l.maxBuckets {
		clear(l.buckets)
	}
}

// limit refuses a caller's request with 429 once its bucket is empty,
// saying in Retry-After (whole seconds, at least one) when to try again.
// It runs after authentication, which names the caller's scope.
func (l *rateLimiter) limit(next echo.HandlerFunc) echo.HandlerFunc {
	return l.limitBy(func(c echo.Context) string { return callerScope(c.Request().Context()) },
		"each API key (and the dashboard)", nil)(next)
}

// limitBy refuses a request with 429 once the bucket key names is empty;
// who names the callers in the message, and refused, when not nil, is told
// of each refusal.
func (l *rateLimiter) limitBy(key func(echo.Context) string, who string, refused func()) echo.MiddlewareFunc {
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			ok, wait := l.take(key(c))
			if ok {
				return next(c)
			}
			if refused != nil {
				refused()
			}
			retry := max(1, int(math.Ceil(wait.Seconds())))
			c.Response().Header().Set("Retry-After", strconv.Itoa(retry))
			return &Error{Status: http.StatusTooManyRequests, Code: "rate_limited", Message: fmt.Sprintf(
				"too many requests: %s may make %g a second, in bursts of up to %g; retry after %d s",
				who, l.rate, l.burst, retry)}
		}
	}
}
