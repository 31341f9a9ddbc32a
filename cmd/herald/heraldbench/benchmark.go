package heraldbench

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"os/exec"
	"runtime/debug"
	"slices"
	"sync/atomic"
	"time"

	"github.com/heraldpush/herald/api/client"
	"github.com/heraldpush/herald/db"
	"github.com/heraldpush/herald/jobs"
	"github.com/heraldpush/herald/jobs/push/fake"
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
	// fakeApps are the apps beside the default one (--apps), as fakepush
	// made them.
	fakeApps []fake.App
	herald   *exec.Cmd
	base     string
	// heralds are the Herald processes of the run that send: herald, and
	// the urgent lane's worker with --urgent-worker. The status reader is
	// not one of them.
	heralds []heraldProcess
	apiKey  string
	// api is Herald's generated Go client, calling herald with apiKey.
	api *client.ClientWithResponses
	// status is the same client calling the Herald process (API only) that
	// the messages' status reads go through.
	status *client.ClientWithResponses
	// instant, when set, is the measured messages' instant (with
	// --preferences: preferencesInstant).
	instant time.Time
	// receiptsBefore is what fakepush's devices had sent once the earlier
	// rounds' receipts were in (--receipts with --before).
	receiptsBefore fake.DeviceStats
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
	res := &Result{Users: b.Config.Users, Apps: max(1, b.Config.Apps), LatencyMs: float64(b.Config.Latency.Microseconds()) / 1000, Machine: machine(),
		UrgentWorker: b.Config.UrgentWorker, Workers: b.Config.Workers, Payload: cmp.Or(b.Config.Payload, "plain")}
	dbURL, err := b.start(ctx, admin, res)
	if err != nil {
		return nil, err
	}
	pool, err := db.Open(ctx, dbURL, db.PoolConfig{MaxConns: 2})
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	if res.HistoryRows, err = b.fillHistory(ctx, pool); err != nil {
		return nil, err
	}
	if b.Config.Payload == "localized" {
		if _, err := db.On(pool).SetBenchLocales(ctx); err != nil {
			return nil, fmt.Errorf("users' locales: %w", err)
		}
	}
	// Give the planner statistics, as a production database has, and
	// leave autovacuum and the checkpointer nothing of the population (or
	// the history) to do while the CPU is measured.
	if err := db.On(pool).VacuumAnalyze(ctx); err != nil {
		return nil, fmt.Errorf("vacuum: %w", err)
	}
	if err := db.On(pool).Checkpoint(ctx); err != nil {
		b.Progress("no checkpoint before the measurement (%v): the checkpointer may write during it", err)
	}

	res.Messages, res.Before = b.Config.messages(), b.Config.Before
	res.StatusEveryMs = ms(b.Config.statusEvery())
	if err := b.playDevices(ctx); err != nil {
		return nil, err
	}
	if b.Config.Preferences {
		// The earlier rounds run under the same rules as the measured one
		// (their held users' quiet hours far from them), as every round of
		// a run without preferences is its measured round's twin: the
		// processes come to the measured instant in their steady state,
		// their pools grown to what a round with preferences holds at once
		// and each connection's plans of the claims made, instead of
		// paying for that inside the measured spans, once.
		if err := b.setPreferences(ctx, pool, time.Time{}); err != nil {
			return nil, err
		}
	}
	if err := b.sendBefore(ctx, pool, res.Devices, res); err != nil {
		return nil, err
	}
	if b.Config.Receipts && b.Config.Before > 0 {
		// The earlier rounds' receipts are in before the measurement, and
		// counted apart from its own.
		if _, b.receiptsBefore, _, err = b.waitReceipts(ctx); err != nil {
			return nil, err
		}
	}
	if err := b.throttle(ctx); err != nil {
		return nil, err
	}
	if b.Config.Preferences {
		// The instant is three seconds before a minute (preferencesInstant);
		// the run waits until it is Ahead away, as it is for every run.
		b.instant = b.preferencesInstant()
		time.Sleep(time.Until(b.instant.Add(-b.Config.Ahead)))
		if err := b.setPreferences(ctx, pool, b.instant); err != nil {
			return nil, err
		}
	}

	// Every mark reads the cluster's CPU and that of the status reads'
	// backends (cpuSpans): the measured messages' life is the span from
	// markBefore to markCleaned.
	cluster := clusterCPU(ctx, pool)
	if b.Config.Cold {
		cluster = nil
	}
	cpu := &cpuSpans{herald: b.heraldCPU, postgres: cluster, status: backendsCPU(pool, cluster, statusApplication),
		wal: func(ctx context.Context) (int64, error) { return db.WALPosition(ctx, pool) }}
	if err := cpu.markHerald(markBefore); err != nil {
		return nil, err
	}
	if err := cpu.markPostgres(ctx, markBefore); err != nil {
		return nil, err
	}
	sizeBefore, err := db.On(pool).DatabaseSize(ctx)
	if err != nil {
		return nil, fmt.Errorf("database size: %w", err)
	}
	sent, err := b.schedule(ctx, res)
	if err != nil {
		return nil, err
	}
	// What scheduling wrote before anything is sent, a device (the table
	// files' growth, not the WAL).
	sizeAfter, err := db.On(pool).DatabaseSize(ctx)
	if err != nil {
		return nil, fmt.Errorf("database size: %w", err)
	}
	res.ScheduleBytesPerDevice = round1(float64(sizeAfter-sizeBefore) / float64(max(res.Devices, 1)))
	if b.Config.Cold {
		// The statistics first: ANALYZE reads the ledger, which would
		// warm the page cache again.
		if err := db.On(pool).AnalyzeDeliveries(ctx); err != nil {
			return nil, fmt.Errorf("analyze: %w", err)
		}
		if res.Cold, err = b.coldCaches(ctx, pool); err != nil {
			return nil, err
		}
		b.Progress("cold: %s", res.Cold)
	}
	var statusReads atomic.Int64
	settled := b.readStatus(ctx, sent.ids(), settleDeadline(sent.dispatchAt, res.Devices), &statusReads)
	if err := cpu.markPostgres(ctx, markScheduled); err != nil {
		return nil, err
	}
	// Autovacuum analyzes a table that grew by a tenth within about a
	// minute, before a message scheduled further ahead than the bench's
	// ten seconds is due; so the dispatch runs on those statistics, and
	// their cost is the wait's. (The ledger queries are also tested on an
	// empty table's statistics: TestLedgerPlansUseThePrimaryKey.)
	if !b.Config.Cold {
		if err := db.On(pool).AnalyzeDeliveries(ctx); err != nil {
			return nil, fmt.Errorf("analyze: %w", err)
		}
	}
	if err := cpu.markHerald(markScheduled); err != nil {
		return nil, err
	}
	if err := b.dispatch(ctx, dbURL, sent, settled, cpu, res); err != nil {
		return nil, err
	}
	res.StatusReads = statusReads.Load()
	if err := cleanUp(ctx, pool); err != nil {
		return nil, err
	}
	if err := cpu.markPostgres(ctx, markCleaned); err != nil {
		return nil, err
	}
	// The receipts still to come are waited for after the messages' life
	// is measured, so that its parts keep their meaning; PostgreSQL's CPU
	// over the wait is theirs.
	if res.Receipts, err = b.receiptsView(ctx, pool, cluster, sent); err != nil {
		return nil, err
	}

	sends, err := b.ledgerView(ctx, pool, sent, res)
	if err != nil {
		return nil, err
	}
	res.CPUPerSend, res.PostgresCPUPerSend = cpu.perSend(sends)
	if b.Config.Preferences {
		if err := b.withheldView(ctx, pool, sent, cpu, res); err != nil {
			return nil, err
		}
	}
	res.WALBytesPerSend = cpu.walPerSend(sends)
	res.PostgresShare = cpu.share(sends)
	if p := res.PostgresShare; p != nil {
		b.Progress("PostgreSQL CPU per device over the messages' life: %.1f µs (scheduling %.1f, wait %.1f, fan-out %.1f, status reads %.1f, cleanup %.1f)",
			p.Total, p.Schedule, p.Wait, p.Fanout, p.StatusReads, p.Cleanup)
	}
	if err := b.fakepushView(ctx, sent, res); err != nil {
		return nil, err
	}
	if err := b.throttledView(ctx, sent, res); err != nil {
		return nil, err
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
	if b.Config.Retain {
		if res.Retained, err = b.retain(ctx, pool, sizeBefore); err != nil {
			return nil, err
		}
	}
	if b.Config.NoBlast {
		return res, nil
	}
	b.Progress("blast: the same devices straight through the same provider clients")
	if res.BlastMs, res.BlastCPUPerSnd, err = b.blast(ctx, pool, sent.bulkNs); err != nil {
		return nil, err
	}
	b.Progress("blast: %.0f ms, %.0f µs of CPU per send", res.BlastMs, res.BlastCPUPerSnd)
	if t := res.Throttled; res.BlastMs > 0 {
		t.HealthyFanoutBlast = math.Round(t.HealthyFanoutMs/res.BlastMs*100) / 100
		b.Progress("healthy devices: receipt skew p50 %.0f ms, p99 %.0f ms, max %.0f ms; fan-out %.0f ms, %.2f of the blast",
			t.HealthySkewMs.P50, t.HealthySkewMs.P99, t.HealthySkewMs.Max, t.HealthyFanoutMs, t.HealthyFanoutBlast)
		if t.Share > 0 {
			b.Progress("throttled: %d devices, %d 429s, %d pushes before their Retry-After; breaker failures %v",
				t.Devices, t.Answered429, t.Early, t.BreakerFailures)
		}
	}
	return res, nil
}

// start makes the run's database, starts fakepush and Herald, and
// registers the population; it returns the database's connection string.
func (b *Benchmark) start(ctx context.Context, admin string, res *Result) (string, error) {
	dbURL, err := b.freshDatabase(ctx, admin)
	if err != nil {
		return "", err
	}
	if err := b.startFakepush(ctx); err != nil {
		return "", err
	}
	if err := b.startHerald(ctx, dbURL); err != nil {
		return "", err
	}
	res.Tuning = map[string]string{}
	for _, k := range benchTuning {
		if v := b.Getenv(k); v != "" {
			res.Tuning[k] = v
		}
	}
	if err := b.storeApps(ctx); err != nil {
		return "", err
	}
	start := time.Now()
	if res.Devices, err = b.populate(ctx, dbURL); err != nil {
		return "", err
	}
	res.PopulationMs = ms(time.Since(start))
	b.Progress("population registered in %.1f s", time.Since(start).Seconds())
	// The registrations the bench built (a kilobyte a device, with the
	// collector's headroom: 9.8 GB for ten million) are given back to the
	// machine now, not by the runtime's scavenger over the minutes after:
	// PostgreSQL's page cache is what the measured part reads from.
	debug.FreeOSMemory()
	return dbURL, nil
}
