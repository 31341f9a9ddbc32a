package jobs

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/heraldpush/herald/jobs/apps"
	"github.com/heraldpush/herald/jobs/push"
)

// Breaker states, as /v1/providers shows them.
const (
	BreakerClosed   = "closed"
	BreakerOpen     = "open"
	BreakerHalfOpen = "half_open"
)

// BreakerConfig tunes a circuit breaker. Zero values take the defaults.
type BreakerConfig struct {
	// Threshold is how many transient failures in a row open the breaker
	// (DefaultBreakerThreshold when zero).
	Threshold int
	// Cooldown is how long the breaker stays open before it lets one probe
	// through. It doubles after every failed probe, up to MaxCooldown.
	// Defaults 1 s and 30 s.
	Cooldown, MaxCooldown time.Duration
	// Now is the clock; time.Now when nil.
	Now func() time.Time
	// Jitter is a random duration in [0, n), by which a parked send comes
	// back after the probe's instant (Wake); uniformly random when nil.
	Jitter func(n time.Duration) time.Duration
}

// uniformJitter is a duration drawn uniformly from [0, n).
func uniformJitter(n time.Duration) time.Duration {
	if n <= 0 {
		return 0
	}
	return rand.N(n)
}

// Breaker is a per-provider circuit breaker. Herald does not retry a send
// inside the dispatch second: a transient failure of the provider (503, a
// provider-wide 429, a timeout, a refused connection) counts here instead,
// and while the breaker is open the provider's sends are parked (their
// chunk snoozes) rather than hammered, until a single probe succeeds. A
// provider that names how long it wants (a Retry-After on a provider-wide
// 429 or a 503) pauses the breaker for that long (Pause). A 429 about one
// device (push.Result.TargetThrottled) is not the provider's failure and
// never counts here: only that device's delivery waits.
type Breaker struct {
	cfg BreakerConfig

	mu       sync.Mutex
	state    string
	failures int
	openedAt time.Time
	cooldown time.Duration
	// notBefore, while open, is the earliest a probe may go: the end of
	// the last pause the provider asked for (Pause).
	notBefore time.Time
	probing   bool
	// woken is the probe's instant (probeAt) for which a parked send was
	// told to come back at that instant, to carry the probe (Wake).
	woken     time.Time
	lastError string
	lastErrAt time.Time
	// Totals since start, for error rates.
	answered, transient int64
}

// NewBreaker returns a closed breaker.
func NewBreaker(cfg BreakerConfig) *Breaker {
	if cfg.Threshold <= 0 {
		cfg.Threshold = DefaultBreakerThreshold
	}
	if cfg.Cooldown <= 0 {
		cfg.Cooldown = DefaultBreakerCooldown
	}
	if cfg.MaxCooldown <= 0 {
		cfg.MaxCooldown = max(DefaultBreakerMaxCooldown, cfg.Cooldown)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Jitter == nil {
		cfg.Jitter = uniformJitter
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
		if now := b.cfg.Now(); now.Sub(b.openedAt) < b.cooldown || now.Before(b.notBefore) {
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

// Failure records a transient failure. detail is kept as the last error,
// which GET /v1/providers shows and provider_status stores, so no URL in it
// is kept beyond its host (push.ScrubDetail): a Web Push endpoint is a
// device's token.
func (b *Breaker) Failure(detail string) { b.fail(detail, false, 0) }

// Pause records a transient failure for which the provider named how long
// it wants no more sends (Retry-After): the breaker opens at once, whatever
// its threshold, and lets its probe through no sooner than d from now (nor
// before its cooldown is over). A pause is the provider's own word for its
// state, so it never needs failures in a row to be believed.
func (b *Breaker) Pause(d time.Duration, detail string) { b.fail(detail, true, d) }

// fail records a transient failure; pause opens the breaker at once and
// keeps it open for at least d.
func (b *Breaker) fail(detail string, pause bool, d time.Duration) {
	detail = push.ScrubDetail(detail)
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
		if pause || b.failures >= b.cfg.Threshold {
			b.state, b.openedAt = BreakerOpen, now
		}
	}
	if until := now.Add(d); pause && until.After(b.notBefore) {
		b.notBefore = until
	}
}

// RetryIn is how long until the breaker lets a send through again: zero
// when closed, the rest of the cooldown (or of the pause, if longer) when
// open, and a short wait for the probe's result when half-open.
func (b *Breaker) RetryIn() time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch b.state {
	case BreakerClosed:
		return 0
	case BreakerOpen:
		return max(b.probeAt().Sub(b.cfg.Now()), 0)
	default:
		return b.cfg.Cooldown / 4
	}
}

// probeAt is, while the breaker is open, the instant its probe may go: the
// end of its cooldown, or of the pause the provider asked for if later.
// b.mu is held.
func (b *Breaker) probeAt() time.Time {
	at := b.openedAt.Add(b.cooldown)
	if b.notBefore.After(at) {
		return b.notBefore
	}
	return at
}

// Wake is how long a chunk whose sends the breaker parked should sleep
// before it tries them again. The first chunk parked for the coming probe
// wakes at the probe's instant (RetryIn) to carry it, so the provider's
// recovery is found out as soon as the breaker allows; every other one
// wakes after a random share (Jitter) of the breaker's cooldown (or of the
// pause the provider asked for, if longer; at most MaxCooldown) beyond
// that instant. Without the share, every chunk an outage parked would wake
// at the same instant, a herd at the provider that just came back; with
// it they come back spread over a cooldown after the probe, when its answer
// has closed the breaker again, or reopened it (and they park again,
// behind the next probe). Allow is unchanged: one probe after the cooldown.
// While the probe is out (half-open), a parked chunk waits a quarter of the
// configured cooldown and its share; a closed breaker parks nothing.
func (b *Breaker) Wake() time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch b.state {
	case BreakerClosed:
		return 0
	case BreakerOpen:
		probe := b.probeAt()
		wait := max(probe.Sub(b.cfg.Now()), 0)
		if !b.woken.Equal(probe) {
			b.woken = probe
			return wait
		}
		return wait + b.cfg.Jitter(min(probe.Sub(b.openedAt), b.cfg.MaxCooldown))
	default:
		return b.cfg.Cooldown/4 + b.cfg.Jitter(min(b.cooldown, b.cfg.MaxCooldown))
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
	// Refused counts the pushes refused for the app's credentials
	// (push.ReasonCredentialsRefused), with the last such answer.
	Refused       int64
	LastRefused   string
	LastRefusedAt time.Time
}

// Status returns the breaker's state and its last transient error.
func (b *Breaker) Status() BreakerStatus {
	b.mu.Lock()
	defer b.mu.Unlock()
	return BreakerStatus{State: b.state, LastError: b.lastError, LastErrorAt: b.lastErrAt, Sends: b.answered, Failures: b.transient}
}

// maxHostBreakers bounds the Web Push breakers one process keeps. Hosts are
// limited by the egress policy, but a wildcard entry admits any name under a
// domain, and callers choose the names.
const maxHostBreakers = 1000

// Breakers are a worker's circuit breakers, shared by both lanes (a
// provider's health is the same whichever lane sends). APNs and FCM are one
// service each and have one breaker each. Web Push has one per push-service
// host: subscriptions name the host, so a caller who registers endpoints
// that fail can only park pushes to those hosts, never every browser's.
// APNs's sandbox host, another service than its production host, has a
// breaker of its own, so that an outage of Apple's sandbox parks only the
// debug builds' pushes.
//
// Each app has breakers of its own (App): a provider that refuses one
// app's credentials, or an outage seen through one app's client, parks
// only that app's sends.
type Breakers struct {
	cfg      BreakerConfig
	names    []string
	channels map[string]*Breaker
	// apnsSandbox is the APNs sandbox host's breaker; nil without APNs.
	apnsSandbox *Breaker

	mu sync.Mutex
	// hosts are Web Push's breakers, made on first use.
	hosts map[string]*Breaker
	// forgotten holds the counts of host breakers dropped to stay within
	// maxHostBreakers, so that the channel's totals never go back.
	forgotten struct{ sends, failures int64 }
	// refused counts, by channel, the pushes a provider refused for the
	// app's credentials, with the last such answer.
	refused map[string]*refusals

	appsMu sync.Mutex
	// apps are the other apps' breakers, made on first use; this set is
	// the default app's.
	apps map[int32]*Breakers
	// appNames gives an app's name, for the errors Status tells of it.
	appNames func(int32) string
}

// SetNames makes Status name the app an error came from with names (the
// app registry's); without it, by the app's id.
func (b *Breakers) SetNames(names func(int32) string) {
	b.appsMu.Lock()
	defer b.appsMu.Unlock()
	b.appNames = names
}

// refusals are a channel's pushes refused for the app's credentials.
type refusals struct {
	n    int64
	last string
	at   time.Time
}

// NewBreakers returns closed breakers for channels (those with a provider).
func NewBreakers(cfg BreakerConfig, channels ...string) *Breakers {
	b := &Breakers{cfg: cfg, names: channels, channels: map[string]*Breaker{}, hosts: map[string]*Breaker{}, refused: map[string]*refusals{}}
	for _, ch := range channels {
		b.channels[ch] = NewBreaker(cfg)
	}
	if _, ok := b.channels[ChannelAPNs]; ok {
		b.apnsSandbox = NewBreaker(cfg)
	}
	return b
}

// App is the breakers of app id, made on first use; the default app's are
// b itself.
func (b *Breakers) App(id int32) *Breakers {
	if id == apps.DefaultID || id == 0 {
		return b
	}
	b.appsMu.Lock()
	defer b.appsMu.Unlock()
	if b.apps == nil {
		b.apps = map[int32]*Breakers{}
	}
	a := b.apps[id]
	if a == nil {
		a = NewBreakers(b.cfg, b.names...)
		b.apps[id] = a
	}
	return a
}

// AppIDs are the apps that have breakers: the default app and every app
// that has sent here.
func (b *Breakers) AppIDs() []int32 {
	b.appsMu.Lock()
	defer b.appsMu.Unlock()
	ids := []int32{apps.DefaultID}
	for id := range b.apps {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

// Refused records that channel's provider refused a push for the app's
// credentials, with its answer.
func (b *Breakers) Refused(channel, detail string, at time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	r := b.refused[channel]
	if r == nil {
		r = &refusals{}
		b.refused[channel] = r
	}
	r.n++
	r.last, r.at = detail, at
}

// ForTarget is For a chunk's target, in the breakers of its app, which for
// an APNs sandbox token is the sandbox host's breaker.
func (b *Breakers) ForTarget(t Target) *Breaker {
	if t.App != apps.DefaultID && t.App != 0 {
		return b.App(t.App).ForTarget(Target{Target: t.Target, Channel: t.Channel})
	}
	if t.Sandbox && t.Channel == ChannelAPNs && b.apnsSandbox != nil {
		return b.apnsSandbox
	}
	return b.For(t.Channel, t.Token)
}

// Configured reports whether channel has a provider here.
func (b *Breakers) Configured(channel string) bool {
	_, ok := b.channels[channel]
	return ok
}

// For returns the breaker a send to target on channel answers to: the
// channel's, or for Web Push the breaker of the endpoint's host. It is nil
// for a channel without a provider.
func (b *Breakers) For(channel, token string) *Breaker {
	own, ok := b.channels[channel]
	if !ok || channel != ChannelWebPush {
		return own
	}
	host := push.EndpointHost(token)
	b.mu.Lock()
	defer b.mu.Unlock()
	if h := b.hosts[host]; h != nil {
		return h
	}
	if len(b.hosts) >= maxHostBreakers {
		// Closed breakers hold only counts; keep those and let the
		// breakers go. An open one stays: it is what parks a failing host.
		for name, h := range b.hosts {
			if st := h.Status(); st.State == BreakerClosed {
				b.forgotten.sends += st.Sends
				b.forgotten.failures += st.Failures
				delete(b.hosts, name)
			}
		}
		if len(b.hosts) >= maxHostBreakers {
			return own
		}
	}
	h := NewBreaker(b.cfg)
	b.hosts[host] = h
	return h
}

// stateRank orders breaker states from best to worst.
var stateRank = map[string]int{BreakerClosed: 0, BreakerHalfOpen: 1, BreakerOpen: 2}

// WorseState is the worse of two breaker states: what a channel shows when
// any of its breakers (its push services', or its processes') is in it.
func WorseState(a, b string) string {
	if stateRank[b] > stateRank[a] {
		return b
	}
	return a
}

// Status is the channel's health over every app, as one breaker's would
// read: the worst state, the summed counts and the latest error, with the
// app it came from when not the default app's. ok is false for a channel
// without a provider.
func (b *Breakers) Status(channel string) (st BreakerStatus, ok bool) {
	st, ok = b.AppStatus(channel)
	if !ok {
		return st, false
	}
	b.appsMu.Lock()
	others, names := maps.Clone(b.apps), b.appNames
	b.appsMu.Unlock()
	name := func(id int32) string {
		if names != nil {
			if n := names(id); n != "" {
				return n
			}
		}
		return fmt.Sprint(id)
	}
	for id, a := range others {
		as, _ := a.AppStatus(channel)
		st.Sends += as.Sends
		st.Failures += as.Failures
		st.Refused += as.Refused
		st.State = WorseState(st.State, as.State)
		if as.LastError != "" && as.LastErrorAt.After(st.LastErrorAt) {
			st.LastError, st.LastErrorAt = "app "+name(id)+": "+as.LastError, as.LastErrorAt
		}
		if as.LastRefused != "" && as.LastRefusedAt.After(st.LastRefusedAt) {
			st.LastRefused, st.LastRefusedAt = "app "+name(id)+": "+as.LastRefused, as.LastRefusedAt
		}
	}
	return st, true
}

// AppStatus is the channel's health in this app's breakers alone: for Web
// Push, the worst of its hosts' states, their summed counts, and the latest
// error with the host it came from. ok is false for a channel without a
// provider.
func (b *Breakers) AppStatus(channel string) (st BreakerStatus, ok bool) {
	own, ok := b.channels[channel]
	if !ok {
		return BreakerStatus{}, false
	}
	st = own.Status()
	if channel == ChannelAPNs && b.apnsSandbox != nil {
		sb := b.apnsSandbox.Status()
		st.Sends += sb.Sends
		st.Failures += sb.Failures
		st.State = WorseState(st.State, sb.State)
		if sb.LastError != "" && sb.LastErrorAt.After(st.LastErrorAt) {
			st.LastError, st.LastErrorAt = "sandbox: "+sb.LastError, sb.LastErrorAt
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if r := b.refused[channel]; r != nil {
		st.Refused, st.LastRefused, st.LastRefusedAt = r.n, r.last, r.at
	}
	if channel != ChannelWebPush {
		return st, true
	}
	st.Sends += b.forgotten.sends
	st.Failures += b.forgotten.failures
	for host, h := range b.hosts {
		hs := h.Status()
		st.Sends += hs.Sends
		st.Failures += hs.Failures
		st.State = WorseState(st.State, hs.State)
		if hs.LastError != "" && hs.LastErrorAt.After(st.LastErrorAt) {
			st.LastError, st.LastErrorAt = host+": "+hs.LastError, hs.LastErrorAt
		}
	}
	return st, true
}
