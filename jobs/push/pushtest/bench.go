package pushtest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/heraldpush/herald/jobs/push"
	"github.com/heraldpush/herald/jobs/push/fake"
)

// StartBenchFakepush starts the benchmarks' fakepush in a child process,
// answering channel's pushes after 20 ms, about a provider's round trip from
// a data centre. decryptOneIn is fake.Config.DecryptOneIn.
func StartBenchFakepush(b *testing.B, channel fake.Channel, decryptOneIn int) *Fakepush {
	b.Helper()
	fp := StartChild(b, decryptOneIn)
	fp.Control(b, fmt.Sprintf(`{"channel":%q,"latency_ms":20}`, channel))
	return fp
}

// BenchmarkSend measures Send as the chunk worker uses it: 500 targets a
// call, against fakepush in a child process answering after 20 ms, once for
// each in-flight limit. One operation is one Send of 500 pushes.
func (h *Harness[C, P]) BenchmarkSend(b *testing.B, inFlights ...int) {
	fp := StartBenchFakepush(b, h.Channel, 1)
	m := Message(b, "msg_1", false)
	ts := h.Targets(b, fp, 500)
	for _, inFlight := range inFlights {
		b.Run(fmt.Sprintf("inflight=%d", inFlight), func(b *testing.B) {
			_, p := h.NewProvider(b, fp, Limits{MaxInFlight: inFlight})
			require.NoError(b, p.Warm(context.Background()))
			MeasureSend(b, p, m, ts)
		})
	}
}

// BenchmarkPayloads measures Send as BenchmarkSend does, at one in-flight
// limit, for the plain message and for one with every payload field
// (RichContent), so that what the rich fields cost per push shows apart.
func (h *Harness[C, P]) BenchmarkPayloads(b *testing.B, inFlight int) {
	fp := StartBenchFakepush(b, h.Channel, 1)
	ts := h.Targets(b, fp, 500)
	for name, m := range map[string]*push.Message{
		"plain": Message(b, "msg_1", false),
		"rich":  NewContentMessage(b, "msg_2", RichContent(), time.Hour),
	} {
		b.Run("payload="+name, func(b *testing.B) {
			_, p := h.NewProvider(b, fp, Limits{MaxInFlight: inFlight})
			require.NoError(b, p.Warm(context.Background()))
			MeasureSend(b, p, m, ts)
		})
	}
}

// BenchmarkReceipts measures Send as BenchmarkSend does, at one in-flight
// limit, with receipts off and on: on, every Send's targets are signed
// first (push.SignReceipts) and each push carries its token, so that what
// a token costs a push shows apart, signing and splicing included.
func (h *Harness[C, P]) BenchmarkReceipts(b *testing.B, inFlight int) {
	fp := StartBenchFakepush(b, h.Channel, 1)
	m := Message(b, push.FormatMessageID(1), false)
	signer := NewSigner(b)
	for _, on := range []bool{false, true} {
		b.Run(fmt.Sprintf("receipts=%t", on), func(b *testing.B) {
			ts := h.Targets(b, fp, 500)
			_, p := h.NewProvider(b, fp, Limits{MaxInFlight: inFlight})
			require.NoError(b, p.Warm(context.Background()))
			var sign func([]push.Target)
			if on {
				sign = func(ts []push.Target) { push.SignReceipts(signer, 1, time.Now().Add(time.Hour), ts) }
			}
			measureSend(b, p, m, ts, sign)
		})
	}
}

// MeasureSend runs b's loop of one Send of m to ts each, failing on any
// push not accepted, and reports:
//
//	sends/s          pushes per second through Send
//	cli-cpu-us/send  this process's CPU per push; fakepush's runs elsewhere
func MeasureSend(b *testing.B, p Provider, m *push.Message, ts []push.Target) {
	measureSend(b, p, m, ts, nil)
}

// measureSend is MeasureSend with sign, when set, run on the targets
// before every Send, as the chunk worker signs each slice's receipts.
func measureSend(b *testing.B, p Provider, m *push.Message, ts []push.Target, sign func([]push.Target)) {
	results := make([]push.Result, len(ts))
	cpu0 := fake.ProcessCPU()
	start := time.Now()
	b.ResetTimer()
	for b.Loop() {
		if sign != nil {
			sign(ts)
		}
		p.Send(context.Background(), m, ts, results, AllowAll, nil)
		for _, r := range results {
			if !r.Accepted {
				b.Fatalf("not accepted: %+v", r)
			}
		}
	}
	b.StopTimer()
	sends := float64(b.N * len(ts))
	b.ReportMetric(sends/time.Since(start).Seconds(), "sends/s")
	b.ReportMetric(float64(fake.ProcessCPU()-cpu0)/float64(time.Microsecond)/sends, "cli-cpu-us/send")
}
