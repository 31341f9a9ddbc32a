package push

import (
	"context"
	"sync"
	"time"

	"golang.org/x/sync/semaphore"
	"golang.org/x/time/rate"
)

// Limiter runs the send loop every provider shares: it bounds the requests in
// flight across all concurrent Sends of one provider (for Web Push, of one
// push service: the endpoints' host), asks the circuit breaker before each
// request, and parks what the breaker will not let through. Providers differ
// only in how one request is made and in which targets they refuse locally,
// so those are what they pass to Send.
//
// The bound adapts, between 1 and the provider's MaxInFlight, the way TCP's
// congestion window does: it halves, at most once a round trip, when the
// provider throttles Herald as a whole (a 429 that is not about one device,
// or a 503 that names a Retry-After) or a request gets no answer in time,
// and grows by one after a bound's worth of answers whose latency held
// (within twice its running average).
// It starts at MaxInFlight, so a provider that never pushes back sees the
// fixed bound it always had.
type Limiter struct {
	// slots holds one token per request in flight, and one per slot the
	// adaptive bound withholds.
	slots chan struct{}
	// pace, when set, bounds the requests' sustained rate (SetRate, or
	// SetPacer); paceRate is that rate, a second.
	pace     Pacer
	paceRate float64
	// shared, when set, is a bound this Limiter's requests share with
	// other Limiters' (Share): taken after a slot of its own.
	shared *Bound
	// max is the most requests in flight (MaxInFlight).
	max int

	mu sync.Mutex
	// limit is the adaptive bound; withheld counts the slots taken out of
	// use to keep to it (max - limit once the requests above it are back).
	limit, withheld int
	// held counts the answers within latency since the bound last moved;
	// latency is their running average.
	held       int
	latency    time.Duration
	lastShrink time.Time
	// turn makes concurrent Sends take their slots one Send after another,
	// in the order they asked (the semaphore is FIFO): the first Send's
	// requests all start before the second's, so Sends finish in order
	// instead of all at the end, and their callers can record results as
	// they come. Requests still overlap fully: a Send's slots go back one
	// by one as its requests answer.
	turn *semaphore.Weighted
	// idle hands a request to a sender goroutine waiting for one.
	idle chan func()
	// closed ends the waiting senders at once (Close).
	closed    chan struct{}
	closeOnce sync.Once
}

// NewLimiter returns a Limiter that lets at most maxInFlight requests run at
// once. Providers validate maxInFlight, so it is at least 1.
func NewLimiter(maxInFlight int) *Limiter {
	return &Limiter{
		slots: make(chan struct{}, maxInFlight), max: maxInFlight, limit: maxInFlight,
		turn: semaphore.NewWeighted(1), idle: make(chan func()), closed: make(chan struct{}),
	}
}

// Bound is a bound on requests in flight that several Limiters share:
// Web Push's across its push services, each of which has a Limiter of its
// own.
type Bound struct {
	slots chan struct{}
}

// NewBound returns a Bound of n requests in flight, at least 1.
func NewBound(n int) *Bound {
	return &Bound{slots: make(chan struct{}, max(n, 1))}
}

// Share makes the Limiter's requests take a slot of b too, after one of
// their own. Call it before any Send.
func (l *Limiter) Share(b *Bound) { l.shared = b }

// Pacer bounds a rate of requests: Wait returns when one more may be made,
// or with ctx's error. A rate of this process alone is a rate.Limiter; one
// every process shares is a quota's (package quota).
type Pacer interface {
	Wait(ctx context.Context) error
}

// SetRate bounds the requests' sustained rate to perSecond, with bursts of
// up to burst requests; zero leaves it unbounded. Call it before any Send.
func (l *Limiter) SetRate(perSecond float64, burst int) {
	if perSecond <= 0 {
		l.pace, l.paceRate = nil, 0
		return
	}
	l.pace, l.paceRate = rate.NewLimiter(rate.Limit(perSecond), max(burst, 1)), perSecond
}

// SetPacer bounds the requests' rate with p, which keeps to perSecond (a
// quota other Limiters share); a nil p leaves it unbounded. Call it before
// any Send.
func (l *Limiter) SetPacer(p Pacer, perSecond float64) {
	if p == nil {
		l.pace, l.paceRate = nil, 0
		return
	}
	l.pace, l.paceRate = p, perSecond
}

// Rate is the bound on the requests' sustained rate, a second; zero for
// none.
func (l *Limiter) Rate() float64 { return l.paceRate }

// InFlightLimit is the adaptive bound on requests in flight now.
func (l *Limiter) InFlightLimit() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.limit
}

// release gives a request's slot back, unless the bound shrank below the
// slots in use: then the slot is withheld.
func (l *Limiter) release() {
	l.mu.Lock()
	if l.withheld < l.max-l.limit {
		l.withheld++
		l.mu.Unlock()
		return
	}
	l.mu.Unlock()
	<-l.slots
}

// releaseShared gives a request's slot of the shared Bound back.
func (l *Limiter) releaseShared() {
	if l.shared != nil {
		<-l.shared.slots
	}
}

// throttledAll reports whether r is the provider pushing back on all of
// Herald's requests rather than on one device's: a 429 not scoped to the
// device, or any transient answer that asks for a pause (a 503 with a
// Retry-After), as the fan-out reads it when it pauses a breaker.
func throttledAll(r Result) bool {
	if r.TargetThrottled {
		return false
	}
	return r.Reason == ReasonRateLimited || r.Reason.Transient() && r.RetryAfter > 0
}

// observe moves the adaptive bound by an answer.
func (l *Limiter) observe(r Result) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := time.Now()
	switch {
	case r.Unanswered || throttledAll(r):
		// Once a round trip: the requests in flight together all meet
		// the same trouble, and one halving answers it.
		if now.Sub(l.lastShrink) >= max(l.latency, 100*time.Millisecond) {
			l.limit, l.held, l.lastShrink = max(l.limit/2, 1), 0, now
			// The free slots above the bound are withheld now, the busy
			// ones as their requests come back (release).
		withhold:
			for l.withheld < l.max-l.limit {
				select {
				case l.slots <- struct{}{}:
					l.withheld++
				default:
					break withhold
				}
			}
		}
	case r.Latency > 0:
		if l.latency == 0 || r.Latency <= 2*l.latency {
			l.held++
		} else {
			l.held = 0
		}
		if l.latency == 0 {
			l.latency = r.Latency
		} else {
			l.latency += (r.Latency - l.latency) / 8
		}
		if l.limit < l.max && l.held >= l.limit {
			l.limit, l.held = l.limit+1, 0
			if l.withheld > l.max-l.limit {
				// A withheld slot goes back into use. The channel holds it,
				// so this never blocks.
				l.withheld--
				<-l.slots
			}
		}
	}
}

// Close ends the sender goroutines waiting for work, rather than leaving
// them to their idle timeout; a provider's Close calls it once its Sends
// have returned. A Send after Close still works, on fresh goroutines.
func (l *Limiter) Close() { l.closeOnce.Do(func() { close(l.closed) }) }

// WarmTimeout bounds a provider's warm-up: opening its connections (TLS
// handshakes, and for FCM an OAuth exchange) before any traffic. That is
// more work than one push and happens once, at startup, so it gets more time
// than a request does: bounded by the request timeout, a warm-up on a busy
// machine gave up on connections that were merely slow to open.
const WarmTimeout = 10 * time.Second

// senderIdle is how long a sender goroutine waits for another request
// before it ends.
const senderIdle = 30 * time.Second

// run makes one request on a sender goroutine: an idle one if there is
// one, else a new one. Senders outlive their requests because a request
// goes deep (HTTP/2 framing, TLS, JSON), and a fresh goroutine's stack grew
// and was copied several times on the way, a measurable share of a
// fan-out's CPU when each request had a goroutine of its own
// (docs/performance.md, "Provider clients", has the figure).
func (l *Limiter) run(request func()) {
	select {
	case l.idle <- request:
	default:
		go l.sender(request)
	}
}

func (l *Limiter) sender(request func()) {
	idle := time.NewTimer(senderIdle)
	defer idle.Stop()
	for {
		request()
		idle.Reset(senderIdle)
		select {
		case request = <-l.idle:
		case <-idle.C:
			return
		case <-l.closed:
			return
		}
	}
}

// parked is the result of a send the circuit breaker did not allow: a reason
// but no time, because nothing was attempted.
func parked() Result {
	return Result{Reason: ReasonProviderUnavailable, Detail: "parked: circuit breaker open"}
}

// Send makes one request per target, filling results[i] for targets[i], and
// returns when every request has answered. results must be as long as
// targets.
//
// Concurrent Sends take their turns one after another, in the order they
// came (see turn), except for their lead (WithLead), which goes first.
// For each target in order:
//   - once allow has refused, the target is parked without asking again;
//   - reject, which may be nil, is asked first: a target it refuses gets its
//     result and no request, so a token that cannot be sent as it is never
//     reaches the network;
//   - Send waits for a slot (and one of the shared Bound, if any); if ctx
//     ends first, this target and every one after it get a "not sent"
//     result without a time;
//   - allow is asked with the slot in hand, just before the request starts,
//     so that a breaker that opened while Send waited for a slot is seen;
//   - send runs on a sender goroutine (see run) and its result is the
//     target's; answered, which may be nil, is then called with i on that
//     goroutine, so that a caller can record the answer before the others
//     are in. It must be quick: the sender waits for it.
func (l *Limiter) Send(ctx context.Context, targets []Target, results []Result, allow func() bool, answered func(i int),
	reject func(Target) (Result, bool), send func(Target) Result) {
	var wg sync.WaitGroup
	defer wg.Wait()
	notSent := func(from int, err error) {
		for j := from; j < len(targets); j++ {
			results[j] = Result{Reason: ReasonProviderUnavailable, Detail: "not sent: " + err.Error()}
		}
	}
	refused := false
	// step sends targets[i]; false when ctx ended and the rest is not sent.
	step := func(i int) bool {
		t := targets[i]
		if refused {
			results[i] = parked()
			return true
		}
		if reject != nil {
			if r, ok := reject(t); ok {
				results[i] = r
				return true
			}
		}
		select {
		case l.slots <- struct{}{}:
		case <-ctx.Done():
			notSent(i, ctx.Err())
			return false
		}
		// The rate's turn once the request has its own slot, so that the
		// turn is spent as the request goes out rather than held while it
		// waits for one (a quota shared by every process counts the turns,
		// and the provider the requests), and before a slot it shares with
		// other Limiters, which a request waiting for its turn must not hold.
		// One that would have to wait past the attempt's deadline is not
		// sent, and its chunk tries again later.
		if l.pace != nil {
			if err := l.pace.Wait(ctx); err != nil {
				l.release()
				notSent(i, err)
				return false
			}
		}
		if l.shared != nil {
			select {
			case l.shared.slots <- struct{}{}:
			case <-ctx.Done():
				l.release()
				notSent(i, ctx.Err())
				return false
			}
		}
		if !allow() {
			l.releaseShared()
			l.release()
			refused = true
			results[i] = parked()
			return true
		}
		wg.Add(1)
		l.run(func() {
			defer wg.Done()
			defer l.release()
			defer l.releaseShared()
			start := time.Now()
			r := send(t)
			r.Latency = time.Since(start)
			l.observe(r)
			results[i] = r
			if answered != nil {
				answered(i)
			}
		})
		return true
	}
	// The lead goes out without waiting for the turn, taking the next
	// slots that free up.
	lead := min(LeadOf(ctx), len(targets))
	for i := range lead {
		if !step(i) {
			return
		}
	}
	if lead == len(targets) {
		return
	}
	if err := l.turn.Acquire(ctx, 1); err != nil {
		notSent(lead, err)
		return
	}
	defer l.turn.Release(1)
	for i := lead; i < len(targets); i++ {
		if !step(i) {
			return
		}
	}
}

type leadKey struct{}

// WithLead makes the Sends under ctx send their first n targets without
// waiting for their turn behind the Sends that came before: they take the
// next request slots that free up, and only the rest waits. The fan-out
// gives a message's first chunk a lead, so that when many messages fall
// due at once each one's first devices go out within a round trip or two
// instead of after every earlier chunk has been sent.
func WithLead(ctx context.Context, n int) context.Context {
	return context.WithValue(ctx, leadKey{}, n)
}

// LeadOf is the lead of the Sends under ctx (WithLead).
func LeadOf(ctx context.Context) int {
	n, _ := ctx.Value(leadKey{}).(int)
	return max(n, 0)
}
