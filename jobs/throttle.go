package jobs

import (
	"time"

	"github.com/heraldpush/herald/jobs/push"
)

// Throttles. A provider that throttles one device (push.Result's
// TargetThrottled: APNs' TooManyRequests, a Web Push 429, FCM's
// QUOTA_EXCEEDED for a device) is up: its answer counts for its breaker as
// any answer does, and only that delivery waits. It stays pending with the
// instant before which it must not be sent again written in the ledger
// (deliveries.not_before), so that whichever process runs the chunk next
// honours it; the chunk sends its other devices meanwhile and snoozes
// until the earliest instant one of its waiting devices may be sent, and
// what is still waiting at the message's expiry expires.

// Backoff of a throttled delivery when the provider names no Retry-After
// (Apple never does): doubling with the delivery's attempts.
const (
	throttleFirst = time.Second
	throttleMax   = 5 * time.Minute
)

// throttleWait is how long a delivery the provider throttled (r) waits
// before it is sent again: the provider's Retry-After, or a backoff that
// doubles with the delivery's earlier attempts.
func throttleWait(r push.Result, attempts int) time.Duration {
	if r.RetryAfter > 0 {
		return r.RetryAfter
	}
	return min(throttleFirst<<min(max(attempts, 0), 16), throttleMax)
}

// throttled reports whether r leaves its delivery pending, waiting for its
// device's throttle rather than for a breaker.
func throttled(r push.Result) bool {
	return !r.At.IsZero() && r.Reason.Transient() && r.TargetThrottled
}
