package webpush

import (
	"context"
	"fmt"
	"testing"

	"github.com/heraldpush/herald/jobs/push"
	"github.com/heraldpush/herald/jobs/push/fake"
	"github.com/heraldpush/herald/jobs/push/pushtest"
)

// BenchmarkSend measures Send as pushtest.MeasureSend describes: 500
// subscriptions a call, against fakepush in a child process answering after
// 20 ms and decrypting one push in 100 (as `herald bench` runs it; decrypting
// is fakepush's CPU, which shares the machine). The client's CPU per push is
// ECDH, VAPID, encryption and TLS. record=4096 pads every push as webpush-go
// does by default; body-bytes/send reports the encrypted body per push.
//
//	go test -run '^$' -bench . -benchtime 20x ./jobs/push/webpush/
func BenchmarkSend(b *testing.B) {
	h := harness()
	fp := pushtest.StartBenchFakepush(b, fake.WebPush, 100)
	m := pushtest.Message(b, "msg_1", false)
	ts := fp.Subscribe(b, 500, false)
	for _, tc := range []struct {
		inFlight int
		padded   bool
	}{{DefaultMaxInFlight, false}, {DefaultMaxInFlight, true}, {64, false}, {500, false}} {
		record, body := "exact", len(m.WebPush)+recordOverhead
		if tc.padded {
			record, body = "4096", 4096
		}
		b.Run(fmt.Sprintf("record=%s/inflight=%d", record, tc.inFlight), func(b *testing.B) {
			_, p := h.NewProvider(b, fp, pushtest.Limits{MaxInFlight: tc.inFlight})
			p.padRecords = tc.padded
			// Connections, and fakepush's cache of each subscription's keys,
			// outside the measurement.
			p.Send(context.Background(), m, ts, make([]push.Result, len(ts)), pushtest.AllowAll, nil)
			pushtest.MeasureSend(b, p, m, ts)
			b.ReportMetric(float64(body), "body-bytes/send")
		})
	}
}

// BenchmarkPayloads compares the plain and the rich payload's cost per
// push (pushtest.Harness.BenchmarkPayloads).
//
//	go test -run '^$' -bench Payloads -benchtime 40x ./jobs/push/webpush/
func BenchmarkPayloads(b *testing.B) {
	harness().BenchmarkPayloads(b, DefaultMaxInFlight)
}

// BenchmarkReceipts compares a push's cost without and with its receipt
// token (pushtest.Harness.BenchmarkReceipts).
//
//	go test -run '^$' -bench Receipts -benchtime 40x ./jobs/push/webpush/
func BenchmarkReceipts(b *testing.B) {
	harness().BenchmarkReceipts(b, DefaultMaxInFlight)
}

// TestFakepushChild is the benchmark's fakepush; it does nothing unless
// started by pushtest.StartChild.
func TestFakepushChild(t *testing.T) { pushtest.ServeChild(t) }
