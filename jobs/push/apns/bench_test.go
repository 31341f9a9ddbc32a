package apns

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

// BenchmarkSend measures Send as the chunk worker uses it: 500 targets a call,
// against fakepush in a child process answering after 20 ms. One operation is
// one Send of 500 pushes.
//
//	go test -run '^$' -bench . -benchtime 40x ./jobs/push/apns/
//
// Reported:
//
//	sends/s          pushes per second through Send
//	cli-cpu-us/send  this process's CPU per push: apns2, TLS and HTTP/2
func BenchmarkSend(b *testing.B) {
	child, err := fake.StartChild("TestFakepushChild", b.TempDir(), 1)
	require.NoError(b, err)
	b.Cleanup(func() { child.Stop() })
	bench := &bundle{client: child.HTTPClient(), url: child.Env[fake.EnvAPNsHost]}
	bench.control(b, `{"channel":"apns","latency_ms":20}`)

	m := message(b, "msg_1", false)
	ts := targets(hexTokens(500)...)
	results := make([]push.Result, len(ts))
	for _, inFlight := range []int{64, 200, DefaultMaxInFlight} {
		b.Run(fmt.Sprintf("inflight=%d", inFlight), func(b *testing.B) {
			cfg := configFromEnv(child.Env)
			cfg.RootCAs = child.CertPool()
			cfg.MaxInFlight = inFlight
			p, err := New(cfg)
			require.NoError(b, err)
			defer p.Close()
			require.NoError(b, p.Warm(context.Background()))

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
