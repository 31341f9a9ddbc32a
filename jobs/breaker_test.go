package jobs

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"
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

// seededJitter is a Breaker's Jitter drawn from a fixed seed, safe for
// concurrent use, that records the bounds it was asked for.
type seededJitter struct {
	mu    sync.Mutex
	rng   *rand.Rand
	asked []time.Duration
}

func newSeededJitter() *seededJitter { return &seededJitter{rng: rand.New(rand.NewPCG(1, 2))} }

func (j *seededJitter) jitter(n time.Duration) time.Duration {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.asked = append(j.asked, n)
	return time.Duration(j.rng.Int64N(int64(n)))
}

// TestBreakerWakeSpreadsParkedChunksOverTheCooldown: of the chunks an open
// breaker parks, the first wakes at the probe's instant, to carry the
// probe, and the others over the cooldown after it, not at one instant,
// whenever in the cooldown they parked. Allow is as before: one probe once
// the cooldown is over. While the probe is out they wait a quarter of the
// cooldown and their share; a failed probe's longer cooldown has a prober
// and a window of its own; a provider's pause spreads them over at most
// MaxCooldown; a closed breaker parks nothing.
func TestBreakerWakeSpreadsParkedChunksOverTheCooldown(t *testing.T) {
	t.Parallel()
	clock := &fakeClock{t: time.Unix(1000, 0)}
	j := newSeededJitter()
	const cooldown = 10 * time.Second
	b := NewBreaker(BreakerConfig{Threshold: 1, Cooldown: cooldown, MaxCooldown: 4 * cooldown, Now: clock.now, Jitter: j.jitter})
	require.Zero(t, b.Wake(), "a closed breaker parks nothing")
	require.Empty(t, j.asked)

	b.Failure("503")
	opened := clock.t
	require.Equal(t, cooldown, b.Wake(), "the first chunk parked wakes for the probe")
	// wakes are the instants the chunks parked after it wake at, by the
	// second of the cooldown after the probe's instant.
	perSecond := map[time.Duration]int{}
	at := map[time.Time]int{}
	for i := range 200 {
		if i == 100 {
			clock.advance(4 * time.Second) // later in the cooldown
		}
		w := b.Wake()
		wake := clock.t.Add(w)
		require.False(t, wake.Before(opened.Add(cooldown)), "woke before the probe's instant")
		require.True(t, wake.Before(opened.Add(2*cooldown)), "woke past a cooldown after the probe")
		perSecond[wake.Sub(opened.Add(cooldown)).Truncate(time.Second)]++
		at[wake]++
	}
	require.Len(t, perSecond, 10, "every second of the window has chunks waking")
	for s, n := range perSecond {
		require.GreaterOrEqual(t, n, 8, "second %v of the window has %d of 200 chunks", s, n)
	}
	for wake, n := range at {
		require.Less(t, n, 3, "%d chunks wake at %v", n, wake)
	}
	require.Len(t, j.asked, 200)
	for _, n := range j.asked {
		require.Equal(t, cooldown, n, "a share of the cooldown")
	}

	// One probe once the cooldown is over, as before.
	clock.t = opened.Add(cooldown - time.Millisecond)
	require.False(t, b.Allow())
	clock.t = opened.Add(cooldown)
	require.True(t, b.Allow(), "the probe")
	require.False(t, b.Allow(), "one probe at a time")
	w := b.Wake()
	require.GreaterOrEqual(t, w, cooldown/4, "parked while the probe is out")
	require.Less(t, w, cooldown/4+cooldown)

	// The probe failed: the cooldown doubles, and its probe's instant has a
	// prober and a window of its own.
	b.Failure("503")
	require.Equal(t, 2*cooldown, b.Wake())
	for range 20 {
		w := b.Wake()
		require.Greater(t, w, 2*cooldown)
		require.Less(t, w, 4*cooldown)
	}

	// A provider's pause of five minutes: its own prober, and the others
	// spread over at most MaxCooldown after it.
	b.Pause(5*time.Minute, "503 Retry-After: 300")
	require.Equal(t, 5*time.Minute, b.Wake())
	for range 20 {
		w := b.Wake()
		require.Greater(t, w, 5*time.Minute)
		require.Less(t, w, 5*time.Minute+4*cooldown)
	}

	clock.advance(5 * time.Minute)
	require.True(t, b.Allow())
	b.Success()
	require.Zero(t, b.Wake(), "closed again")
}

// TestFanOutSpreadsParkedChunksOverTheCooldown works twelve chunks of three
// devices each while their provider's breaker is open: none is sent, one
// chunk snoozes until the probe's instant, the cooldown, and the other
// eleven each for the cooldown and a share of it drawn once for the chunk
// (not once for each device, whose least would bring them back at the
// probe's instant again), spread over the cooldown after the probe. The
// chunk that wakes first carries the probe: it is sent, the breaker
// closes, and the chunk's other devices follow.
func TestFanOutSpreadsParkedChunksOverTheCooldown(t *testing.T) {
	t.Parallel()
	b := setupFanOut(t)
	ctx := context.Background()
	const cooldown = time.Minute
	clock := &fakeClock{t: time.Now()}
	j := newSeededJitter()
	breakers := NewBreakers(BreakerConfig{Threshold: 1, Cooldown: cooldown, MaxCooldown: cooldown, Now: clock.now, Jitter: j.jitter}, Channels...)
	breakers.For(ChannelAPNs, "").Failure("503 from APNs")
	apns := &recordingSender{}
	w := b.worker(map[string]Sender{ChannelAPNs: apns}, FanOutConfig{Breakers: breakers})
	var tokens []string
	for i := range 36 {
		tokens = append(tokens, fmt.Sprintf("apns-%02d", i))
	}
	users := b.devices(tokens...)
	var chunks []chunkJob
	for i := 0; i < len(users); i += 3 {
		chunks = append(chunks, b.dueNow(users[i:i+3]))
	}

	snoozes := make([]time.Duration, len(chunks))
	for i, c := range chunks {
		err := w.Work(ctx, &river.Job[FanOutArgs]{JobRow: c.job, Args: c.args})
		var snooze *rivertype.JobSnoozeError
		require.ErrorAs(t, err, &snooze, "chunk %d was not parked", i)
		snoozes[i] = snooze.Duration
		require.GreaterOrEqual(t, snooze.Duration, cooldown, "chunk %d woke before the probe's instant", i)
		require.Less(t, snooze.Duration, 2*cooldown, "chunk %d woke past a cooldown after the probe", i)
	}
	require.Empty(t, apns.sends(), "nothing is sent while the breaker is open")
	require.Equal(t, cooldown, snoozes[0], "the first chunk parked wakes for the probe")
	require.Len(t, j.asked, len(chunks)-1, "one share drawn for each chunk but the prober's, not one for each device")
	require.Greater(t, slices.Max(snoozes)-slices.Min(snoozes), cooldown/2, "woken within a few moments: %v", snoozes)
	require.Len(t, slices.Compact(slices.Sorted(slices.Values(snoozes))), len(chunks), "two chunks wake at one instant: %v", snoozes)

	// At the probe's instant the prober sends the probe, which closes the
	// breaker, and then the rest of its devices.
	clock.advance(cooldown)
	c := chunks[0]
	require.NoError(t, w.Work(ctx, &river.Job[FanOutArgs]{JobRow: c.job, Args: c.args}))
	require.Len(t, apns.sends(), 3)
	require.Equal(t, BreakerClosed, breakers.For(ChannelAPNs, "").Status().State)
}
