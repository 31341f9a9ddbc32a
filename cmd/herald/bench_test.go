package main

import (
	"context"
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/heraldpush/herald/cmd/herald/heraldbench"
	"github.com/heraldpush/herald/db/dbtest"
)

// TestE2EBench runs herald bench as make bench does, at a small size:
// its own fakepush and Herald processes, the population through the API,
// an earlier round of messages, the measured messages, the blast, and the
// JSON with every figure filled in. The figures' values are the
// benchmark's business; here they must exist and agree with each other.
func TestE2EBench(t *testing.T) {
	t.Parallel()
	// Two bulk messages at the instant (--messages 2), after one earlier
	// round (--before 1), with fakepush playing the devices (--receipts).
	t.Run("one process", func(t *testing.T) { testBench(t, false) })
	// The urgent lane in a worker of its own (--urgent-worker), with the
	// rich payload (--payload rich), one bulk message and no earlier one,
	// a fifth of the devices throttled (--throttled 20), every provider
	// connection closed before the instant's warm-up (--drop-connections
	// 3s), and the population written to the database directly
	// (--populate db): every device it made must be sent to, once.
	t.Run("urgent worker", func(t *testing.T) { testBench(t, true) })
	t.Run("preferences", testBenchPreferences)
}

// testBenchPreferences runs herald bench --preferences on a small
// population: what its messages withheld is what the users' rules say, and
// the CPU is given apart for the pushes sent at the instant and those held
// to the end of quiet hours. Its instant is the next one three seconds
// before a whole minute, so it takes up to a minute more than the others.
func testBenchPreferences(t *testing.T) {
	t.Parallel()
	res, raw, _ := benchOnTestCluster(t, heraldbench.Config{
		Users: 60, Mix: [3]float64{0.45, 0.45, 0.10}, Latency: 5 * time.Millisecond, Ahead: 4 * time.Second,
		Seed: 3, DecryptOneIn: 1, Payload: "plain", Messages: 1, Before: 1, Populate: "api", Preferences: true,
	}, 4*time.Minute)

	w := res.Preferences
	require.NotNil(t, w)
	require.Positive(t, w.WantOptedOut)
	require.Positive(t, w.WantHeld)
	require.Positive(t, w.WantCapped)
	require.Equal(t, [3]int{w.WantOptedOut, w.WantHeld, w.WantCapped}, [3]int{w.OptedOut, w.Held, w.Capped}, "withheld as the rules say")
	require.Equal(t, res.Devices-w.OptedOut-w.Capped, res.Accepted, "every device neither opted out nor capped accepted, the held ones too")
	require.Zero(t, res.Duplicates)
	require.Positive(t, w.CPUPerDevice)
	require.NotNil(t, w.FirstCPUPerPush, "the test cluster runs on this host")
	require.Positive(t, *w.FirstCPUPerPush)
	require.NotNil(t, w.ReleaseCPUPerPush)
	require.Positive(t, *w.ReleaseCPUPerPush)
	require.Contains(t, string(raw), `"release_cpu_us_per_push":`)
}

func testBench(t *testing.T, urgentWorker bool) {
	t.Parallel()
	res, raw, b := benchOnTestCluster(t, heraldbench.Config{
		Users: 40, Mix: [3]float64{0.45, 0.45, 0.10}, Latency: 5 * time.Millisecond, Ahead: 4 * time.Second,
		Seed: 7, DecryptOneIn: 1, UrgentWorker: urgentWorker, Payload: map[bool]string{false: "plain", true: "rich"}[urgentWorker],
		// Two history messages, one of them partial.
		History:         30_000,
		Messages:        map[bool]int{false: 2, true: 1}[urgentWorker],
		Before:          map[bool]int{false: 1, true: 0}[urgentWorker],
		Throttled:       map[bool]float64{false: 0, true: 0.2}[urgentWorker],
		Receipts:        !urgentWorker,
		DropConnections: map[bool]time.Duration{false: 0, true: 3 * time.Second}[urgentWorker],
		Populate:        map[bool]string{false: "api", true: "db"}[urgentWorker],
	}, 3*time.Minute)
	messages := map[bool]int{false: 2, true: 1}[urgentWorker]
	require.Greater(t, res.Devices, 40*messages, "every user has at least one device, and the urgent user is extra")
	require.Equal(t, res.Devices, res.Accepted, "every device accepted")
	require.Zero(t, res.Duplicates)
	require.GreaterOrEqual(t, res.ChunkCount, 1)
	require.Positive(t, res.SkewMs.Max)
	require.LessOrEqual(t, res.SkewMs.P50, res.SkewMs.Max)
	require.Positive(t, res.ReceiptSkewMs.Max)
	require.Positive(t, res.UrgentSkewMs)
	require.GreaterOrEqual(t, res.UrgentReceiptMs, res.UrgentPickupMs, "the push reaches fakepush after its chunk starts")
	require.Positive(t, res.BlastMs)
	require.Positive(t, res.CPUPerSend)
	require.Positive(t, res.BlastCPUPerSnd)
	require.Positive(t, res.PeakRSSMb)
	require.NotNil(t, res.PostgresCPUPerSend, "the test cluster runs on this host")
	require.Positive(t, *res.PostgresCPUPerSend)
	require.Positive(t, res.Breakdown.LastAcceptMs.Max)
	require.GreaterOrEqual(t, res.Probe.ProviderMs.P50, 5.0, "a probe push waits fakepush's round trip")
	require.Positive(t, res.Probe.DatabaseMs.Max)
	require.Equal(t, urgentWorker, res.UrgentWorker)
	require.Equal(t, 30_000, res.HistoryRows, "the history is in the ledger")
	require.Equal(t, map[bool]int{false: 1, true: 2}[urgentWorker], b.Heralds())

	// The healthy devices' figures, and the throttled ones': each
	// throttled device was answered 429 once and resent no sooner than its
	// Retry-After, and no breaker counted a failure, so none opened.
	th := res.Throttled
	require.NotNil(t, th)
	require.Positive(t, th.HealthyFanoutMs)
	require.Positive(t, th.HealthyFanoutBlast)
	require.LessOrEqual(t, th.HealthySkewMs.Max, res.ReceiptSkewMs.Max)
	if urgentWorker {
		require.Positive(t, th.Devices, "a fifth of some hundred devices")
		require.GreaterOrEqual(t, th.Answered429, int64(th.Devices))
		require.Zero(t, th.Early, "no throttled device was sent to before its Retry-After")
	} else {
		require.Zero(t, th.Devices)
	}
	for ch, n := range th.BreakerFailures {
		require.Zero(t, n, "%s's breaker counted failures", ch)
	}

	// The devices fakepush played: nine in ten drew a delivered receipt
	// and one in ten an opened one (the pushes carried their tokens), the
	// earlier round's counted apart; every one was posted to Herald and
	// answered once the run waited for them, and what Herald recorded came
	// after the acceptance it confirms.
	if r := res.Receipts; !urgentWorker {
		require.NotNil(t, r)
		require.Positive(t, r.Devices.Scheduled, "the pushes carried receipt tokens")
		require.InDelta(t, 1.1*float64(res.Devices), float64(r.Devices.Scheduled), 0.3*float64(res.Devices), "about 90%% delivered and 10%% opened receipts")
		require.Zero(t, r.Devices.Waiting)
		require.Equal(t, r.Devices.Scheduled, r.Devices.Posted, "every receipt posted to Herald and taken, none refused or lost: %+v", r.Devices)
		require.InDelta(t, 0.9*float64(res.Devices), float64(r.ConfirmedCount), 0.2*float64(res.Devices), "about nine in ten deliveries confirmed")
		require.Positive(t, r.OpenedCount)
		require.GreaterOrEqual(t, r.ConfirmedSkewMs.P50, res.SkewMs.P50, "a delivery is confirmed after it was accepted")
	} else {
		require.Nil(t, r)
	}

	// Each channel's first push. With every provider connection closed
	// 3 s ahead, before the instant's warm-up (2 s ahead), the warm-ups
	// opened them again, in each Herald process and lane.
	for _, ch := range []string{"apns", "fcm", "webpush"} {
		require.Contains(t, res.FirstPushMs, ch)
		require.Positive(t, res.FirstPushMs[ch], ch)
	}
	if c := res.Connections; urgentWorker {
		require.NotNil(t, c)
		require.Positive(t, c.Closed)
		require.InDelta(t, 3000, c.DroppedBeforeMs, 500)
		require.Positive(t, c.OpenedBeforeInstant, "the instant's warm-ups opened connections")
	} else {
		require.Nil(t, c)
	}

	// Many messages at one instant: each one's first and last device.
	require.Equal(t, messages, res.Messages)
	require.Len(t, res.FirstSkewMs, messages)
	require.Len(t, res.LastSkewMs, messages)
	for i := range messages {
		require.Positive(t, res.FirstSkewMs[i], "message %d", i)
		require.GreaterOrEqual(t, res.LastSkewMs[i], res.FirstSkewMs[i], "message %d", i)
		require.LessOrEqual(t, res.FirstSkewMs[i], res.FirstSkewMaxMs)
		require.LessOrEqual(t, res.LastSkewMs[i], res.LastSkewMaxMs)
	}
	require.Equal(t, res.SkewMs.Max, res.LastSkewMaxMs, "the last device of all is some message's last")
	require.Equal(t, max(res.SkewMs.Max, res.UrgentSkewMs), res.SkewMaxAllMs)

	// PostgreSQL's share over the messages' whole life, on a ledger that
	// holds the earlier round's (--before).
	require.Equal(t, map[bool]int{false: 1, true: 0}[urgentWorker], res.Before)
	require.GreaterOrEqual(t, res.StatusReads, int64(messages+1), "every message's status is read until it settles")
	p := res.PostgresShare
	require.NotNil(t, p, "the test cluster runs on this host")
	for name, v := range map[string]float64{"schedule": p.Schedule, "wait": p.Wait, "fanout": p.Fanout,
		"status_reads": p.StatusReads, "cleanup": p.Cleanup} {
		require.Positive(t, v, name)
	}
	require.InDelta(t, p.Total, p.Schedule+p.Wait+p.Fanout+p.StatusReads+p.Cleanup, 0.5, "the parts add up to the whole")
	require.Less(t, *res.PostgresCPUPerSend, p.Total, "the whole life is more than scheduling and the fan-out")
	require.InDelta(t, *res.PostgresCPUPerSend, p.Schedule+p.Fanout, 0.2, "postgres_cpu_us_per_send is scheduling and the fan-out")
	for _, field := range []string{`"messages"`, `"first_skew_ms"`, `"first_skew_max_ms"`, `"last_skew_ms"`, `"last_skew_max_ms"`,
		`"skew_max_all_ms"`, `"before"`, `"status_reads"`, `"postgres_cpu_us_per_device"`, `"cleanup"`, `"total"`} {
		require.Contains(t, string(raw), field+":")
	}
}

// benchOnTestCluster runs herald bench with cfg against the test cluster, its
// processes the test binary's own, and returns its result, as JSON too
// (logged), and the benchmark, whose processes the test's cleanup ends.
func benchOnTestCluster(t *testing.T, cfg heraldbench.Config, timeout time.Duration) (*heraldbench.Result, []byte, *heraldbench.Benchmark) {
	admin := dbtest.AdminURL(t)
	var progress strings.Builder
	b := &heraldbench.Benchmark{
		Config:    cfg,
		Getenv:    func(k string) string { return map[string]string{"PATH": os.Getenv("PATH")}[k] },
		Progress:  func(format string, a ...any) { progress.WriteString(strings.TrimSpace(format) + "\n") },
		Stderr:    os.Stderr,
		ChildEnv:  []string{childEnv + "=1"},
		Providers: benchProviders,
	}
	t.Cleanup(b.Cleanup)
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	res, err := b.Run(ctx, admin)
	require.NoError(t, err, "progress:\n%s", progress.String())
	raw, err := json.Marshal(res)
	require.NoError(t, err)
	t.Logf("%s", raw)
	return res, raw, b
}

// TestE2ESoakShort runs herald soak for a few seconds: its own fakepush and
// Herald, steady traffic, and the tables' sizes read as it goes. The
// plateau itself takes minutes (docs/performance.md, Retention).
func TestE2ESoakShort(t *testing.T) {
	t.Parallel()
	b := &heraldbench.Benchmark{
		Config:   heraldbench.Config{Users: 20, Mix: [3]float64{45, 45, 10}, Latency: 5 * time.Millisecond, Seed: 7, DecryptOneIn: 1},
		Getenv:   func(k string) string { return map[string]string{"PATH": os.Getenv("PATH")}[k] },
		Progress: func(string, ...any) {},
		Stderr:   os.Stderr,
		ChildEnv: []string{childEnv + "=1", "HERALD_RETENTION=1m"},
	}
	t.Cleanup(b.Cleanup)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	samples, err := b.Soak(ctx, dbtest.AdminURL(t), heraldbench.SoakConfig{
		Duration: 3 * time.Second, Every: 200 * time.Millisecond, Sample: time.Second, Retention: time.Minute,
	})
	require.NoError(t, err)
	require.GreaterOrEqual(t, len(samples), 3, "one at the start, one a second, one at the end")
	first, last := samples[0], samples[len(samples)-1]
	require.Zero(t, first.Messages)
	// Every 200 ms for 3 s, fewer on a busy machine (a tick that finds
	// the last message still being scheduled is skipped).
	require.GreaterOrEqual(t, last.Messages, 2)
	require.Greater(t, last.Tables["accepted_runs"].HeapBytes, first.Tables["accepted_runs"].HeapBytes, "the ledger grew")
	require.Contains(t, heraldbench.SoakTable(samples), "| accepted_runs |")
}
