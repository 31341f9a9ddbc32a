package jobs

import (
	"sync"
	"time"
)

// Breaker states, as /v1/providers shows them.
const (
	BreakerClosed   = "closed"
	BreakerOpen     = "open"
	BreakerHalfOpen = "half_open"
)

// BreakerConfig tunes a circuit breaker. Zero values take the defaults.
type BreakerConfig struct {
	// Threshold is how many transient failures in a row open the breaker.
	// Default 5: one lost request does not park a provider, a dead one is
	// noticed within the first handful.
	Threshold int
	// Cooldown is how long the breaker stays open before it lets one probe
	// through. It doubles after every failed probe, up to MaxCooldown.
	// Defaults 1 s and 30 s.
	Cooldown, MaxCooldown time.Duration
	// Now is the clock; time.Now when nil.
	Now func() time.Time
}

// Breaker is a per-provider circuit breaker. Herald does not retry a send
// inside the dispatch second: a transient failure (503, 429, a timeout, a
// refused connection) counts here instead, and while the breaker is open the
// provider's sends are parked (their chunk snoozes) rather than hammered,
// until a single probe succeeds.
type Breaker struct {
	cfg BreakerConfig

	mu        sync.Mutex
	state     string
	failures  int
	openedAt  time.Time
	cooldown  time.Duration
	probing   bool
	lastError string
	lastErrAt time.Time
	// Totals since start, for error rates.
	answered, transient int64
}

// NewBreaker returns a closed breaker.
func NewBreaker(cfg BreakerConfig) *Breaker {
	if cfg.Threshold <= 0 {
		cfg.Threshold = 5
	}
	if cfg.Cooldown <= 0 {
		cfg.Cooldown = time.Second
	}
	if cfg.MaxCooldown <= 0 {
		cfg.MaxCooldown = 30 * time.Second
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Breaker{cfg: cfg, state: BreakerClosed, cooldown: cfg.Cooldown}
}

// Allow says whether one send may go out now. While open, the first call
// after the cooldown becomes the probe (the breaker turns half-open) and
// every other call is refused until the probe's result is recorded.
func (b *Breaker) Allow() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch b.state {
	case BreakerClosed:
		return true
	case BreakerOpen:
		if b.cfg.Now().Sub(b.openedAt) < b.cooldown {
			return false
		}
		b.state, b.probing = BreakerHalfOpen, true
		return true
	default: // half-open: one probe at a time
		return false
	}
}

// Success records a send the provider answered (accepted, or refused for a
// reason of the device's or the payload's own: the provider is up).
func (b *Breaker) Success() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.answered++
	b.failures = 0
	if b.state == BreakerHalfOpen {
		b.state, b.probing, b.cooldown = BreakerClosed, false, b.cfg.Cooldown
	}
}

// Failure records a transient failure.
func (b *Breaker) Failure(detail string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	now := b.cfg.Now()
	b.lastError, b.lastErrAt = detail, now
	b.answered++
	b.transient++
	b.failures++
	switch b.state {
	case BreakerHalfOpen:
		b.state, b.probing, b.openedAt = BreakerOpen, false, now
		b.cooldown = min(2*b.cooldown, b.cfg.MaxCooldown)
	case BreakerClosed:
		if b.failures >= b.cfg.Threshold {
			b.state, b.openedAt = BreakerOpen, now
		}
	}
}

// RetryIn is how long until the breaker lets a send through again: zero
// when closed, the rest of the cooldown when open, and a short wait for the
// probe's result when half-open.
func (b *Breaker) RetryIn() time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch b.state {
	case BreakerClosed:
		return 0
	case BreakerOpen:
		return max(b.cooldown-b.cfg.Now().Sub(b.openedAt), 0)
	default:
		return b.cfg.Cooldown / 4
	}
}

// BreakerStatus is a snapshot of a breaker, for /v1/providers and metrics.
type BreakerStatus struct {
	State       string
	LastError   string
	LastErrorAt time.Time
	// Sends counts attempted sends, Failures the transient failures among
	// them, since the process started.
	Sends, Failures int64
}

// Status returns the breaker's state and its last transient error.
func (b *Breaker) Status() BreakerStatus {
	b.mu.Lock()
	defer b.mu.Unlock()
	return BreakerStatus{State: b.state, LastError: b.lastError, LastErrorAt: b.lastErrAt, Sends: b.answered, Failures: b.transient}
}
