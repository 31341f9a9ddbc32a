package jobs

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/heraldpush/herald/jobs/push"
)

type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time          { return c.t }
func (c *fakeClock) advance(d time.Duration) { c.t = c.t.Add(d) }

func TestBreaker(t *testing.T) {
	t.Parallel()
	clock := &fakeClock{t: time.Unix(1000, 0)}
	b := NewBreaker(BreakerConfig{Threshold: 3, Cooldown: time.Second, MaxCooldown: 3 * time.Second, Now: clock.now})

	require.True(t, b.Allow())
	b.Failure("503")
	b.Failure("503")
	b.Success() // a success in between resets the count
	b.Failure("503")
	b.Failure("503")
	require.Equal(t, BreakerClosed, b.Status().State)
	b.Failure("503 ServiceUnavailable")
	require.Equal(t, BreakerOpen, b.Status().State)
	require.Equal(t, "503 ServiceUnavailable", b.Status().LastError)
	require.False(t, b.Allow())
	require.Equal(t, time.Second, b.RetryIn())

	// After the cooldown exactly one probe goes through.
	clock.advance(time.Second)
	require.True(t, b.Allow())
	require.Equal(t, BreakerHalfOpen, b.Status().State)
	require.False(t, b.Allow(), "one probe at a time")

	// A failed probe reopens it for twice as long, capped.
	b.Failure("503")
	require.Equal(t, BreakerOpen, b.Status().State)
	require.Equal(t, 2*time.Second, b.RetryIn())
	clock.advance(2 * time.Second)
	require.True(t, b.Allow())
	b.Failure("503")
	require.Equal(t, 3*time.Second, b.RetryIn(), "capped at MaxCooldown")

	// A successful probe closes it and resets the cooldown.
	clock.advance(3 * time.Second)
	require.True(t, b.Allow())
	b.Success()
	require.Equal(t, BreakerClosed, b.Status().State)
	require.True(t, b.Allow())
	require.Zero(t, b.RetryIn())
	for range 3 {
		b.Failure("503")
	}
	require.Equal(t, time.Second, b.RetryIn(), "cooldown starts over")
}

// TestBreakersPerPushService checks that Web Push health is kept per push
// service: failures on one host park that host alone, while APNs keeps its
// one breaker, and the channel's status shows the worst host and its error.
func TestBreakersPerPushService(t *testing.T) {
	t.Parallel()
	clock := &fakeClock{t: time.Unix(1000, 0)}
	b := NewBreakers(BreakerConfig{Threshold: 2, Now: clock.now}, ChannelAPNs, ChannelWebPush)

	bad := b.For(ChannelWebPush, "https://Bad.Push.Example:8443/sub/1")
	require.Same(t, bad, b.For(ChannelWebPush, "https://bad.push.example:8443/sub/2?x=1"), "one breaker per host, whatever the path or case")
	good := b.For(ChannelWebPush, "https://updates.push.services.mozilla.com/wpush/v2/abc")
	require.NotSame(t, bad, good)
	require.Same(t, b.For(ChannelAPNs, "aa"), b.For(ChannelAPNs, "bb"), "APNs is one service")
	require.Nil(t, b.For(ChannelFCM, "token"), "no breaker for a channel without a provider")

	bad.Failure("push service answered 503 Service Unavailable")
	clock.advance(time.Millisecond)
	bad.Failure("push service answered 503 Service Unavailable")
	require.False(t, bad.Allow(), "the failing host is parked")
	require.True(t, good.Allow(), "every other push service is not")
	good.Success()

	st, ok := b.Status(ChannelWebPush)
	require.True(t, ok)
	require.Equal(t, BreakerOpen, st.State)
	require.Equal(t, "bad.push.example:8443: push service answered 503 Service Unavailable", st.LastError)
	require.Equal(t, int64(3), st.Sends)
	require.Equal(t, int64(2), st.Failures)
	apns, ok := b.Status(ChannelAPNs)
	require.True(t, ok)
	require.Equal(t, BreakerClosed, apns.State)
	_, ok = b.Status(ChannelFCM)
	require.False(t, ok)
}

// TestBreakersAPNsSandbox checks that Apple's sandbox host, a service of
// its own, has its own breaker: its outage parks the debug builds' pushes
// alone, and APNs's status shows it, named.
func TestBreakersAPNsSandbox(t *testing.T) {
	t.Parallel()
	clock := &fakeClock{t: time.Unix(1000, 0)}
	b := NewBreakers(BreakerConfig{Threshold: 1, Now: clock.now}, ChannelAPNs, ChannelFCM)
	production := b.ForTarget(Target{Target: push.Target{Token: "aa"}, Channel: ChannelAPNs})
	sandbox := b.ForTarget(Target{Target: push.Target{Token: "bb", Sandbox: true}, Channel: ChannelAPNs})
	require.Same(t, b.For(ChannelAPNs, "aa"), production)
	require.NotSame(t, production, sandbox)
	require.Same(t, b.For(ChannelFCM, "x"), b.ForTarget(Target{Target: push.Target{Token: "x"}, Channel: ChannelFCM}))

	sandbox.Failure("503 ServiceUnavailable")
	require.False(t, sandbox.Allow(), "the sandbox is parked")
	require.True(t, production.Allow(), "production is not")
	st, ok := b.Status(ChannelAPNs)
	require.True(t, ok)
	require.Equal(t, BreakerOpen, st.State)
	require.Equal(t, "sandbox: 503 ServiceUnavailable", st.LastError)
	require.Nil(t, NewBreakers(BreakerConfig{}, ChannelFCM).ForTarget(Target{Target: push.Target{Sandbox: true}, Channel: ChannelAPNs}),
		"no breaker without an APNs provider")
}

// TestBreakersStayBounded fills the host breakers past their bound: closed
// ones are let go with their counts kept, open ones stay.
func TestBreakersStayBounded(t *testing.T) {
	t.Parallel()
	b := NewBreakers(BreakerConfig{Threshold: 1}, ChannelWebPush)
	open := b.For(ChannelWebPush, "https://failing.example/x")
	open.Failure("no answer")
	for i := range maxHostBreakers + 10 {
		h := b.For(ChannelWebPush, fmt.Sprintf("https://h%d.example/x", i))
		h.Success()
	}
	b.mu.Lock()
	n := len(b.hosts)
	b.mu.Unlock()
	require.LessOrEqual(t, n, maxHostBreakers)
	require.Same(t, open, b.For(ChannelWebPush, "https://failing.example/y"), "an open breaker is kept")
	st, _ := b.Status(ChannelWebPush)
	require.Equal(t, int64(maxHostBreakers+11), st.Sends, "no count is lost")
	require.Equal(t, BreakerOpen, st.State)
}
