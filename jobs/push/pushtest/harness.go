package pushtest

import (
	"context"
	"crypto/x509"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/heraldpush/herald/jobs/push"
	"github.com/heraldpush/herald/jobs/push/fake"
)

// Provider is what every provider package's New returns, as far as the
// shared tests use it.
type Provider interface {
	Send(ctx context.Context, m *push.Message, targets []push.Target, results []push.Result, allow func() bool, answered func(i int))
	Warm(ctx context.Context) error
	WarmFor(ctx context.Context, targets []push.Target) error
	Close()
}

// Harness describes one provider package to the shared tests and benchmarks:
// how its config is built from fakepush's variables, how a Provider is made,
// and what a target it can send to looks like. C is the package's Config and
// P its *Provider.
type Harness[C any, P Provider] struct {
	// Channel is the fakepush channel the provider sends to.
	Channel fake.Channel
	// Config is what cmd/ builds from the variables fakepush writes, with
	// roots as RootCAs and the limits given.
	Config func(env map[string]string, roots *x509.CertPool, limits Limits) C
	// New is the package's New.
	New func(C) (P, error)
	// Targets returns n live targets fakepush accepts pushes to.
	Targets func(t testing.TB, fp *Fakepush, n int) []push.Target
}

// Limits are the config fields every provider has that the shared scenarios
// and the benchmark vary. Zero means the provider's default.
type Limits struct {
	MaxInFlight    int
	RequestTimeout time.Duration
}

// Bundle is what most provider tests need: an in-process fakepush, the
// config pointed at it, and a Provider built from that config.
type Bundle[C any, P Provider] struct {
	*Fakepush
	// Cfg is the config P was built from, defaults not yet filled in.
	Cfg C
	// P is the Provider under test.
	P P
	h *Harness[C, P]
}

// Setup starts an in-process fakepush and a Provider configured for it, with
// configure applied to the config first. Both are closed when t ends.
func (h *Harness[C, P]) Setup(t testing.TB, configure ...func(*C)) *Bundle[C, P] {
	t.Helper()
	return h.setup(t, Limits{}, configure...)
}

// setup is Setup with limits.
func (h *Harness[C, P]) setup(t testing.TB, limits Limits, configure ...func(*C)) *Bundle[C, P] {
	t.Helper()
	fp := Start(t)
	cfg, p := h.NewProvider(t, fp, limits, configure...)
	return &Bundle[C, P]{Fakepush: fp, Cfg: cfg, P: p, h: h}
}

// NewProvider builds a Provider for fp with limits, with configure applied to
// the config first, and closes it when t ends.
func (h *Harness[C, P]) NewProvider(t testing.TB, fp *Fakepush, limits Limits, configure ...func(*C)) (C, P) {
	t.Helper()
	cfg := h.Config(fp.Env, fp.CertPool(), limits)
	for _, c := range configure {
		c(&cfg)
	}
	p, err := h.New(cfg)
	require.NoError(t, err)
	t.Cleanup(p.Close)
	return cfg, p
}

// Stats reads fakepush's counters of the provider's channel.
func (b *Bundle[C, P]) Stats(t testing.TB) fake.ChannelStats {
	t.Helper()
	st := b.Fakepush.Stats(t)
	switch b.h.Channel {
	case fake.APNs:
		return st.APNs
	case fake.FCM:
		return st.FCM
	}
	return st.WebPush
}

// Targets returns n live targets of the provider's kind.
func (b *Bundle[C, P]) Targets(t testing.TB, n int) []push.Target {
	t.Helper()
	return b.h.Targets(t, b.Fakepush, n)
}

// Send sends m to ts with the breaker always allowing, and returns the
// results.
func (b *Bundle[C, P]) Send(m *push.Message, ts []push.Target) []push.Result {
	results := make([]push.Result, len(ts))
	b.P.Send(context.Background(), m, ts, results, AllowAll, nil)
	return results
}

// SendAccepted sends m to ts, requires every push to be accepted with the
// time its answer came, and requires fakepush to have recorded each target
// once under m's collapse key. It returns the results.
func (b *Bundle[C, P]) SendAccepted(t testing.TB, m *push.Message, ts []push.Target) []push.Result {
	t.Helper()
	before := time.Now()
	results := b.Send(m, ts)
	after := time.Now()
	for i, r := range results {
		require.True(t, r.Accepted, "target %d: %+v", i, r)
		require.Equal(t, push.ReasonNone, r.Reason)
		require.WithinRange(t, r.At, before, after)
	}

	// fakepush finds each push's receipt by the herald_message_id it
	// carries, decrypting Web Push bodies to read it.
	receipts := b.Receipts(t, m.ID)
	require.Len(t, receipts, len(ts))
	var got, want []string
	for _, rc := range receipts {
		require.Equal(t, b.h.Channel.String(), rc.Channel)
		require.Equal(t, m.ID, rc.CollapseKey, "the message id collapses its pushes")
		got = append(got, rc.Token)
	}
	for _, tg := range ts {
		want = append(want, tg.Token)
	}
	require.ElementsMatch(t, want, got)
	return results
}

// AllowAll is a circuit breaker that is always closed.
func AllowAll() bool { return true }

// Message is the message the provider tests send: urgent or not, with data,
// expiring in an hour.
func Message(t testing.TB, id string, urgent bool) *push.Message {
	t.Helper()
	m, err := push.NewMessage(id, urgent, push.Content{Title: "Reminder", Body: "Your appointment is at 09:00", Data: map[string]string{"kind": "appointment"}},
		time.Now().Add(time.Hour))
	require.NoError(t, err)
	return m
}

// Tokens returns n distinct tokens, the i-th formatted from i+1 with format
// (such as "%064x" for APNs).
func Tokens(format string, n int) []string {
	tokens := make([]string, n)
	for i := range tokens {
		tokens[i] = fmt.Sprintf(format, i+1)
	}
	return tokens
}

// TokenTargets returns a Harness.Targets for providers whose targets are
// bare tokens: n distinct ones, formatted as Tokens does.
func TokenTargets(format string) func(testing.TB, *Fakepush, int) []push.Target {
	return func(_ testing.TB, _ *Fakepush, n int) []push.Target { return Targets(Tokens(format, n)...) }
}

// Subscriptions is the Harness.Targets of Web Push: n live subscriptions
// minted by fp.
func Subscriptions(t testing.TB, fp *Fakepush, n int) []push.Target {
	t.Helper()
	return fp.Subscribe(t, n, false)
}

// Targets returns one target per token, with device ids from 1.
func Targets(tokens ...string) []push.Target {
	ts := make([]push.Target, len(tokens))
	for i, tok := range tokens {
		ts[i] = push.Target{DeviceID: int64(i + 1), Token: tok}
	}
	return ts
}
