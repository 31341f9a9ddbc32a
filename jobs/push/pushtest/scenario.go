package pushtest

import (
	"context"
	"fmt"
	"net/http/httptrace"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/heraldpush/herald/jobs/push"
	"github.com/heraldpush/herald/jobs/push/fake"
)

// Run runs, in parallel, the scenarios every provider must pass alike, each
// against a fresh fakepush: Accepted, ProviderTrouble (with troubles: what
// the provider makes of fakepush's failure modes), Timeout,
// WarmOutlastsARequest, WarmForOpensWhatTheSendUses, Parked, ManyTargets,
// Receipts, AtTheSizeLimit and DevicesAnswer.
func (h *Harness[C, P]) Run(t *testing.T, troubles ...Trouble) {
	for _, sc := range []struct {
		name string
		run  func(t *testing.T)
	}{
		{"Accepted", func(t *testing.T) {
			b := h.Setup(t)
			b.SendAccepted(t, Message(t, "msg_accepted", true), b.Targets(t, 3))
		}},
		{"ProviderTrouble", func(t *testing.T) { h.SendInTrouble(t, troubles...) }},
		{"Timeout", h.SendTimeout},
		{"WarmOutlastsARequest", h.WarmOutlastsARequest},
		{"WarmForOpensWhatTheSendUses", h.WarmForOpensWhatTheSendUses},
		{"Parked", h.SendParked},
		{"ManyTargets", h.SendManyTargets},
		{"Receipts", h.SendReceipts},
		{"AtTheSizeLimit", h.SendAtTheSizeLimit},
		{"DevicesAnswer", h.SendDevicesAnswer},
	} {
		t.Run(sc.name, func(t *testing.T) {
			t.Parallel()
			sc.run(t)
		})
	}
}

// Trouble is one of fakepush's failure modes and what a provider makes of
// the answers it gets in it.
type Trouble struct {
	Mode   fake.Mode
	Reason push.Reason
	// Detail is every result's Detail: the provider's words for the answer.
	Detail string
}

// SendInTrouble checks, for each trouble in parallel, that a provider whose
// service sheds load in that mode answers every push at once, with exactly
// one request per push and no retries, and with the trouble's reason and
// words. The provider is warmed first, so that the answers are the channel's
// and not the first connection's.
func (h *Harness[C, P]) SendInTrouble(t *testing.T, troubles ...Trouble) {
	for _, tc := range troubles {
		t.Run(string(tc.Mode), func(t *testing.T) {
			t.Parallel()
			b := h.Setup(t)
			require.NoError(t, b.P.Warm(context.Background()))
			ts := b.Targets(t, 3)
			b.Control(t, fmt.Sprintf(`{"channel":%q,"mode":%q}`, h.Channel, tc.Mode))
			before := b.Stats(t).Received

			results := b.Send(Message(t, "msg_trouble", true), ts)
			// Left to itself the Firebase SDK would retry a 503 four times
			// over about seven seconds: one request a push shows it does
			// not, without timing anything on a shared machine.
			require.Equal(t, before+int64(len(ts)), b.Stats(t).Received, "exactly one request a push: no retries")
			for _, r := range results {
				require.False(t, r.Accepted)
				require.Equal(t, tc.Reason, r.Reason)
				require.Equal(t, tc.Detail, r.Detail)
				require.False(t, r.At.IsZero())
				require.False(t, r.Unanswered, "the provider answered")
			}
		})
	}
}

// SendTimeout checks that a provider whose service hangs gives up on every
// push after RequestTimeout, so that a hung provider does not hold a chunk,
// and says that the pushes went unanswered.
func (h *Harness[C, P]) SendTimeout(t *testing.T) {
	b := h.setup(t, Limits{RequestTimeout: 200 * time.Millisecond})
	require.NoError(t, b.P.Warm(context.Background()))
	ts := b.Targets(t, 3)
	b.Control(t, fmt.Sprintf(`{"channel":%q,"latency_ms":5000}`, h.Channel))
	start := time.Now()
	results := b.Send(Message(t, "msg_timeout", true), ts)
	require.Less(t, time.Since(start), 2*time.Second, "a hung provider does not hold the chunk")
	for _, r := range results {
		require.Equal(t, push.ReasonProviderUnavailable, r.Reason)
		require.Equal(t, "timeout", r.Detail, "the error's class: its text would quote the URL, a device token for APNs and Web Push")
		require.False(t, r.At.IsZero())
		require.True(t, r.Unanswered, "fakepush may have taken the push: the result must say so")
	}
}

// WarmOutlastsARequest checks that opening a provider's connections is not
// bounded by the timeout of one push: with a request timeout far shorter
// than a TLS handshake (and FCM's OAuth exchange), the warm-up still
// succeeds. Bounded by it, a warm-up on a busy machine failed.
func (h *Harness[C, P]) WarmOutlastsARequest(t *testing.T) {
	b := h.setup(t, Limits{RequestTimeout: time.Microsecond})
	require.NoError(t, b.P.Warm(context.Background()))
}

// WarmForOpensWhatTheSendUses checks that a warm-up for some targets, as an
// instant's warm-up makes it, opens the connections their send then goes
// out on: the send opens none of its own (fakepush counts the connections
// it accepts), and the warm-up is no push. For no targets it opens nothing.
func (h *Harness[C, P]) WarmForOpensWhatTheSendUses(t *testing.T) {
	b := h.Setup(t)
	ts := b.Targets(t, 3)
	before := b.Fakepush.Stats(t).Connections.Opened
	require.NoError(t, b.P.WarmFor(context.Background(), nil))
	require.Equal(t, before, b.Fakepush.Stats(t).Connections.Opened, "a warm-up for no targets opens nothing")

	require.NoError(t, b.P.WarmFor(context.Background(), ts))
	warmed := b.Fakepush.Stats(t).Connections.Opened
	require.Greater(t, warmed, before, "the warm-up opens the send's connections")
	st := b.Stats(t)
	require.Positive(t, st.Warmups)
	require.Zero(t, st.Received, "a warm-up is no push")

	b.SendAccepted(t, Message(t, "msg_warmed", false), ts)
	require.Equal(t, warmed, b.Fakepush.Stats(t).Connections.Opened, "connections the send opened after the warm-up")
}

// SendParked checks what every provider does when the circuit breaker
// refuses: nothing is attempted once allow has said no, and allow is not
// asked again.
func (h *Harness[C, P]) SendParked(t *testing.T) {
	t.Run("BreakerOpen", func(t *testing.T) {
		t.Parallel()
		b := h.Setup(t)
		ts := b.Targets(t, 4)
		results := make([]push.Result, len(ts))
		b.P.Send(context.Background(), Message(t, "msg_parked", true), ts, results, func() bool { return false }, nil)
		for _, r := range results {
			require.Equal(t, push.Result{Reason: push.ReasonProviderUnavailable, Detail: "parked: circuit breaker open"}, r)
		}
		require.Zero(t, b.Stats(t).Received)
	})

	t.Run("OpensMidway", func(t *testing.T) {
		t.Parallel()
		b := h.Setup(t)
		ts := b.Targets(t, 5)
		var asked atomic.Int32
		results := make([]push.Result, len(ts))
		b.P.Send(context.Background(), Message(t, "msg_midway", true), ts, results, func() bool { return asked.Add(1) <= 2 }, nil)
		require.True(t, results[0].Accepted)
		require.True(t, results[1].Accepted)
		for _, r := range results[2:] {
			require.True(t, r.At.IsZero(), "parked sends are not attempted")
			require.Equal(t, push.ReasonProviderUnavailable, r.Reason)
		}
		require.Equal(t, int32(3), asked.Load(), "allow is not asked again once it refused")
		require.Equal(t, int64(2), b.Stats(t).Received)
	})
}

// SendManyTargets checks that two Sends of 2000 targets at once share the
// Provider's in-flight limit of 16, run concurrently within it, deliver
// everything, and reuse their connections.
func (h *Harness[C, P]) SendManyTargets(t *testing.T) {
	const limit = 16
	b := h.setup(t, Limits{MaxInFlight: limit})
	b.Control(t, `{"channel":"`+h.Channel.String()+`","latency_ms":2}`)
	var now, peak, reused atomic.Int64
	ctx := httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{
		GotConn: func(info httptrace.GotConnInfo) {
			if info.Reused {
				reused.Add(1)
			}
			n := now.Add(1)
			for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
			}
		},
		GotFirstResponseByte: func() { now.Add(-1) },
	})
	m := Message(t, "msg_many", false)
	// Fifty live targets, each pushed to many times over: what matters is
	// the number of requests, and Web Push subscriptions are slow to mint.
	live := b.Targets(t, 50)
	ts := make([]push.Target, 2000)
	for i := range ts {
		ts[i] = live[i%len(live)]
	}

	// Two chunks at once share the Provider's limit.
	done := make(chan []push.Result, 2)
	for range 2 {
		go func() {
			results := make([]push.Result, len(ts))
			b.P.Send(ctx, m, ts, results, AllowAll, nil)
			done <- results
		}()
	}
	for range 2 {
		select {
		case results := <-done:
			for i, r := range results {
				require.True(t, r.Accepted, "target %d: %+v", i, r)
			}
		case <-time.After(60 * time.Second):
			t.Fatal("Send hung")
		}
	}
	require.LessOrEqual(t, peak.Load(), int64(limit))
	require.Greater(t, peak.Load(), int64(1), "requests ran concurrently")
	require.Equal(t, int64(2*len(ts)), b.Stats(t).Accepted)
	// HTTP/2 multiplexes the burst: at worst the first request of each slot
	// dialed, instead of one connection per request beyond two idle ones.
	require.GreaterOrEqual(t, reused.Load(), int64(2*len(ts)-limit))
}

// FirstSendReused reports, for each request of one Send to n targets,
// whether it ran on a connection that had been used before: after Warm, every
// one should have.
func FirstSendReused[C any, P Provider](t *testing.T, b *Bundle[C, P], n int) []bool {
	t.Helper()
	var mu sync.Mutex
	var reused []bool
	ctx := httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{
		GotConn: func(info httptrace.GotConnInfo) {
			mu.Lock()
			reused = append(reused, info.Reused)
			mu.Unlock()
		},
	})
	results := make([]push.Result, n)
	b.P.Send(ctx, Message(t, "msg_reused", true), b.Targets(t, n), results, AllowAll, nil)
	for _, r := range results {
		require.True(t, r.Accepted)
	}
	return reused
}
