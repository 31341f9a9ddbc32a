package fake

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"firebase.google.com/go/v4/messaging"
	webpush "github.com/SherClockHolmes/webpush-go"
	"github.com/sideshow/apns2"
	"github.com/stretchr/testify/require"
)

// The benchmarks drive a fakepush running in a child process (this test binary,
// re-executed) with the real SDK clients from many goroutines. Keeping the two
// apart gives each side its own CPU account: the client's is this process's
// rusage, the server's is what it reports in /_stats (its own rusage since the
// last /_reset). Both still share the machine's cores, as Herald and fakepush do
// during `herald bench`.
//
//	go test -run '^$' -bench . -benchtime 5s ./jobs/push/fake/
//
// Reported per operation (one push):
//
//	req/s            pushes per second through the SDK
//	srv-cpu-us/req   fakepush CPU per push (user + system)
//	cli-cpu-us/send  SDK-side CPU per push, including TLS and HTTP/2 framing

const benchParallelism = 32 // goroutines per GOMAXPROCS: 64 sends in flight on 2 cores

func BenchmarkAPNs(b *testing.B) {
	fp := startChildFakepush(b, 1)
	client := fp.apnsClient(b)
	tokens := benchTokens(10_000)
	topic := fp.env[EnvAPNsTopic]
	for _, latency := range []int{0, 20} {
		b.Run(fmt.Sprintf("latency=%dms", latency), func(b *testing.B) {
			var i atomic.Int64
			fp.measure(b, latency, func() error {
				n := i.Add(1)
				res, err := client.Push(&apns2.Notification{
					DeviceToken: tokens[n%int64(len(tokens))],
					Topic:       topic,
					CollapseID:  "bench_msg_1",
					Priority:    apns2.PriorityHigh,
					PushType:    apns2.PushTypeAlert,
					Payload:     []byte(`{"aps":{"alert":{"title":"Reminder","body":"Your appointment is at 09:00"}},"herald_message_id":"bench_msg_1"}`),
				})
				if err == nil && res.StatusCode != http.StatusOK {
					err = fmt.Errorf("APNs answered %d %s", res.StatusCode, res.Reason)
				}
				return err
			})
		})
	}
}

func BenchmarkFCM(b *testing.B) {
	fp := startChildFakepush(b, 1)
	client := fp.fcmClient(b, "")
	tokens := benchTokens(10_000)
	ttl := 10 * time.Minute
	for _, latency := range []int{0, 20} {
		b.Run(fmt.Sprintf("latency=%dms", latency), func(b *testing.B) {
			var i atomic.Int64
			fp.measure(b, latency, func() error {
				n := i.Add(1)
				_, err := client.Send(context.Background(), &messaging.Message{
					Token:        "fcm:" + tokens[n%int64(len(tokens))],
					Data:         map[string]string{"herald_message_id": "bench_msg_1"},
					Notification: &messaging.Notification{Title: "Reminder", Body: "Your appointment is at 09:00"},
					Android:      &messaging.AndroidConfig{CollapseKey: "bench_msg_1", Priority: "high", TTL: &ttl},
				})
				return err
			})
		})
	}
}

func BenchmarkWebPush(b *testing.B) {
	for _, decryptOneIn := range []int{1, 100} {
		fp := startChildFakepush(b, decryptOneIn)
		subs := make([]*webpush.Subscription, 1000)
		for i := range subs {
			subs[i] = fp.subscribe(b, false)
		}
		opts := fp.webpushOptions()
		opts.Topic = "bench_msg_1"
		for _, latency := range []int{0, 20} {
			b.Run(fmt.Sprintf("decrypt=1in%d/latency=%dms", decryptOneIn, latency), func(b *testing.B) {
				var i atomic.Int64
				fp.measure(b, latency, func() error {
					n := i.Add(1)
					resp, err := webpush.SendNotificationWithContext(context.Background(),
						[]byte(`{"title":"Reminder","body":"Your appointment is at 09:00","herald_message_id":"bench_msg_1"}`),
						subs[n%int64(len(subs))], opts)
					if err != nil {
						return err
					}
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if resp.StatusCode != http.StatusCreated {
						return fmt.Errorf("push service answered %d", resp.StatusCode)
					}
					return nil
				})
			})
		}
	}
}

// measure runs send b.N times from parallel goroutines after resetting the
// server's counters and CPU baseline, then reports throughput and both sides'
// CPU per push.
func (fp *bundle) measure(b *testing.B, latencyMS int, send func() error) {
	for _, ch := range []string{"apns", "fcm", "webpush"} {
		code, body := fp.postJSON(b, "/_control", fmt.Sprintf(`{"channel":%q,"latency_ms":%d}`, ch, latencyMS))
		require.Equal(b, http.StatusOK, code, body)
	}
	require.NoError(b, send(), "warm-up send") // connections and tokens outside the measurement
	code, _ := fp.postJSON(b, "/_reset", "")
	require.Equal(b, http.StatusNoContent, code)
	for _, ch := range []string{"apns", "fcm", "webpush"} {
		fp.postJSON(b, "/_control", fmt.Sprintf(`{"channel":%q,"latency_ms":%d}`, ch, latencyMS))
	}

	var failures atomic.Int64
	var firstErr atomic.Value
	b.SetParallelism(benchParallelism)
	cpu0 := processCPU()
	b.ResetTimer()
	start := time.Now()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if err := send(); err != nil {
				failures.Add(1)
				firstErr.CompareAndSwap(nil, err)
			}
		}
	})
	elapsed := time.Since(start)
	cpu := processCPU() - cpu0
	b.StopTimer()
	require.Zero(b, failures.Load(), "first error: %v", firstErr.Load())

	st := fp.stats(b)
	accepted := st.APNs.Accepted + st.FCM.Accepted + st.WebPush.Accepted
	require.Equal(b, int64(b.N), accepted, "every push was accepted exactly once")
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "req/s")
	b.ReportMetric(float64(st.Process.CPUMicros)/float64(b.N), "srv-cpu-us/req")
	b.ReportMetric(float64(cpu)/1e3/float64(b.N), "cli-cpu-us/send")
}

func benchTokens(n int) []string {
	tokens := make([]string, n)
	for i := range tokens {
		tokens[i] = fmt.Sprintf("%064x", i*7919)
	}
	return tokens
}

// startChildFakepush runs fakepush in a child process with a fresh directory and
// returns a bundle built from the DIR/env it writes.
func startChildFakepush(b *testing.B, decryptOneIn int) *bundle {
	b.Helper()
	child, err := StartChild("TestFakepushChildProcess", b.TempDir(), decryptOneIn)
	require.NoError(b, err)
	b.Cleanup(func() {
		if err := child.Stop(); err != nil {
			b.Logf("stop the fakepush child: %v", err)
		}
	})
	return bundleFromEnv(b, child.Env)
}

// TestFakepushChildProcess is the server half of the benchmarks; it does nothing
// unless started by startChildFakepush.
func TestFakepushChildProcess(t *testing.T) {
	child, err := ServeChild(flag.Args())
	if !child {
		t.Skip("runs only as the benchmarks' child process")
	}
	require.NoError(t, err)
}
