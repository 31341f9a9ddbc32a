package webpush

import (
	"sync"
	"time"
)

// A push service's 429 is about one push resource, the one subscription
// (RFC 8030, section 8.4), and Herald holds back only that subscription's
// delivery. But a service may throttle a sender as a whole, every
// subscription of its VAPID key at once: read one subscription at a time,
// that leaves Herald going at full rate into a wall of 429s. senderThrottle
// tells the two apart by what a service answers a sender over the last
// second or two: when 429s come for several subscriptions and are most of
// its answers, the service is throttling the sender, and its 429s are read
// as about all of Herald's requests to it (push.Result.TargetThrottled
// false), which halves the service's bound on requests in flight and
// pauses its breaker for the Retry-After. A few subscriptions throttled
// among many accepted stay each its own.
type senderThrottle struct {
	mu sync.Mutex
	// The answers and 429s of the current window and the one before it.
	start                 time.Time
	answers, throttled    int
	lastAnswers, lastHeld int
}

const (
	// throttleWindow is the span senderThrottle counts answers over.
	throttleWindow = time.Second
	// senderWideAfter is how many 429s in a window and the one before it,
	// at least half of the answers, make a sender-wide throttle.
	senderWideAfter = 3
)

// observe counts an answer of the service at now, a 429 when throttled,
// and reports whether the service is throttling the sender as a whole.
func (s *senderThrottle) observe(now time.Time, throttled bool) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch since := now.Sub(s.start); {
	case since >= 2*throttleWindow:
		s.start, s.lastAnswers, s.lastHeld, s.answers, s.throttled = now, 0, 0, 0, 0
	case since >= throttleWindow:
		s.start, s.lastAnswers, s.lastHeld, s.answers, s.throttled = now, s.answers, s.throttled, 0, 0
	}
	s.answers++
	if throttled {
		s.throttled++
	}
	held, answers := s.throttled+s.lastHeld, s.answers+s.lastAnswers
	return throttled && held >= senderWideAfter && 2*held >= answers
}
