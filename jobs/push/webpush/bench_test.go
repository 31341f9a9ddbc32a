package webpush

import (
	"context"
	"flag"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/heraldpush/herald/jobs/push"
	"github.com/heraldpush/herald/jobs/push/fake"
)

// BenchmarkSend measures Send as the chunk worker uses it: 500 subscriptions
// a call, against fakepush in a child process answering after 20 ms and
// decrypting one push in 100 (as `herald bench` runs it; decrypting is
// fakepush's CPU, which shares the machine). One operation is one Send of 500
// pushes. record=4096 pads every push as webpush-go does by default.
//
//	go test -run '^$' -bench . -benchtime 20x ./jobs/push/webpush/
//
// Reported:
//
//	sends/s          pushes per second through Send
//	cli-cpu-us/send  this process's CPU per push: ECDH, VAPID, encryption, TLS
//	body-bytes/send  bytes of encrypted body per push
func BenchmarkSend(b *testing.B) {
	child, err := fake.StartChild("TestFakepushChild", b.TempDir(), 100)
	require.NoError(b, err)
	b.Cleanup(func() { child.Stop() })
	bench := &bundle{client: child.HTTPClient(), url: child.Env[fake.EnvAPNsHost]}
	bench.control(b, `{"channel":"webpush","latency_ms":20}`)

	m := message(b, "msg_1", false)
	ts := bench.subscribe(b, 500, false)
	results := make([]push.Result, len(ts))
	for _, tc := range []struct {
		inFlight int
		padded   bool
	}{{DefaultMaxInFlight, false}, {DefaultMaxInFlight, true}, {64, false}, {500, false}} {
		record := "exact"
		if tc.padded {
			record = "4096"
		}
		b.Run(fmt.Sprintf("record=%s/inflight=%d", record, tc.inFlight), func(b *testing.B) {
			cfg := configFromEnv(child.Env)
			cfg.RootCAs = child.CertPool()
			cfg.MaxInFlight = tc.inFlight
			p, err := New(cfg)
			require.NoError(b, err)
			defer p.Close()
			p.padRecords = tc.padded
			// Connections, and fakepush's cache of each subscription's keys,
			// outside the measurement.
			p.Send(context.Background(), m, ts, results, allowAll)

			cpu0 := fake.ProcessCPU()
			start := time.Now()
			b.ResetTimer()
			for b.Loop() {
				p.Send(context.Background(), m, ts, results, allowAll)
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
			body := len(m.WebPush) + recordOverhead
			if tc.padded {
				body = 4096
			}
			b.ReportMetric(float64(body), "body-bytes/send")
		})
	}
}

// TestFakepushChild is the benchmark's fakepush; it does nothing unless
// started by fake.StartChild.
func TestFakepushChild(t *testing.T) {
	child, err := fake.ServeChild(flag.Args())
	if !child {
		t.Skip("runs only as the benchmark's child process")
	}
	require.NoError(t, err)
}
