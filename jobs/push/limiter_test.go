package push

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// sent is what the tests' send func answers: accepted, naming the token, so
// that a result shows which target it was made for.
func sent(t Target) Result { return Result{Accepted: true, Detail: "sent " + t.Token} }

// rejectBad refuses the token "bad" the way a provider refuses a token it
// cannot put on the wire.
func rejectBad(t Target) (Result, bool) {
	if t.Token != "bad" {
		return Result{}, false
	}
	return Result{Reason: ReasonBadToken, Detail: "rejected"}, true
}

func tokens(ts ...string) []Target {
	out := make([]Target, len(ts))
	for i, tok := range ts {
		out[i] = Target{DeviceID: int64(i + 1), Token: tok}
	}
	return out
}

func TestLimiterSend(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		targets []Target
		reject  func(Target) (Result, bool)
		// allows answers allow's calls in turn.
		allows []bool
		want   []Result
		// asked is how often allow must have been asked.
		asked int
	}{
		{
			name:    "AllSent",
			targets: tokens("a", "b", "c"),
			allows:  []bool{true, true, true},
			want:    []Result{{Accepted: true, Detail: "sent a"}, {Accepted: true, Detail: "sent b"}, {Accepted: true, Detail: "sent c"}},
			asked:   3,
		},
		{
			name:    "NoTargets",
			targets: nil,
			want:    []Result{},
		},
		{
			name:    "RejectedWithoutRequest",
			targets: tokens("a", "bad", "c"),
			reject:  rejectBad,
			allows:  []bool{true, true},
			want:    []Result{{Accepted: true, Detail: "sent a"}, {Reason: ReasonBadToken, Detail: "rejected"}, {Accepted: true, Detail: "sent c"}},
			asked:   2,
		},
		{
			name:    "NilReject",
			targets: tokens("bad"),
			allows:  []bool{true},
			want:    []Result{{Accepted: true, Detail: "sent bad"}},
			asked:   1,
		},
		{
			name:    "BreakerOpen",
			targets: tokens("a", "b"),
			allows:  []bool{false},
			want:    []Result{parked(), parked()},
			asked:   1,
		},
		{
			// Once allow refused, even a target reject would refuse is
			// parked, and allow is not asked again.
			name:    "OpensMidway",
			targets: tokens("a", "b", "bad", "d"),
			reject:  rejectBad,
			allows:  []bool{true, false},
			want:    []Result{{Accepted: true, Detail: "sent a"}, parked(), parked(), parked()},
			asked:   2,
		},
		{
			// A rejected target does not ask allow, so the breaker's
			// refusal falls on the next target that would be sent.
			name:    "RejectedBeforeRefusal",
			targets: tokens("bad", "b", "c"),
			reject:  rejectBad,
			allows:  []bool{false},
			want:    []Result{{Reason: ReasonBadToken, Detail: "rejected"}, parked(), parked()},
			asked:   1,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var asked atomic.Int32
			allow := func() bool {
				n := int(asked.Add(1))
				require.LessOrEqual(t, n, len(tc.allows), "allow asked too often")
				return tc.allows[n-1]
			}
			results := make([]Result, len(tc.targets))
			l := NewLimiter(len(tc.targets) + 1)
			t.Cleanup(l.Close)
			l.Send(context.Background(), tc.targets, results, allow, nil, tc.reject, sent)
			require.Equal(t, tc.want, withoutLatency(t, results))
			require.Equal(t, tc.asked, int(asked.Load()))
			for i, r := range results {
				if r == parked() {
					require.True(t, r.At.IsZero(), "target %d: a parked send has no time", i)
				}
			}
		})
	}
}

func TestLimiterSendParkedResult(t *testing.T) {
	t.Parallel()
	// Providers' callers and tests depend on this exact value: the reason
	// feeds the breaker, and the zero time says nothing was attempted.
	require.Equal(t, Result{Reason: ReasonProviderUnavailable, Detail: "parked: circuit breaker open"}, parked())
}

func TestLimiterSendCanceled(t *testing.T) {
	t.Parallel()
	// One slot, held by the first target's request until release closes, so
	// that Send is waiting for a slot when ctx ends.
	l := NewLimiter(1)
	t.Cleanup(l.Close)
	started, release := make(chan struct{}), make(chan struct{})
	send := func(t Target) Result {
		if t.Token == "a" {
			close(started)
			<-release
		}
		return sent(t)
	}
	ctx, cancel := context.WithCancel(context.Background())
	results := make([]Result, 4)
	done := make(chan struct{})
	go func() {
		defer close(done)
		l.Send(ctx, tokens("a", "b", "bad", "d"), results, func() bool { return true }, nil, rejectBad, send)
	}()
	<-started
	cancel()
	select {
	case <-done:
		t.Fatal("Send returned before the request in flight answered")
	case <-time.After(20 * time.Millisecond):
	}
	close(release)
	<-done

	notSent := Result{Reason: ReasonProviderUnavailable, Detail: "not sent: context canceled"}
	require.Equal(t, []Result{{Accepted: true, Detail: "sent a"}, notSent, notSent, notSent}, withoutLatency(t, results),
		"every target from the one waiting for a slot on is not sent, even one reject would refuse")
}

func TestLimiterSendAllowWithSlotInHand(t *testing.T) {
	t.Parallel()
	// With one slot, allow holding it means no request can be in flight
	// while allow is asked: a breaker that opened while Send waited is seen
	// before the next request starts.
	l := NewLimiter(1)
	t.Cleanup(l.Close)
	var inFlight atomic.Int32
	allow := func() bool {
		require.Zero(t, inFlight.Load(), "allow was asked without the slot")
		return true
	}
	send := func(t Target) Result {
		inFlight.Add(1)
		defer inFlight.Add(-1)
		time.Sleep(time.Millisecond)
		return sent(t)
	}
	results := make([]Result, 5)
	l.Send(context.Background(), tokens("a", "b", "c", "d", "e"), results, allow, nil, nil, send)
	for i, r := range results {
		require.True(t, r.Accepted, "target %d", i)
	}
}

func TestLimiterSendRefusalFreesSlot(t *testing.T) {
	t.Parallel()
	// A refused allow hands its slot back: otherwise every refusal would
	// shrink the limit shared by later Sends until they hung.
	l := NewLimiter(1)
	t.Cleanup(l.Close)
	results := make([]Result, 1)
	for range 3 {
		l.Send(context.Background(), tokens("a"), results, func() bool { return false }, nil, nil, sent)
		require.Equal(t, parked(), results[0])
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		l.Send(context.Background(), tokens("a"), results, func() bool { return true }, nil, nil, sent)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Send hung: a refusal kept its slot")
	}
	require.True(t, results[0].Accepted)
}

func TestLimiterSendBound(t *testing.T) {
	t.Parallel()
	const limit = 4
	l := NewLimiter(limit)
	t.Cleanup(l.Close)
	var now, peak atomic.Int32
	send := func(t Target) Result {
		n := now.Add(1)
		for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
		}
		time.Sleep(time.Millisecond)
		now.Add(-1)
		return sent(t)
	}
	ts := make([]Target, 100)
	// Two Sends at once share the limit, as two chunks share a Provider's.
	done := make(chan []Result, 2)
	for range 2 {
		go func() {
			results := make([]Result, len(ts))
			l.Send(context.Background(), ts, results, func() bool { return true }, nil, nil, send)
			done <- results
		}()
	}
	for range 2 {
		for i, r := range <-done {
			require.True(t, r.Accepted, "target %d", i)
		}
	}
	require.LessOrEqual(t, peak.Load(), int32(limit))
	require.Greater(t, peak.Load(), int32(1), "requests ran concurrently")
}

// withoutLatency checks that every request that was made has its duration
// measured, and clears it so that results compare as values.
func withoutLatency(t *testing.T, results []Result) []Result {
	t.Helper()
	out := make([]Result, len(results))
	for i, r := range results {
		if strings.HasPrefix(r.Detail, "sent ") {
			require.Positive(t, r.Latency, "result %d: a sent request has its latency", i)
		} else {
			require.Zero(t, r.Latency, "result %d: nothing was sent", i)
		}
		r.Latency = 0
		out[i] = r
	}
	return out
}

// TestLimiterSendAnswered checks that answered hears of each request's
// answer as it comes, with the result already in place, and only of
// requests: a target refused locally or parked gets its result without it.
func TestLimiterSendAnswered(t *testing.T) {
	t.Parallel()
	l := NewLimiter(2)
	t.Cleanup(l.Close)
	results := make([]Result, 4)
	release := make(chan struct{})
	send := func(t Target) Result {
		if t.Token == "slow" {
			<-release
		}
		return sent(t)
	}
	heard := make(chan int, len(results))
	answered := func(i int) {
		assert.True(t, results[i].Accepted, "answered before the result was in place") //nolint:forbidigo // on the limiter's goroutine, where require cannot stop the test
		heard <- i
	}
	var asked atomic.Int32
	allow := func() bool { return asked.Add(1) <= 2 }
	done := make(chan struct{})
	go func() {
		defer close(done)
		l.Send(context.Background(), tokens("a", "bad", "slow", "parked"), results, allow, answered, rejectBad, send)
	}()
	// "a" is heard of while "slow" still waits for its answer.
	select {
	case i := <-heard:
		require.Equal(t, 0, i)
	case <-time.After(10 * time.Second):
		t.Fatal("an answer was not heard of until the Send was done")
	}
	close(release)
	<-done
	close(heard)
	var rest []int
	for i := range heard {
		rest = append(rest, i)
	}
	require.Equal(t, []int{2}, rest, "only requests are heard of")
	require.Equal(t, parked(), results[3])
	require.Equal(t, ReasonBadToken, results[1].Reason)
}

// TestLimiterSendLeadGoesFirst takes the turn as a Send in progress holds
// it, and checks that another Send's lead is sent meanwhile, while the
// rest of that Send waits for the turn.
func TestLimiterSendLeadGoesFirst(t *testing.T) {
	t.Parallel()
	l := NewLimiter(4)
	t.Cleanup(l.Close)
	require.NoError(t, l.turn.Acquire(context.Background(), 1))
	seen := make(chan string, 3)
	send := func(t Target) Result {
		seen <- t.Token
		return sent(t)
	}
	done := make(chan []Result, 1)
	go func() {
		results := make([]Result, 3)
		l.Send(WithLead(context.Background(), 1), tokens("lead", "rest-1", "rest-2"), results, func() bool { return true }, nil, nil, send)
		done <- results
	}()
	select {
	case tok := <-seen:
		require.Equal(t, "lead", tok)
	case <-time.After(10 * time.Second):
		t.Fatal("the lead waited for the turn")
	}
	require.Empty(t, seen, "only the lead goes before the turn")
	l.turn.Release(1)
	results := <-done
	require.ElementsMatch(t, []string{"rest-1", "rest-2"}, []string{<-seen, <-seen})
	for i, r := range results {
		require.True(t, r.Accepted, "target %d", i)
	}
}

func TestLimiterAdaptsItsBound(t *testing.T) {
	t.Parallel()
	l := NewLimiter(8)
	defer l.Close()
	answer := func(r Result) {
		if r.Latency == 0 {
			r.Latency = 10 * time.Millisecond
		}
		l.observe(r)
	}
	answer(Result{Accepted: true})
	require.Equal(t, 8, l.InFlightLimit(), "it starts at MaxInFlight")

	answer(Result{Reason: ReasonProviderUnavailable, Unanswered: true})
	require.Equal(t, 4, l.InFlightLimit(), "a timeout halves it")
	answer(Result{Reason: ReasonProviderUnavailable, Unanswered: true})
	require.Equal(t, 4, l.InFlightLimit(), "once a round trip: the requests in flight together met the same trouble")
	l.mu.Lock()
	l.lastShrink = l.lastShrink.Add(-time.Second)
	l.mu.Unlock()
	answer(Result{Reason: ReasonRateLimited, Detail: "429 QUOTA_EXCEEDED"})
	require.Equal(t, 2, l.InFlightLimit(), "a provider-wide 429 halves it")
	answer(Result{Reason: ReasonRateLimited, TargetThrottled: true})
	require.Equal(t, 2, l.InFlightLimit(), "one device's 429 is no reason to slow the others")

	// Answers whose latency holds grow it by one a bound's worth; a slow
	// one starts the count again.
	answer(Result{Accepted: true, Latency: time.Second})
	answer(Result{Accepted: true})
	require.Equal(t, 2, l.InFlightLimit(), "a slow answer starts the count again")
	answer(Result{Accepted: true})
	require.Equal(t, 3, l.InFlightLimit())
	for range 100 {
		answer(Result{Accepted: true})
	}
	require.Equal(t, 8, l.InFlightLimit(), "never past MaxInFlight")
}

// TestLimiterShrinksOnAPause: a 503 that names a Retry-After is the
// provider (or a push service) asking for less from Herald as a whole, as
// a provider-wide 429 is; a bare 503 is its breaker's business, and a
// pause scoped to one device no one else's.
func TestLimiterShrinksOnAPause(t *testing.T) {
	t.Parallel()
	l := NewLimiter(8)
	defer l.Close()
	l.observe(Result{Reason: ReasonProviderUnavailable, Detail: "503"})
	require.Equal(t, 8, l.InFlightLimit(), "a 503 alone")
	l.observe(Result{Reason: ReasonRateLimited, RetryAfter: time.Minute, TargetThrottled: true})
	require.Equal(t, 8, l.InFlightLimit(), "one device's pause")
	l.observe(Result{Reason: ReasonProviderUnavailable, RetryAfter: time.Minute, Detail: "503"})
	require.Equal(t, 4, l.InFlightLimit(), "a 503 that asks for a pause halves it")
}

func TestLimiterKeepsToItsShrunkBound(t *testing.T) {
	t.Parallel()
	l := NewLimiter(4)
	defer l.Close()
	l.observe(Result{Reason: ReasonRateLimited, Latency: time.Millisecond})
	l.mu.Lock()
	l.lastShrink = time.Time{}
	l.mu.Unlock()
	l.observe(Result{Reason: ReasonRateLimited, Latency: time.Millisecond})
	require.Equal(t, 1, l.InFlightLimit())

	var inFlight, most atomic.Int32
	targets, results := make([]Target, 6), make([]Result, 6)
	l.Send(context.Background(), targets, results, func() bool { return true }, nil, nil, func(Target) Result {
		n := inFlight.Add(1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		time.Sleep(5 * time.Millisecond)
		inFlight.Add(-1)
		// Still throttled: the bound stays at one.
		return Result{Reason: ReasonRateLimited}
	})
	require.Equal(t, int32(1), most.Load(), "one request at a time at a bound of one")
}

func TestLimiterKeepsToItsRate(t *testing.T) {
	t.Parallel()
	l := NewLimiter(8)
	defer l.Close()
	l.SetRate(20, 1)
	require.InDelta(t, 20.0, l.Rate(), 0)
	targets, results := make([]Target, 5), make([]Result, 5)
	start := time.Now()
	l.Send(context.Background(), targets, results, func() bool { return true }, nil, nil, sent)
	// A burst of one, then one every 50 ms: the fifth no sooner than
	// 200 ms after the first.
	require.GreaterOrEqual(t, time.Since(start), 190*time.Millisecond)
	for _, r := range results {
		require.True(t, r.Accepted)
	}

	// A request that would wait past its context's deadline is not sent.
	l.SetRate(0.5, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	l.Send(ctx, targets[:2], results[:2], func() bool { return true }, nil, nil, sent)
	require.True(t, results[0].Accepted)
	require.Equal(t, ReasonProviderUnavailable, results[1].Reason)
	require.Contains(t, results[1].Detail, "not sent")

	l.SetRate(0, 0)
	require.Zero(t, l.Rate())
}

// TestLimitersShareABound: Limiters that share a Bound keep, together, to
// it, each within its own bound too; a request that waits for the shared
// slot holds its own, and one whose attempt ends meanwhile is not sent.
func TestLimitersShareABound(t *testing.T) {
	t.Parallel()
	b := NewBound(3)
	var inFlight, most atomic.Int32
	send := func(Target) Result {
		n := inFlight.Add(1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		time.Sleep(5 * time.Millisecond)
		inFlight.Add(-1)
		return Result{Accepted: true}
	}
	done := make(chan []Result, 2)
	for range 2 {
		l := NewLimiter(2)
		l.Share(b)
		defer l.Close()
		go func() {
			results := make([]Result, 10)
			l.Send(context.Background(), make([]Target, 10), results, func() bool { return true }, nil, nil, send)
			done <- results
		}()
	}
	for range 2 {
		for i, r := range <-done {
			require.True(t, r.Accepted, "target %d", i)
		}
	}
	require.Equal(t, int32(3), most.Load(), "two Limiters of two, within a shared three")

	// The shared slots all taken: a Send waits with its own slot in hand,
	// and when its attempt ends, that target and the rest are not sent.
	for range 3 {
		b.slots <- struct{}{}
	}
	l := NewLimiter(2)
	l.Share(b)
	defer l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	results := make([]Result, 2)
	l.Send(ctx, make([]Target, 2), results, func() bool { return true }, nil, nil, send)
	for i, r := range results {
		require.Contains(t, r.Detail, "not sent", "target %d", i)
	}
	require.Empty(t, l.slots, "the slot it held is back")
}
