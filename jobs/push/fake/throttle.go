package fake

import (
	"fmt"
	"hash/fnv"
	"net/http"
	"slices"
	"sync"
	"time"
)

// Throttle is a rate limit on some devices of one channel, set through
// POST /_control: a push to one of them is answered 429 in the provider's
// own words, as a provider answers a sender that pushes to one device too
// fast: APNs 429 TooManyRequests (Apple names no Retry-After), FCM 429
// QUOTA_EXCEEDED whose QuotaFailure names the device's rate, a Web Push 429
// for the subscription (RFC 8030 section 8.4), these two with Retry-After.
// Each throttled device is answered 429 Times times; a push to it that
// arrives before the last 429's Retry-After has passed is answered 429 again
// and counted as early (ChannelStats.ThrottledEarly). Then its pushes are
// accepted.
type Throttle struct {
	// Tokens names devices: APNs device tokens, FCM registration tokens,
	// Web Push subscriptions by endpoint or by the id that ends it.
	Tokens []string `json:"tokens,omitempty"`
	// Share throttles that share (0 to 1) of every device, picked by a hash
	// of its token (InThrottleShare), so that a client can tell which.
	Share float64 `json:"share,omitempty"`
	// RetryAfterS is the Retry-After, in seconds: 1 when zero. APNs's 429
	// carries none, as Apple's does not, but a push sooner is still early.
	RetryAfterS int `json:"retry_after_s,omitempty"`
	// Times is how many 429s each throttled device gets: 1 when zero.
	Times int `json:"times,omitempty"`
}

// InThrottleShare reports whether a Throttle with share throttles the
// device whose token (for Web Push, the subscription's id) is key.
func InThrottleShare(key string, share float64) bool {
	if share <= 0 {
		return false
	}
	h := fnv.New32a()
	_, _ = h.Write([]byte(key)) // a hash cannot fail
	return float64(h.Sum32()%10000) < share*10000
}

func (t *Throttle) validate() error {
	switch {
	case t.Share < 0 || t.Share > 1:
		return fmt.Errorf("throttle.share must be between 0 and 1, got %v", t.Share)
	case t.RetryAfterS < 0:
		return fmt.Errorf("throttle.retry_after_s must not be negative, got %d", t.RetryAfterS)
	case t.Times < 0:
		return fmt.Errorf("throttle.times must not be negative, got %d", t.Times)
	}
	return nil
}

// covers reports whether the throttle names the device keyed key.
func (t *Throttle) covers(key string) bool {
	return t != nil && (slices.Contains(t.Tokens, key) || InThrottleShare(key, t.Share))
}

// ThrottledDevice is what fakepush did to one throttled device, as
// GET /_throttled lists it.
type ThrottledDevice struct {
	Channel string `json:"channel"`
	Token   string `json:"token"`
	// Answered429 counts the 429s it was answered, Early those of them to
	// pushes that came before the previous 429's Retry-After had passed.
	Answered429 int `json:"answered_429"`
	Early       int `json:"early"`
	// Last429 is when the last 429 was answered; RetryAfterS what it said.
	Last429     time.Time `json:"last_429"`
	RetryAfterS int       `json:"retry_after_s"`
}

// throttles is fakepush's record of the devices it throttled, since the
// channel's throttle was last set or the server reset.
type throttles struct {
	mu      sync.Mutex
	devices map[Channel]map[string]*ThrottledDevice
}

func (t *throttles) reset(ch Channel) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.devices == nil {
		t.devices = map[Channel]map[string]*ThrottledDevice{}
	}
	t.devices[ch] = map[string]*ThrottledDevice{}
}

// list returns every throttled device.
func (t *throttles) list() []ThrottledDevice {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := []ThrottledDevice{}
	for ch := range numChannels {
		for _, d := range t.devices[ch] {
			out = append(out, *d)
		}
	}
	slices.SortFunc(out, func(a, b ThrottledDevice) int { return a.Last429.Compare(b.Last429) })
	return out
}

// throttle decides a push to the device keyed key on ch: whether its
// throttle answers it 429, and the Retry-After to say.
func (s *Server) throttle(ch Channel, key string) (retryAfter int, throttled bool) {
	rule := s.behaviourOf(ch).throttle
	if !rule.covers(key) {
		return 0, false
	}
	retryAfter, times := max(rule.RetryAfterS, 1), max(rule.Times, 1)
	now := s.cfg.Now()
	t := &s.throttles
	t.mu.Lock()
	defer t.mu.Unlock()
	d := t.devices[ch][key]
	if d == nil {
		d = &ThrottledDevice{Channel: ch.String(), Token: key, RetryAfterS: retryAfter}
		t.devices[ch][key] = d
	}
	until := d.Last429.Add(time.Duration(d.RetryAfterS) * time.Second)
	early := d.Answered429 > 0 && now.Before(until)
	if !early && d.Answered429 >= times {
		return 0, false
	}
	if early {
		d.Early++
		s.counters[ch].throttledEarly.Add(1)
		// What is left of the wait, rounded up.
		retryAfter = max(int((until.Sub(now)+time.Second-1)/time.Second), 1)
	} else {
		d.Last429, d.RetryAfterS = now, retryAfter
	}
	d.Answered429++
	s.counters[ch].throttled.Add(1)
	return retryAfter, true
}

func (s *Server) handleThrottled(w http.ResponseWriter, _ *http.Request) {
	s.writeJSON(w, http.StatusOK, s.Throttled())
}

// Throttled lists the devices the channels' throttles answered 429 since
// they were set (or the server reset), the earliest 429 first.
func (s *Server) Throttled() []ThrottledDevice { return s.throttles.list() }
