package heraldbench

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/heraldpush/herald/db"
	"github.com/heraldpush/herald/jobs"
	"github.com/heraldpush/herald/jobs/push"
)

// Benchmark is one run of the dispatch benchmark: what it runs, and its
// state while it runs.
type Benchmark struct {
	Config Config
	// Getenv is the benchmark's environment: the tuning it passes on to
	// Herald (benchTuning) and PATH.
	Getenv func(string) string
	// Progress reports what the run is doing, a line at a time.
	Progress func(string, ...any)
	// Stderr takes the child processes' standard error.
	Stderr io.Writer
	// ChildEnv is added to the environment of the processes the benchmark
	// starts (its tests use it to have the test binary run as herald).
	ChildEnv []string
	// Providers builds the provider clients the probe and the blast send
	// through, as a Herald worker builds them.
	Providers Providers

	cleanups []func()
	fakeEnv  map[string]string
	fakeURL  string
	fakeHTTP *http.Client
	herald   *exec.Cmd
	base     string
	// heralds are every Herald process of the run: herald, and the urgent
	// lane's worker with --urgent-worker.
	heralds []heraldProcess
	apiKey  string
}

// Providers builds the provider clients a Herald worker of lane would
// build from getenv's configuration, by channel; closeAll releases them.
// Herald's command provides it, so that the benchmark sends through exactly
// what Herald sends through.
type Providers func(ctx context.Context, getenv func(string) string, lane string) (byChannel map[string]jobs.Sender, closeAll func(), err error)

// Heralds is how many Herald processes the run started: two with
// UrgentWorker, one otherwise.
func (b *Benchmark) Heralds() int { return len(b.heralds) }

// Cleanup stops the processes the run started and removes what it made.
func (b *Benchmark) Cleanup() {
	for _, c := range slices.Backward(b.cleanups) {
		c()
	}
}

// Run runs the benchmark on a fresh database on the server of admin (a
// connection string) and returns its figures. Call Cleanup afterwards.
func (b *Benchmark) Run(ctx context.Context, admin string) (*Result, error) {
	res := &Result{Users: b.Config.Users, LatencyMs: float64(b.Config.Latency.Microseconds()) / 1000, Machine: machine(),
		UrgentWorker: b.Config.UrgentWorker}
	dbURL, err := b.freshDatabase(ctx, admin)
	if err != nil {
		return nil, err
	}
	if err := b.startFakepush(ctx); err != nil {
		return nil, err
	}
	if err := b.startHerald(ctx, dbURL); err != nil {
		return nil, err
	}
	res.Tuning = map[string]string{}
	for _, k := range benchTuning {
		if v := b.Getenv(k); v != "" {
			res.Tuning[k] = v
		}
	}

	devices, err := b.populate(ctx)
	if err != nil {
		return nil, err
	}
	res.Devices = devices

	pool, err := db.Open(ctx, dbURL, db.PoolConfig{MaxConns: 2})
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	// Let Herald settle after the population (autovacuum, pools) and give
	// the planner statistics, as a production database has.
	if err := db.On(pool).Analyze(ctx); err != nil {
		return nil, fmt.Errorf("analyze: %w", err)
	}

	cpuBefore, err := b.heraldCPU()
	if err != nil {
		return nil, err
	}
	// PostgreSQL's CPU over the same spans as Herald's, when the cluster
	// is a process of this host.
	pgCPU, pgLocal := clusterCPU(ctx, pool)
	var pgSpans [4]time.Duration
	readPG := func(i int) error {
		if !pgLocal {
			return nil
		}
		var err error
		pgSpans[i], err = pgCPU()
		return err
	}
	if err := readPG(0); err != nil {
		return nil, err
	}
	dispatchAt := time.Now().Add(b.Config.Ahead).Truncate(time.Millisecond)
	b.Progress("scheduling the bulk message to %d devices and the urgent one for %s", devices, dispatchAt.Format(time.RFC3339Nano))
	start := time.Now()
	bulk, err := b.api(http.MethodPost, "/v1/messages", map[string]any{
		"dispatch_at": dispatchAt.Format(time.RFC3339Nano), "priority": "bulk",
		"audience": map[string]any{"type": "segment", "id": "bench"},
		"payload":  map[string]any{"title": "Your daily digest", "body": "12 new items since yesterday", "data": map[string]any{"deep_link": "app://digest"}},
	}, http.StatusAccepted)
	if err != nil {
		return nil, err
	}
	res.ScheduleMs = ms(time.Since(start))
	res.ChunkCount = int(bulk["chunk_count"].(float64))
	urgent, err := b.api(http.MethodPost, "/v1/messages", map[string]any{
		"dispatch_at": dispatchAt.Format(time.RFC3339Nano), "priority": "urgent",
		"audience": map[string]any{"type": "users", "ids": []string{"urgent-user"}},
		"payload":  map[string]any{"title": "Your sign-in code", "body": "123456"},
	}, http.StatusAccepted)
	if err != nil {
		return nil, err
	}
	bulkID, urgentID := bulk["message_id"].(string), urgent["message_id"].(string)
	if err := readPG(1); err != nil {
		return nil, err
	}
	b.Progress("scheduled in %.0f ms (%d chunks); waiting for %s", res.ScheduleMs, res.ChunkCount, dispatchAt.Format("15:04:05.000"))
	// The ledger was empty at the ANALYZE above. A production ledger never
	// is, and autovacuum analyzes a table that grew this much within about a
	// minute, before a message scheduled further ahead than the bench's
	// ten seconds is due; so the dispatch runs on those statistics too. (The
	// ledger queries are also tested on an empty table's statistics:
	// TestLedgerPlansUseThePrimaryKey.)
	if err := db.On(pool).AnalyzeDeliveries(ctx); err != nil {
		return nil, fmt.Errorf("analyze: %w", err)
	}

	// Herald's CPU per send is what scheduling and the fan-out cost: the
	// wait in between, when an idle process only polls its queues, is
	// measured apart as a rate (it is paid per second, not per send).
	cpuScheduled, err := b.heraldCPU()
	if err != nil {
		return nil, err
	}
	idleFrom := time.Now()
	probeAPNs, closeProbe, err := b.providers(ctx, "probe")
	if err != nil {
		return nil, err
	}
	defer closeProbe()
	probeConn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return nil, err
	}
	defer probeConn.Close(context.WithoutCancel(ctx))
	time.Sleep(time.Until(dispatchAt.Add(-100 * time.Millisecond)))
	cpuDue, err := b.heraldCPU()
	if err != nil {
		return nil, err
	}
	if err := readPG(2); err != nil {
		return nil, err
	}
	res.IdleCPUPercent = round1(float64((cpuDue - cpuScheduled).Microseconds()) / float64(time.Since(idleFrom).Microseconds()) * 100)

	stopProbe := make(chan struct{})
	probed := make(chan [2][]float64, 1)
	go func() {
		time.Sleep(time.Until(dispatchAt))
		p, d := b.probe(ctx, probeAPNs[jobs.ChannelAPNs], probeConn, stopProbe)
		probed <- [2][]float64{p, d}
	}()
	for _, id := range []string{urgentID, bulkID} {
		if err := b.waitSettled(ctx, pool, id, dispatchAt.Add(2*time.Minute)); err != nil {
			close(stopProbe)
			<-probed
			return nil, err
		}
	}
	close(stopProbe)
	rtts := <-probed
	res.Probe.ProviderMs, res.Probe.DatabaseMs = summarize(rtts[0]), summarize(rtts[1])
	b.Progress("probes while the bulk message was in flight: provider round trip p50 %.0f ms, max %.0f ms; database p50 %.1f ms, max %.1f ms",
		res.Probe.ProviderMs.P50, res.Probe.ProviderMs.Max, res.Probe.DatabaseMs.P50, res.Probe.DatabaseMs.Max)
	cpuAfter, err := b.heraldCPU()
	if err != nil {
		return nil, err
	}
	if err := readPG(3); err != nil {
		return nil, err
	}
	for _, h := range b.heralds {
		rss, err := peakRSS(h.cmd.Process.Pid)
		if err != nil {
			return nil, err
		}
		res.PeakRSSMb = max(res.PeakRSSMb, rss)
	}

	// The ledger's view.
	q := db.On(pool)
	bulkN, _ := push.ParseMessageID(bulkID)
	urgentN, _ := push.ParseMessageID(urgentID)
	skews, err := q.AcceptedSkews(ctx, bulkN)
	if err != nil {
		return nil, err
	}
	res.Accepted = len(skews)
	res.SkewMs = summarize(skews)
	urgentSkews, err := q.AcceptedSkews(ctx, urgentN)
	if err != nil {
		return nil, err
	}
	if len(urgentSkews) == 1 {
		res.UrgentSkewMs = round1(urgentSkews[0])
	}
	urgentChunks, err := q.ChunkTimings(ctx, urgentN)
	if err != nil {
		return nil, err
	}
	if len(urgentChunks) == 1 {
		res.UrgentPickupMs = round1(urgentChunks[0].PickupMs)
	}
	span, err := q.AcceptanceSpan(ctx, bulkN)
	if err != nil {
		return nil, err
	}
	res.FanoutMs = ms(span.Last.Sub(span.First))
	chunks, err := q.ChunkTimings(ctx, bulkN)
	if err != nil {
		return nil, err
	}
	var pickup, first, last, write []float64
	for _, c := range chunks {
		pickup, first, last, write = append(pickup, c.PickupMs), append(first, c.FirstAcceptMs), append(last, c.LastAcceptMs), append(write, c.WriteMs)
	}
	res.Breakdown.PickupMs, res.Breakdown.FirstAcceptMs = pairOf(pickup), pairOf(first)
	res.Breakdown.LastAcceptMs, res.Breakdown.LedgerWriteMs = pairOf(last), pairOf(write)
	res.CPUPerSend = round1(float64((cpuScheduled - cpuBefore + cpuAfter - cpuDue).Microseconds()) / float64(res.Accepted+len(urgentSkews)))
	if pgLocal {
		v := round1(float64((pgSpans[1] - pgSpans[0] + pgSpans[3] - pgSpans[2]).Microseconds()) / float64(res.Accepted+len(urgentSkews)))
		res.PostgresCPUPerSend = &v
	}

	// fakepush's view: when each push arrived, by the same host's clock.
	receipts, stats, err := b.receipts(bulkID)
	if err != nil {
		return nil, err
	}
	var rskews []float64
	for _, r := range receipts {
		rskews = append(rskews, float64(r.ReceivedAt.Sub(dispatchAt).Microseconds())/1000)
	}
	slices.Sort(rskews)
	res.ReceiptSkewMs = summarize(rskews)
	res.Duplicates = stats.APNs.Duplicates + stats.FCM.Duplicates + stats.WebPush.Duplicates
	urgentReceipts, _, err := b.receipts(urgentID)
	if err != nil {
		return nil, err
	}
	if len(urgentReceipts) == 1 {
		res.UrgentReceiptMs = round1(float64(urgentReceipts[0].ReceivedAt.Sub(dispatchAt).Microseconds()) / 1000)
	}
	b.Progress("dispatched: %d accepted, skew p50 %.0f ms, max %.0f ms, fan-out %.0f ms, %.0f µs of Herald CPU per send",
		res.Accepted, res.SkewMs.P50, res.SkewMs.Max, res.FanoutMs, res.CPUPerSend)

	for _, h := range b.heralds {
		n, err := UnansweredSends(h.base)
		if err != nil {
			return nil, fmt.Errorf("read herald's metrics: %w", err)
		}
		res.Unanswered += n
	}
	if res.Unanswered > 0 {
		b.Progress("%d provider requests got no answer in time and were sent again", res.Unanswered)
	}

	if err := b.stopHerald(); err != nil {
		return nil, err
	}

	b.Progress("blast: the same devices straight through the same provider clients")
	if res.BlastMs, res.BlastCPUPerSnd, err = b.blast(ctx, pool, bulkN); err != nil {
		return nil, err
	}
	b.Progress("blast: %.0f ms, %.0f µs of CPU per send", res.BlastMs, res.BlastCPUPerSnd)
	return res, nil
}
