package webpush

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldpush/herald/jobs/push"
	"github.com/heraldpush/herald/jobs/push/fake"
	"github.com/heraldpush/herald/jobs/push/pushtest"
)

// twoServices starts two fakepush servers, two push services on two hosts
// (127.0.0.1 at two ports), sharing a CA and VAPID keys as the browsers'
// services share Herald's keys, and a Provider that may post to both.
func twoServices(t *testing.T, limits pushtest.Limits, configure ...func(*Config)) (a, b *pushtest.Fakepush, p *Provider) {
	t.Helper()
	dir := t.TempDir()
	shared := func(c *fake.Config) { c.TLSDir = dir }
	a, b = pushtest.Start(t, shared), pushtest.Start(t, shared)
	_, p = harness().NewProvider(t, a, limits, append([]func(*Config){func(c *Config) {
		egress, err := push.NewEgressPolicy([]string{a.Env[fake.EnvWebPushHosts], b.Env[fake.EnvWebPushHosts]})
		require.NoError(t, err)
		c.Egress = egress
	}}, configure...)...)
	return a, b, p
}

// hostOf is the push service host of fakepush's subscriptions.
func hostOf(fp *pushtest.Fakepush) string { return strings.TrimPrefix(fp.URL, "https://") }

// pacingOf is the pacing of host, as the metrics show it.
func pacingOf(t *testing.T, p *Provider, host string) HostPacing {
	t.Helper()
	for _, h := range p.Pacing() {
		if h.Host == host {
			return h
		}
	}
	t.Fatalf("no pacing for %s in %+v", host, p.Pacing())
	return HostPacing{}
}

// TestSlowServiceHoldsBackOnlyItself: a push service that holds every
// request unanswered until it times out takes its own in-flight bound, and
// a chunk to another service, sent meanwhile as the fan-out sends its host
// groups, is answered in full while the first is still held. The slow
// service's bound then shrinks; the other's stays at MaxInFlight. With one
// Limiter for every service, the second chunk waited behind the first's
// timeouts.
func TestSlowServiceHoldsBackOnlyItself(t *testing.T) {
	t.Parallel()
	const maxInFlight = 4
	slow, healthy, p := twoServices(t, pushtest.Limits{MaxInFlight: maxInFlight, RequestTimeout: 3 * time.Second})
	slow.Control(t, `{"channel":"webpush","latency_ms":600000}`)
	m := pushtest.Message(t, "msg_hosts", false)

	var mu sync.Mutex
	var order []string
	record := func(what string) func(int) {
		return func(int) {
			mu.Lock()
			order = append(order, what)
			mu.Unlock()
		}
	}
	slowTargets := slow.Subscribe(t, maxInFlight, false)
	healthyTargets := healthy.Subscribe(t, 2*maxInFlight, false)
	slowResults := make([]push.Result, len(slowTargets))
	slowDone := make(chan struct{})
	go func() {
		defer close(slowDone)
		p.Send(context.Background(), m, slowTargets, slowResults, pushtest.AllowAll, record("slow"))
	}()
	require.Eventually(t, func() bool { return slow.Stats(t).WebPush.Received == maxInFlight },
		10*time.Second, 5*time.Millisecond, "the slow service's requests are all in flight")

	healthyResults := make([]push.Result, len(healthyTargets))
	p.Send(context.Background(), m, healthyTargets, healthyResults, pushtest.AllowAll, record("healthy"))
	mu.Lock()
	require.Equal(t, strings.Repeat("healthy ", 2*maxInFlight), strings.Join(order, " ")+" ",
		"every push to the healthy service answered, none of the slow one's")
	mu.Unlock()
	for i, r := range healthyResults {
		require.True(t, r.Accepted, "target %d: %+v", i, r)
	}
	require.Len(t, healthy.Receipts(t, m.ID), 2*maxInFlight)

	<-slowDone
	for i, r := range slowResults {
		require.True(t, r.Unanswered, "target %d: %+v", i, r)
	}
	require.Less(t, pacingOf(t, p, hostOf(slow)).InFlightLimit, maxInFlight, "the slow service's bound shrank")
	require.Equal(t, maxInFlight, pacingOf(t, p, hostOf(healthy)).InFlightLimit, "the healthy service's did not")
}

// TestThrottlingServiceShrinksOnlyItsBound: a push service that answers
// 503 with a Retry-After throttles Herald as a whole, and its bound on
// requests in flight halves; the other service's, sent to in the same
// Send, stays at MaxInFlight.
func TestThrottlingServiceShrinksOnlyItsBound(t *testing.T) {
	t.Parallel()
	const maxInFlight = 8
	throttling, healthy, p := twoServices(t, pushtest.Limits{MaxInFlight: maxInFlight})
	throttling.Control(t, `{"channel":"webpush","mode":"unavailable","retry_after_s":30}`)
	targets := append(throttling.Subscribe(t, 4, false), healthy.Subscribe(t, 4, false)...)
	results := make([]push.Result, len(targets))
	p.Send(context.Background(), pushtest.Message(t, "msg_503", false), targets, results, pushtest.AllowAll, nil)
	for i, r := range results[:4] {
		require.Equal(t, push.ReasonProviderUnavailable, r.Reason, "target %d: %+v", i, r)
		require.Equal(t, 30*time.Second, r.RetryAfter)
	}
	for i, r := range results[4:] {
		require.True(t, r.Accepted, "target %d: %+v", 4+i, r)
	}
	require.Less(t, pacingOf(t, p, hostOf(throttling)).InFlightLimit, maxInFlight, "halved (once a round trip)")
	require.Equal(t, maxInFlight, pacingOf(t, p, hostOf(healthy)).InFlightLimit)
}

// TestEachServiceHasItsOwnRate: the sustained rate binds each push
// service apart. At one send a minute, each service's first push goes at
// once and the rest would wait past the attempt's deadline, so they are
// not sent; with one rate for every service, only the very first push
// went.
func TestEachServiceHasItsOwnRate(t *testing.T) {
	t.Parallel()
	a, b, p := twoServices(t, pushtest.Limits{}, func(c *Config) { c.HostRate = 1.0 / 60 })
	targets := append(a.Subscribe(t, 3, false), b.Subscribe(t, 3, false)...)
	results := make([]push.Result, len(targets))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p.Send(ctx, pushtest.Message(t, "msg_rate", false), targets, results, pushtest.AllowAll, nil)
	for i, r := range results {
		if i%3 == 0 {
			require.True(t, r.Accepted, "target %d: %+v", i, r)
			continue
		}
		require.Equal(t, push.ReasonProviderUnavailable, r.Reason, "target %d: %+v", i, r)
		require.True(t, r.At.IsZero(), "target %d was not sent: %+v", i, r)
		require.Contains(t, r.Detail, "not sent")
	}
	require.Equal(t, int64(1), a.Stats(t).WebPush.Received)
	require.Equal(t, int64(1), b.Stats(t).WebPush.Received)
	require.InDelta(t, 1.0/60, pacingOf(t, p, hostOf(a)).Rate, 1e-9)
	require.InDelta(t, 1.0/60, pacingOf(t, p, hostOf(b)).Rate, 1e-9)
}

// TestMixedServicesMapBack sends one Send to targets on two push services
// interleaved, with a refused endpoint, a dead subscription and a lead
// among them: every result lands at its target's index, answered is called
// once for each request made and never for the refused one, and each
// service got its own subscriptions' pushes.
func TestMixedServicesMapBack(t *testing.T) {
	t.Parallel()
	a, b, p := twoServices(t, pushtest.Limits{MaxInFlight: 2})
	liveA, liveB := a.Subscribe(t, 3, false), b.Subscribe(t, 3, false)
	dead := b.Subscribe(t, 1, true)[0]
	plain := liveA[0]
	plain.Token = strings.Replace(plain.Token, "https://", "http://", 1)
	targets := []push.Target{liveA[0], liveB[0], liveA[1], plain, liveB[1], dead, liveA[2], liveB[2]}
	for i := range targets {
		targets[i].DeviceID = int64(100 + i)
	}
	m := pushtest.Message(t, "msg_mixed", false)

	results := make([]push.Result, len(targets))
	var mu sync.Mutex
	answered := map[int]int{}
	p.Send(push.WithLead(context.Background(), 3), m, targets, results, pushtest.AllowAll, func(i int) {
		// The result is in place when answered is called.
		assert.False(t, results[i].At.IsZero(), "target %d", i) //nolint:forbidigo // on a sender goroutine, where require cannot stop the test
		mu.Lock()
		answered[i]++
		mu.Unlock()
	})
	want := map[int]push.Reason{3: push.ReasonEndpointForbidden, 5: push.ReasonUnregistered}
	for i, r := range results {
		require.Equal(t, want[i], r.Reason, "target %d: %+v", i, r)
		require.Equal(t, want[i] == push.ReasonNone, r.Accepted, "target %d: %+v", i, r)
	}
	require.Equal(t, map[int]int{0: 1, 1: 1, 2: 1, 4: 1, 5: 1, 6: 1, 7: 1}, answered, "once for each request, never for the refused endpoint")

	tokens := func(fp *pushtest.Fakepush) []string {
		var out []string
		for _, rc := range fp.Receipts(t, m.ID) {
			out = append(out, rc.Token)
		}
		return out
	}
	endpoints := func(ts ...push.Target) []string {
		var out []string
		for _, tg := range ts {
			out = append(out, tg.Token)
		}
		return out
	}
	require.ElementsMatch(t, endpoints(liveA...), tokens(a))
	require.ElementsMatch(t, endpoints(liveB...), tokens(b))
	require.ElementsMatch(t, []string{hostOf(a), hostOf(b)}, hostsOf(p.Pacing()), "no pacing for the refused endpoint")
}

// TestMixedServicesParkTogether: once allow has refused, the rest of a
// Send is parked on every push service, without asking again.
func TestMixedServicesParkTogether(t *testing.T) {
	t.Parallel()
	a, b, p := twoServices(t, pushtest.Limits{MaxInFlight: 1})
	var targets []push.Target
	for i, tg := range append(a.Subscribe(t, 4, false), b.Subscribe(t, 4, false)...) {
		tg.DeviceID = int64(i + 1)
		targets = append(targets, tg)
	}
	var asked atomic.Int32
	allow := func() bool { return asked.Add(1) <= 2 }
	results := make([]push.Result, len(targets))
	p.Send(context.Background(), pushtest.Message(t, "msg_park", false), targets, results, allow, nil)
	var accepted, parked int
	for i, r := range results {
		switch {
		case r.Accepted:
			accepted++
		case r.Detail == "parked: circuit breaker open":
			parked++
		default:
			t.Fatalf("target %d: %+v", i, r)
		}
	}
	require.Equal(t, 2, accepted)
	require.Equal(t, 6, parked)
	require.LessOrEqual(t, asked.Load(), int32(4), "each service asks at most once after the refusal")
}

func hostsOf(ps []HostPacing) []string {
	var out []string
	for _, h := range ps {
		out = append(out, h.Host)
	}
	return out
}

// TestHostsAreBounded: a host's Limiter goes once it has been idle for
// hostIdle; at maxHosts, idle hosts at their full bound go to make room,
// a shrunk one stays (its bound is what paces a throttling service), and
// past them the hosts share one Limiter, shown as othersHost.
func TestHostsAreBounded(t *testing.T) {
	t.Parallel()
	h := newHosts(4, -1, nil)
	defer h.close()
	now := time.Now()
	h.now = func() time.Time { return now }

	old := h.acquire("old.example")
	h.release(old)
	now = now.Add(hostIdle)
	h.release(h.acquire("new.example"))
	require.Equal(t, []string{"new.example"}, hostsOf(h.pacing()), "the idle host went")

	// new.example stays idle; one shrunk idle host, and the rest busy.
	shrunk := h.acquire("shrunk.example")
	shrunk.limiter.Send(context.Background(), []push.Target{{}}, make([]push.Result, 1), pushtest.AllowAll, nil, nil,
		func(push.Target) push.Result {
			return push.Result{Reason: push.ReasonProviderUnavailable, Unanswered: true}
		})
	require.Equal(t, 2, shrunk.limiter.InFlightLimit())
	h.release(shrunk)
	for i := len(h.byName); i < maxHosts; i++ {
		h.acquire("busy-" + strconv.Itoa(i) + ".example")
	}
	require.Len(t, h.byName, maxHosts)

	h.acquire("one-more.example")
	require.NotContains(t, h.byName, "new.example", "an idle host at its full bound made room")
	require.Contains(t, h.byName, "shrunk.example", "a shrunk one stays")
	require.Contains(t, h.byName, "one-more.example")

	s := h.acquire("past.example")
	require.Same(t, h.others, s, "past maxHosts, the hosts share one Limiter")
	ps := h.pacing()
	require.Len(t, ps, maxHosts+1)
	require.Equal(t, othersHost, ps[0].Host, "shown once used")
	require.Equal(t, 4, ps[0].InFlightLimit)
	require.Zero(t, ps[0].Rate, "a negative rate is no bound")
}

// TestSenderWideThrottleSlowsTheSender: a push service that answers 429 to
// every subscription at once throttles the sender, not each subscription:
// after the first few, its 429s are read as about all of Herald's requests
// to it, and its bound on requests in flight halves, as a 503 with a
// Retry-After does. A service throttling a few subscriptions among many
// accepted keeps each 429 its subscription's, and its bound.
func TestSenderWideThrottleSlowsTheSender(t *testing.T) {
	t.Parallel()
	const maxInFlight = 8
	wall, some, p := twoServices(t, pushtest.Limits{MaxInFlight: maxInFlight})
	wall.Control(t, `{"channel":"webpush","mode":"rate_limited","retry_after_s":30}`)
	targets := wall.Subscribe(t, 24, false)
	results := make([]push.Result, len(targets))
	p.Send(context.Background(), pushtest.Message(t, "msg_429_all", false), targets, results, pushtest.AllowAll, nil)
	senderWide := 0
	for i, r := range results {
		require.Equal(t, push.ReasonRateLimited, r.Reason, "target %d: %+v", i, r)
		if !r.TargetThrottled {
			senderWide++
		}
	}
	require.GreaterOrEqual(t, senderWide, len(targets)-senderWideAfter-maxInFlight, "the wall of 429s was read one subscription at a time")
	require.Less(t, pacingOf(t, p, hostOf(wall)).InFlightLimit, maxInFlight, "the throttled sender's bound halved")

	some.Control(t, `{"channel":"webpush","throttle":{"share":0.1,"retry_after_s":30}}`)
	targets = some.Subscribe(t, 100, false)
	results = make([]push.Result, len(targets))
	p.Send(context.Background(), pushtest.Message(t, "msg_429_some", false), targets, results, pushtest.AllowAll, nil)
	held := 0
	for i, r := range results {
		if r.Reason == push.ReasonRateLimited {
			held++
			require.True(t, r.TargetThrottled, "target %d, among many accepted, is its own: %+v", i, r)
		}
	}
	require.Positive(t, held, "fakepush throttled none")
	require.Equal(t, maxInFlight, pacingOf(t, p, hostOf(some)).InFlightLimit, "a few throttled subscriptions leave the bound")
}
