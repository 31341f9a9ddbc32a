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
// second or two: when 429s come for several subscriptions and are nearly
// all of its answers, the service is throttling the sender, and its 429s are read
// as about all of Herald's requests to it (push.Result.TargetThrottled
// false), which halves the service's bound on requests in flight and
// pauses its breaker for the Retry-After. A few subscriptions throttled
// among many accepted stay each its own, even when chance puts their 429s
// first in a burst: "most" (half) was met by three of a burst's first four
// answers one burst in about forty with a fifth of the subscriptions
// throttled, and four in five of at least five is met one in several
// hundred.
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
	// at least four in five of the answers, make a sender-wide throttle.
	senderWideAfter = 5
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
	return throttled && held >= senderWideAfter && 5*held >= 4*answers
}
