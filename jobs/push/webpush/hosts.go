package webpush

import (
	"cmp"
	"slices"
	"sync"
	"time"

	"github.com/heraldpush/herald/jobs/push"
)

// Pacing per push service. Every browser's subscriptions live on its own
// push service (Chrome's on fcm.googleapis.com, Firefox's on Mozilla's
// autopush, Safari's on web.push.apple.com, Edge's on WNS), and each
// service has limits of its own: one that throttles Herald or stops
// answering must slow only its own pushes. So each host an endpoint names
// has a push.Limiter of its own, made on first use, with the adaptive
// in-flight bound and the sustained rate every provider has; only a Bound
// across them all is shared.
const (
	// servicesAtFull is how many push services may each have MaxInFlight
	// requests in flight at once: the four browsers' services, so that one
	// that holds all of its requests unanswered never holds back another's.
	servicesAtFull = 4
	// maxHosts bounds the Limiters kept, as the breakers' are bounded: the
	// egress policy limits the hosts, but a wildcard entry admits any name
	// under a domain, and callers choose the names. The hosts past it share
	// one Limiter.
	maxHosts = 1000
	// hostIdle is how long a host's Limiter is kept after its last Send: a
	// service not sent to for that long has nothing to say about its load
	// now, and its metrics series goes.
	hostIdle = 10 * time.Minute
	// othersHost names the Limiter of the hosts past maxHosts, and of
	// endpoints that are no https URL (refused before any request), in
	// the metrics.
	othersHost = "(others)"
)

// HostPacing is one push service's pacing now, as the metrics show it.
type HostPacing struct {
	// Host is the endpoints' host (and port, if they name one).
	Host string
	// InFlightLimit is the bound on requests in flight to it now
	// (push.Limiter).
	InFlightLimit int
	// Rate is the sends a second it is kept to; zero for no bound.
	Rate float64
}

// hosts are the Limiters of the push services sent to.
type hosts struct {
	maxInFlight int
	rate        float64
	// quota, when set, gives a host's limiter the sender's shared quota
	// at that service (Config.Quota).
	quota func(host string, perSecond float64) push.Pacer
	// total bounds the requests in flight across every host.
	total *push.Bound
	now   func() time.Time

	mu     sync.Mutex
	byName map[string]*host
	// others is shared by the hosts past maxHosts; othersUsed says whether
	// a host has ever used it, and so whether it is shown.
	others     *host
	othersUsed bool
}

// host is one push service's Limiter and its use.
type host struct {
	name    string
	limiter *push.Limiter
	// throttle tells the service's throttling of the sender as a whole
	// from that of one subscription.
	throttle senderThrottle
	// sends counts the Sends using it, which keep it from being dropped;
	// last is when the last one began. Both under hosts.mu.
	sends int
	last  time.Time
}

func newHosts(maxInFlight int, rate float64, quota func(host string, perSecond float64) push.Pacer) *hosts {
	h := &hosts{
		maxInFlight: maxInFlight, rate: rate, quota: quota, total: push.NewBound(servicesAtFull * maxInFlight),
		now: time.Now, byName: map[string]*host{},
	}
	h.others = h.newHost(othersHost)
	return h
}

func (h *hosts) newHost(name string) *host {
	l := push.NewLimiter(h.maxInFlight)
	if h.quota != nil && h.rate > 0 && name != othersHost {
		// The sender's quota at the service, which every process shares.
		l.SetPacer(h.quota(name, h.rate), h.rate)
	} else {
		// Bursts of a minute's worth, as FCM's: a push service counts its
		// limits over minutes, not milliseconds.
		l.SetRate(h.rate, int(60*h.rate))
	}
	l.Share(h.total)
	return &host{name: name, limiter: l}
}

// acquire returns the Limiter of the push service at name, made on first
// use, held until release.
func (h *hosts) acquire(name string) *host {
	h.mu.Lock()
	defer h.mu.Unlock()
	now := h.now()
	s := h.byName[name]
	if s == nil {
		h.sweep(now)
		switch {
		case name == "":
			s = h.others
		case len(h.byName) >= maxHosts:
			s, h.othersUsed = h.others, true
		default:
			s = h.newHost(name)
			h.byName[name] = s
		}
	}
	s.sends++
	s.last = now
	return s
}

// release ends a Send's use of s.
func (h *hosts) release(s *host) {
	h.mu.Lock()
	s.sends--
	h.mu.Unlock()
}

// sweep drops the Limiters no Send has used for hostIdle, and when the
// hosts are at maxHosts those of every idle host whose bound is at its
// maximum: they hold nothing learned, where a shrunk bound is what keeps a
// throttling service paced. A dropped Limiter's senders end; a Send that
// comes later makes a new one.
func (h *hosts) sweep(now time.Time) {
	full := len(h.byName) >= maxHosts
	for name, s := range h.byName {
		if s.sends > 0 {
			continue
		}
		if now.Sub(s.last) >= hostIdle || full && s.limiter.InFlightLimit() == h.maxInFlight {
			s.limiter.Close()
			delete(h.byName, name)
		}
	}
}

// pacing is every host's pacing now, and the shared Limiter's once a host
// has used it.
func (h *hosts) pacing() []HostPacing {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.sweep(h.now())
	out := make([]HostPacing, 0, len(h.byName)+1)
	for _, s := range h.byName {
		out = append(out, HostPacing{Host: s.name, InFlightLimit: s.limiter.InFlightLimit(), Rate: s.limiter.Rate()})
	}
	if h.othersUsed {
		out = append(out, HostPacing{Host: h.others.name, InFlightLimit: h.others.limiter.InFlightLimit(), Rate: h.others.limiter.Rate()})
	}
	slices.SortFunc(out, func(a, b HostPacing) int { return cmp.Compare(a.Host, b.Host) })
	return out
}

// close ends every Limiter's senders.
func (h *hosts) close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, s := range h.byName {
		s.limiter.Close()
	}
	h.others.limiter.Close()
}

// classify reads r, an answer of the host's service, as the host's recent
// answers say: a 429 while the service throttles the sender as a whole is
// about every request to it, not the one subscription (senderThrottle).
func (h *host) classify(r push.Result) push.Result {
	if r.Unanswered {
		return r // the service said nothing
	}
	if h.throttle.observe(time.Now(), r.TargetThrottled) {
		r.TargetThrottled = false
	}
	return r
}
