package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/heraldpush/herald/db"
	"github.com/heraldpush/herald/jobs"
	"github.com/heraldpush/herald/jobs/push"
	"github.com/heraldpush/herald/jobs/push/fake"
)

// benchConfig is what `herald bench` runs (the README's Performance).
type benchConfig struct {
	Users        int
	Mix          [3]float64 // APNs, FCM, Web Push shares
	Latency      time.Duration
	Ahead        time.Duration
	Seed         uint64
	Out          string
	ProfileDir   string
	DecryptOneIn int
	KeepDB       bool
	// UrgentWorker runs the urgent lane in a worker process of its own
	// (HERALD_LANES), beside the serve process that keeps the bulk lane.
	UrgentWorker bool
}

// benchResult is the JSON line `herald bench` ends with.
type benchResult struct {
	Machine    string  `json:"machine"`
	Users      int     `json:"users"`
	Devices    int     `json:"devices"`
	LatencyMs  float64 `json:"latency_ms"`
	Accepted   int     `json:"accepted"`
	Duplicates int64   `json:"duplicates"`
	// Unanswered counts the provider requests of every Herald process that
	// got no answer in time: each was sent again, and may be a duplicate.
	Unanswered    int64   `json:"unanswered"`
	ScheduleMs    float64 `json:"schedule_ms"`
	ChunkCount    int     `json:"chunk_count"`
	SkewMs        summary `json:"skew_ms"`
	ReceiptSkewMs summary `json:"receipt_skew_ms"`
	UrgentSkewMs  float64 `json:"urgent_skew_ms"`
	// UrgentPickupMs is when the urgent chunk started after its due time:
	// the rest of urgent_skew_ms is its reads, the send and the answer.
	UrgentPickupMs float64 `json:"urgent_pickup_ms"`
	// UrgentReceiptMs is when the urgent push reached fakepush after its
	// due time: what is left of urgent_skew_ms after it is the provider's
	// answer (its latency, and its CPU, shared here with the bulk fan-out).
	UrgentReceiptMs float64 `json:"urgent_receipt_ms"`
	// Probe is the floor under urgent_skew_ms on this machine: round trips
	// the bench makes from its own, otherwise idle, process while the bulk
	// message is in flight (probe). An urgent push waits for its lane's
	// fetch, a database round trip to begin and a provider round trip, and
	// none of them is quicker than these while the cores are saturated.
	Probe struct {
		ProviderMs summary `json:"provider_ms"`
		DatabaseMs summary `json:"database_ms"`
	} `json:"probe"`
	FanoutMs       float64 `json:"fanout_ms"`
	BlastMs        float64 `json:"blast_ms"`
	CPUPerSend     float64 `json:"cpu_us_per_send"`
	IdleCPUPercent float64 `json:"idle_cpu_percent"`
	// PostgresCPUPerSend is the database's CPU over the same spans as
	// cpu_us_per_send, per send: the ledger's share of the dispatch second,
	// which the blast does not pay. Null when the database is not a process
	// of this host.
	PostgresCPUPerSend *float64 `json:"postgres_cpu_us_per_send"`
	BlastCPUPerSnd     float64  `json:"blast_cpu_us_per_send"`
	PeakRSSMb          float64  `json:"peak_rss_mb"`
	Breakdown          struct {
		PickupMs      pair `json:"pickup_ms"`
		FirstAcceptMs pair `json:"first_accept_ms"`
		LastAcceptMs  pair `json:"last_accept_ms"`
		LedgerWriteMs pair `json:"ledger_write_ms"`
	} `json:"breakdown"`
	Tuning map[string]string `json:"tuning,omitempty"`
	// UrgentWorker says the urgent lane ran in a process of its own
	// (--urgent-worker); cpu_us_per_send and peak_rss_mb then cover both
	// processes (the sum of their CPU, the larger peak).
	UrgentWorker bool `json:"urgent_worker,omitempty"`
}

type summary struct {
	P50 float64 `json:"p50"`
	P95 float64 `json:"p95"`
	P99 float64 `json:"p99"`
	Max float64 `json:"max"`
}

type pair struct {
	P50 float64 `json:"p50"`
	Max float64 `json:"max"`
}

// benchTuning are the variables a bench run passes on to its Herald
// process, and reports when set.
var benchTuning = []string{
	"HERALD_CHUNK_SIZE", "HERALD_URGENT_WORKERS", "HERALD_BULK_WORKERS", "HERALD_FETCH_POLL_INTERVAL",
	"HERALD_MAX_IN_FLIGHT_APNS", "HERALD_MAX_IN_FLIGHT_FCM", "HERALD_MAX_IN_FLIGHT_WEBPUSH", "HERALD_DB_MAX_CONNS",
	"GOMAXPROCS", "GOGC", "GOMEMLIMIT",
}

// devicesPerUser is the distribution of devices per user: 1 to 5, mean 2.5.
var devicesPerUser = []float64{0.30, 0.25, 0.20, 0.15, 0.10}

// runBench is `herald bench`: it builds a population in a fresh database,
// runs Herald and a fakepush as processes of their own, schedules one bulk
// message to everyone and one urgent single-device message for the same
// instant, measures where the time and CPU went, then sends the same devices
// straight through the same provider clients (no database, no queue) for
// the floor. Its last line is the JSON result.
func runBench(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	cfg := benchConfig{}
	fs := newFlagSet("bench", stderr)
	fs.IntVar(&cfg.Users, "users", 10_000, "users in the population (each with 1 to 5 devices, mean 2.5)")
	mix := fs.String("mix", "45,45,10", "percent of devices on APNs, FCM and Web Push")
	fs.DurationVar(&cfg.Latency, "latency", 20*time.Millisecond, "provider round trip fakepush adds")
	fs.DurationVar(&cfg.Ahead, "ahead", 10*time.Second, "how far ahead the messages are scheduled")
	fs.Uint64Var(&cfg.Seed, "seed", 1, "seed of the population")
	fs.StringVar(&cfg.Out, "out", "bench/results/latest.json", "where the JSON result is also written")
	fs.StringVar(&cfg.ProfileDir, "profile", "", "write Herald's CPU and heap profiles into this directory")
	fs.IntVar(&cfg.DecryptOneIn, "decrypt-one-in", 10, "fakepush decrypts one Web Push body in N, to leave the CPU to Herald")
	fs.BoolVar(&cfg.KeepDB, "keep-db", false, "keep the bench database afterwards")
	fs.BoolVar(&cfg.UrgentWorker, "urgent-worker", false, "run the urgent lane in a worker process of its own (HERALD_LANES=urgent)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := parseMix(*mix, &cfg.Mix); err != nil {
		return err
	}
	if cfg.Users < 1 {
		return errors.New("--users must be at least 1")
	}
	admin := getenv("DATABASE_URL")
	if admin == "" {
		return errors.New("DATABASE_URL is not set: herald bench creates a fresh database on that server (make bench starts one)")
	}
	progress := func(format string, a ...any) { fmt.Fprintf(stdout, "bench: "+format+"\n", a...) }

	b := &bench{cfg: cfg, getenv: getenv, progress: progress, stderr: stderr}
	defer b.cleanup()
	res, err := b.run(ctx, admin)
	if err != nil {
		return err
	}
	line, err := json.Marshal(res)
	if err != nil {
		return err
	}
	if cfg.Out != "" {
		if err := os.MkdirAll(filepath.Dir(cfg.Out), 0o755); err != nil {
			return err
		}
		var pretty bytes.Buffer
		_ = json.Indent(&pretty, line, "", "  ")
		if err := os.WriteFile(cfg.Out, append(pretty.Bytes(), '\n'), 0o644); err != nil {
			return err
		}
	}
	fmt.Fprintln(stdout, string(line))
	return nil
}

func parseMix(s string, out *[3]float64) error {
	parts := strings.Split(s, ",")
	if len(parts) != 3 {
		return fmt.Errorf("--mix %q: want three percentages, APNs,FCM,WebPush", s)
	}
	var total float64
	for i, p := range parts {
		v, err := strconv.ParseFloat(strings.TrimSpace(p), 64)
		if err != nil || v < 0 {
			return fmt.Errorf("--mix %q: %q is not a percentage", s, p)
		}
		out[i], total = v, total+v
	}
	if total <= 0 {
		return fmt.Errorf("--mix %q: the shares add up to nothing", s)
	}
	for i := range out {
		out[i] /= total
	}
	return nil
}

// bench is one run's state.
type bench struct {
	cfg      benchConfig
	getenv   func(string) string
	progress func(string, ...any)
	stderr   io.Writer
	// childEnv is added to the environment of the processes the bench
	// starts (its tests use it to have the test binary run as herald).
	childEnv []string

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

func (b *bench) cleanup() {
	for _, c := range slices.Backward(b.cleanups) {
		c()
	}
}

func (b *bench) run(ctx context.Context, admin string) (*benchResult, error) {
	res := &benchResult{Users: b.cfg.Users, LatencyMs: float64(b.cfg.Latency.Microseconds()) / 1000, Machine: machine(),
		UrgentWorker: b.cfg.UrgentWorker}
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
		if v := b.getenv(k); v != "" {
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
	if _, err := pool.Exec(ctx, "ANALYZE"); err != nil {
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
	dispatchAt := time.Now().Add(b.cfg.Ahead).Truncate(time.Millisecond)
	b.progress("scheduling the bulk message to %d devices and the urgent one for %s", devices, dispatchAt.Format(time.RFC3339Nano))
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
	b.progress("scheduled in %.0f ms (%d chunks); waiting for %s", res.ScheduleMs, res.ChunkCount, dispatchAt.Format("15:04:05.000"))
	// The ledger was empty at the ANALYZE above. A production ledger never
	// is, and autovacuum analyzes a table that grew this much within about a
	// minute, before a message scheduled further ahead than the bench's
	// ten seconds is due; so the dispatch runs on those statistics too. (The
	// ledger queries are also tested on an empty table's statistics:
	// TestLedgerPlansUseThePrimaryKey.)
	if _, err := pool.Exec(ctx, "ANALYZE deliveries"); err != nil {
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
	probeAPNs, err := b.providers(ctx, "probe")
	if err != nil {
		return nil, err
	}
	defer probeAPNs.close()
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
		p, d := b.probe(ctx, probeAPNs.byChannel["apns"], probeConn, stopProbe)
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
	b.progress("probes while the bulk message was in flight: provider round trip p50 %.0f ms, max %.0f ms; database p50 %.1f ms, max %.1f ms",
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
	b.progress("dispatched: %d accepted, skew p50 %.0f ms, max %.0f ms, fan-out %.0f ms, %.0f µs of Herald CPU per send",
		res.Accepted, res.SkewMs.P50, res.SkewMs.Max, res.FanoutMs, res.CPUPerSend)

	for _, h := range b.heralds {
		n, err := unansweredSends(h.base)
		if err != nil {
			return nil, fmt.Errorf("read herald's metrics: %w", err)
		}
		res.Unanswered += n
	}
	if res.Unanswered > 0 {
		b.progress("%d provider requests got no answer in time and were sent again", res.Unanswered)
	}

	if err := b.stopHerald(); err != nil {
		return nil, err
	}

	b.progress("blast: the same devices straight through the same provider clients")
	if res.BlastMs, res.BlastCPUPerSnd, err = b.blast(ctx, pool, bulkN); err != nil {
		return nil, err
	}
	b.progress("blast: %.0f ms, %.0f µs of CPU per send", res.BlastMs, res.BlastCPUPerSnd)
	return res, nil
}

// providers builds provider clients as a Herald worker would, on fakepush.
func (b *bench) providers(ctx context.Context, lane string) (*providers, error) {
	cfg, err := loadConfig(func(k string) string {
		if v, ok := b.fakeEnv[k]; ok {
			return v
		}
		return b.getenv(k)
	})
	if err != nil {
		return nil, err
	}
	roots, err := rootCAs(cfg.CertFile)
	if err != nil {
		return nil, err
	}
	return buildProviders(ctx, cfg, roots, discardLogger(), lane)
}

// probeEvery is how often the bench probes the machine while the bulk
// message is in flight.
const probeEvery = 50 * time.Millisecond

// probe measures, from this process, round trips like the urgent lane's
// while the bulk message is in flight: every probeEvery, one APNs push to
// fakepush through a client of its own (each with a message id of its own,
// so never a duplicate) and one SELECT 1 on a connection of its own. It
// probes until stop is closed, then returns the round trips in ms, sorted.
func (b *bench) probe(ctx context.Context, apns jobs.Sender, conn *pgx.Conn, stop <-chan struct{}) (provider, database []float64) {
	tick := time.NewTicker(probeEvery)
	defer tick.Stop()
	target := []push.Target{{Token: strings.Repeat("cd", 32)}}
	result := make([]push.Result, 1)
	allow := func() bool { return true }
	for n := 0; ; n++ {
		msg, err := push.NewMessage("msg_probe_"+strconv.Itoa(n), true, push.Content{Title: "probe"}, time.Now().Add(time.Minute))
		if err == nil && apns != nil {
			start := time.Now()
			apns.Send(ctx, msg, target, result, allow)
			if result[0].Accepted {
				provider = append(provider, ms(time.Since(start)))
			}
		}
		start := time.Now()
		if _, err := conn.Exec(ctx, "SELECT 1"); err == nil {
			database = append(database, ms(time.Since(start)))
		}
		select {
		case <-stop:
			slices.Sort(provider)
			slices.Sort(database)
			return provider, database
		case <-tick.C:
		}
	}
}

// freshDatabase creates a database for this run on the server of admin.
func (b *bench) freshDatabase(ctx context.Context, admin string) (string, error) {
	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		return "", fmt.Errorf("connect to DATABASE_URL: %w", err)
	}
	defer conn.Close(ctx)
	name := fmt.Sprintf("herald_bench_%d", time.Now().UnixNano())
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		return "", fmt.Errorf("create bench database: %w", err)
	}
	if !b.cfg.KeepDB {
		b.cleanups = append(b.cleanups, func() {
			c, err := pgx.Connect(context.Background(), admin)
			if err != nil {
				return
			}
			defer c.Close(context.Background())
			_, _ = c.Exec(context.Background(), "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
		})
	}
	b.progress("database %s", name)
	return db.WithDatabase(admin, name)
}

// self runs this binary as `herald args...` in a process of its own.
func (b *bench) self(ctx context.Context, env []string, args ...string) (*exec.Cmd, *lineReader, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, nil, err
	}
	cmd := exec.CommandContext(ctx, exe, args...)
	cmd.Env = append(slices.Clip(env), b.childEnv...)
	cmd.Stderr = b.stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, nil, err
	}
	b.cleanups = append(b.cleanups, func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
	})
	return cmd, newLineReader(out), nil
}

func (b *bench) startFakepush(ctx context.Context) error {
	dir, err := os.MkdirTemp("", "herald-bench-fakepush-")
	if err != nil {
		return err
	}
	b.cleanups = append(b.cleanups, func() { os.RemoveAll(dir) })
	_, lines, err := b.self(ctx, os.Environ(), "fakepush", "--addr", "127.0.0.1:0", "--tls-dir", dir,
		"--latency", b.cfg.Latency.String(), "--decrypt-one-in", strconv.Itoa(b.cfg.DecryptOneIn))
	if err != nil {
		return fmt.Errorf("start fakepush: %w", err)
	}
	if _, err := lines.waitFor(regexp.MustCompile(`fakepush listening on (\S+)`), 30*time.Second); err != nil {
		return fmt.Errorf("fakepush: %w", err)
	}
	raw, err := os.ReadFile(filepath.Join(dir, "env"))
	if err != nil {
		return err
	}
	b.fakeEnv = fake.ParseEnvFile(raw)
	b.fakeURL = b.fakeEnv["APNS_HOST"]
	ca, err := os.ReadFile(b.fakeEnv["SSL_CERT_FILE"])
	if err != nil {
		return err
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca)
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = &tls.Config{RootCAs: pool}
	tr.MaxIdleConnsPerHost = 16
	b.fakeHTTP = &http.Client{Transport: tr, Timeout: 30 * time.Second}
	b.progress("fakepush at %s, %s round trip", b.fakeURL, b.cfg.Latency)
	return nil
}

func (b *bench) startHerald(ctx context.Context, dbURL string) error {
	b.apiKey = "bench-key-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	env := []string{"PATH=" + b.getenv("PATH"), "DATABASE_URL=" + dbURL, "HERALD_API_KEYS=" + b.apiKey, "HERALD_LOG_LEVEL=warn"}
	for k, v := range b.fakeEnv {
		env = append(env, k+"="+v)
	}
	for _, k := range benchTuning {
		if v := b.getenv(k); v != "" {
			env = append(env, k+"="+v)
		}
	}
	args := []string{"serve", "--migrate", "--addr", "127.0.0.1:0"}
	if b.cfg.ProfileDir != "" {
		if err := os.MkdirAll(b.cfg.ProfileDir, 0o755); err != nil {
			return err
		}
		args = append(args, "--cpuprofile", filepath.Join(b.cfg.ProfileDir, "herald.cpu.pprof"),
			"--memprofile", filepath.Join(b.cfg.ProfileDir, "herald.heap.pprof"))
	}
	serveEnv := env
	if b.cfg.UrgentWorker {
		serveEnv = append(slices.Clip(env), "HERALD_LANES=bulk")
	}
	cmd, base, err := b.startServe(ctx, serveEnv, args...)
	if err != nil {
		return err
	}
	b.herald, b.base = cmd, base
	b.progress("herald at %s (pid %d)", b.base, cmd.Process.Pid)
	if b.cfg.UrgentWorker {
		// After the first has migrated the database.
		worker, _, err := b.startServe(ctx, append(slices.Clip(env), "HERALD_LANES=urgent"), "serve", "--role", "worker", "--addr", "127.0.0.1:0")
		if err != nil {
			return err
		}
		b.progress("herald urgent-lane worker (pid %d)", worker.Process.Pid)
	}
	return nil
}

// startServe starts a Herald process and waits until it listens.
func (b *bench) startServe(ctx context.Context, env []string, args ...string) (*exec.Cmd, string, error) {
	cmd, lines, err := b.self(ctx, env, args...)
	if err != nil {
		return nil, "", fmt.Errorf("start herald: %w", err)
	}
	m, err := lines.waitFor(listeningLine, time.Minute)
	if err != nil {
		return nil, "", fmt.Errorf("herald %s: %w", strings.Join(args, " "), err)
	}
	b.heralds = append(b.heralds, heraldProcess{cmd: cmd, base: m[1]})
	return cmd, m[1], nil
}

// heraldProcess is a Herald process of the run and where it listens.
type heraldProcess struct {
	cmd  *exec.Cmd
	base string
}

// heraldCPU is the CPU time of every Herald process of the run.
func (b *bench) heraldCPU() (time.Duration, error) {
	var total time.Duration
	for _, h := range b.heralds {
		cpu, err := processCPU(h.cmd.Process.Pid)
		if err != nil {
			return 0, err
		}
		total += cpu
	}
	return total, nil
}

// stopHerald ends the Herald process cleanly, which writes its profiles.
func (b *bench) stopHerald() error {
	if err := b.herald.Process.Signal(syscall.SIGTERM); err != nil {
		return err
	}
	done := make(chan error, 1)
	go func() { done <- b.herald.Wait() }()
	select {
	case <-done:
		return nil
	case <-time.After(30 * time.Second):
		_ = b.herald.Process.Kill()
		return errors.New("herald did not stop within 30 s of SIGTERM")
	}
}

// populate registers the population through the API: users u0..uN with 1
// to 5 devices each on the configured mix, all in segment "bench", and one
// more user with one APNs device for the urgent message.
func (b *bench) populate(ctx context.Context) (int, error) {
	rng := rand.New(rand.NewPCG(b.cfg.Seed, 0x4865))
	var devices []map[string]any
	var users []string
	var webpush int
	pick := func(weights []float64) int {
		x := rng.Float64()
		for i, w := range weights {
			if x < w {
				return i
			}
			x -= w
		}
		return len(weights) - 1
	}
	for u := range b.cfg.Users {
		user := "u" + strconv.Itoa(u)
		users = append(users, user)
		for d := range pick(devicesPerUser) + 1 {
			switch pick(b.cfg.Mix[:]) {
			case 0:
				devices = append(devices, map[string]any{"user_id": user, "channel": "apns", "token": fmt.Sprintf("%056x%08x", u, d)})
			case 1:
				devices = append(devices, map[string]any{"user_id": user, "channel": "fcm", "token": fmt.Sprintf("bench-%d-%d:APA91b%0140x", u, d, u)})
			default:
				devices = append(devices, map[string]any{"user_id": user, "channel": "webpush"})
				webpush++
			}
		}
	}
	b.progress("population: %d users, %d devices (%d Web Push subscriptions to mint)", len(users), len(devices), webpush)
	if err := b.mintSubscriptions(ctx, devices); err != nil {
		return 0, err
	}
	for start := 0; start < len(devices); start += 10_000 {
		if _, err := b.api(http.MethodPost, "/v1/devices/batch", map[string]any{"devices": devices[start:min(start+10_000, len(devices))]}, http.StatusOK); err != nil {
			return 0, err
		}
	}
	if _, err := b.api(http.MethodPut, "/v1/segments/bench", map[string]any{"name": "bench"}, http.StatusCreated); err != nil {
		return 0, err
	}
	for start := 0; start < len(users); start += 10_000 {
		if _, err := b.api(http.MethodPost, "/v1/segments/bench/members", map[string]any{"user_ids": users[start:min(start+10_000, len(users))]}, http.StatusOK); err != nil {
			return 0, err
		}
	}
	if _, err := b.api(http.MethodPost, "/v1/devices", map[string]any{"user_id": "urgent-user", "channel": "apns", "token": strings.Repeat("ab", 32)}, http.StatusCreated); err != nil {
		return 0, err
	}
	return len(devices), nil
}

// mintSubscriptions fills in Web Push devices with subscriptions fakepush
// mints, as browsers would hand them out.
func (b *bench) mintSubscriptions(ctx context.Context, devices []map[string]any) error {
	var todo []map[string]any
	for _, d := range devices {
		if d["channel"] == "webpush" {
			todo = append(todo, d)
		}
	}
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		firstErr error
	)
	work := make(chan map[string]any)
	for range 8 {
		wg.Go(func() {
			for d := range work {
				resp, err := b.fakeHTTP.Post(b.fakeURL+"/_webpush/subscriptions", "application/json", strings.NewReader("{}"))
				var sub fake.Subscription
				if err == nil {
					err = json.NewDecoder(resp.Body).Decode(&sub)
					resp.Body.Close()
				}
				if err != nil {
					mu.Lock()
					firstErr = cmpErr(firstErr, fmt.Errorf("mint subscription: %w", err))
					mu.Unlock()
					continue
				}
				d["subscription"] = sub
			}
		})
	}
	for _, d := range todo {
		if ctx.Err() != nil {
			break
		}
		work <- d
	}
	close(work)
	wg.Wait()
	return cmpErr(firstErr, ctx.Err())
}

func cmpErr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

// api calls Herald's API and decodes the answer, which must have status.
func (b *bench) api(method, path string, body any, status int) (map[string]any, error) {
	raw, err := json.Marshal(body)
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequest(method, b.base+path, bytes.NewReader(raw))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+b.apiKey)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	var out map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil && resp.StatusCode != http.StatusNoContent {
		return nil, fmt.Errorf("%s %s: %d, unreadable answer: %w", method, path, resp.StatusCode, err)
	}
	if resp.StatusCode != status {
		return nil, fmt.Errorf("%s %s: %d %v", method, path, resp.StatusCode, out)
	}
	return out, nil
}

func (b *bench) get(path string) (map[string]any, error) {
	req, err := http.NewRequest(http.MethodGet, b.base+path, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+b.apiKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var out map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %d %v", path, resp.StatusCode, out)
	}
	return out, nil
}

// waitSettled polls a message's state until it settles or deadline passes.
// It reads the messages table itself: the API's view of a dispatching
// message computes its skew from the ledger, a sort of every accepted
// delivery, and polling it would add that to the CPU the bench measures.
func (b *bench) waitSettled(ctx context.Context, pool *pgxpool.Pool, id string, deadline time.Time) error {
	n, ok := push.ParseMessageID(id)
	if !ok {
		return fmt.Errorf("%q is not a message id", id)
	}
	for {
		var state string
		if err := pool.QueryRow(ctx, "SELECT state FROM messages WHERE id = $1", n).Scan(&state); err != nil {
			return fmt.Errorf("read message %s: %w", id, err)
		}
		if state != "scheduled" && state != "dispatching" {
			return nil
		}
		if time.Now().After(deadline) {
			st, _ := b.get("/v1/messages/" + id)
			return fmt.Errorf("message %s did not settle: %v", id, st["deliveries"])
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}

func (b *bench) receipts(messageID string) ([]fake.Receipt, fake.Stats, error) {
	var rs []fake.Receipt
	var st fake.Stats
	for path, dst := range map[string]any{"/_receipts?message_id=" + messageID: &rs, "/_stats": &st} {
		resp, err := b.fakeHTTP.Get(b.fakeURL + path)
		if err != nil {
			return nil, st, err
		}
		err = json.NewDecoder(resp.Body).Decode(dst)
		resp.Body.Close()
		if err != nil {
			return nil, st, err
		}
	}
	return rs, st, nil
}

// blast sends the message's devices again, straight through the same
// provider clients Herald uses, with the same chunking and worker count but
// no database and no queue: the floor of what the fan-out can cost here.
func (b *bench) blast(ctx context.Context, pool interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}, messageID int64,
) (wallMs, cpuPerSend float64, err error) {
	resp, err := b.fakeHTTP.Post(b.fakeURL+"/_reset", "application/json", nil)
	if err != nil {
		return 0, 0, err
	}
	resp.Body.Close()

	// The chunks exactly as Herald's workers got them.
	rows, err := pool.Query(ctx, `SELECT j.args FROM river_job j JOIN message_chunks c ON c.job_id = j.id
		WHERE c.message_id = $1 ORDER BY c.chunk`, messageID)
	if err != nil {
		return 0, 0, err
	}
	chunks, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (jobs.FanOutArgs, error) {
		var raw []byte
		var a jobs.FanOutArgs
		if err := r.Scan(&raw); err != nil {
			return a, err
		}
		return a, json.Unmarshal(raw, &a)
	})
	if err != nil {
		return 0, 0, err
	}

	provs, err := b.providers(ctx, "bulk")
	if err != nil {
		return 0, 0, err
	}
	defer provs.close()
	msg, err := push.NewMessage("msg_blast", false, push.Content{Title: "Your daily digest", Body: "12 new items since yesterday",
		Data: map[string]string{"deep_link": "app://digest"}}, time.Now().Add(time.Hour))
	if err != nil {
		return 0, 0, err
	}

	workers := 50 // jobs.RiverConfig's default
	if n, err := strconv.Atoi(b.getenv("HERALD_BULK_WORKERS")); err == nil && n > 0 {
		workers = n
	}
	allow := func() bool { return true }
	var (
		mu          sync.Mutex
		first, last time.Time
		sends       int
	)
	cpu0 := selfCPU()
	work := make(chan jobs.FanOutArgs)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for a := range work {
				byChannel := map[string][]push.Target{}
				for _, t := range a.Targets {
					byChannel[t.Channel] = append(byChannel[t.Channel], push.Target{DeviceID: t.DeviceID, Token: t.Token, P256dh: t.P256dh, Auth: t.Auth})
				}
				var cw sync.WaitGroup
				for channel, targets := range byChannel {
					p := provs.byChannel[channel]
					cw.Go(func() {
						results := make([]push.Result, len(targets))
						p.Send(ctx, msg, targets, results, allow)
						mu.Lock()
						defer mu.Unlock()
						for _, r := range results {
							if !r.Accepted {
								continue
							}
							sends++
							if first.IsZero() || r.At.Before(first) {
								first = r.At
							}
							if r.At.After(last) {
								last = r.At
							}
						}
					})
				}
				cw.Wait()
			}
		})
	}
	for _, c := range chunks {
		work <- c
	}
	close(work)
	wg.Wait()
	cpu := selfCPU() - cpu0
	if sends == 0 {
		return 0, 0, errors.New("blast: no send was accepted")
	}
	return ms(last.Sub(first)), round1(float64(cpu.Microseconds()) / float64(sends)), nil
}

// listeningLine is what `herald serve` prints once it accepts connections.
var listeningLine = regexp.MustCompile(`listening on (http://\S+)`)

// lineReader scans a child's stdout in the background, so that the test
// can wait for a line while the child keeps writing.
type lineReader struct {
	mu    sync.Mutex
	lines []string
	added chan struct{}
}

func newLineReader(r io.Reader) *lineReader {
	lr := &lineReader{added: make(chan struct{}, 1)}
	go func() {
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			lr.mu.Lock()
			lr.lines = append(lr.lines, sc.Text())
			lr.mu.Unlock()
			select {
			case lr.added <- struct{}{}:
			default:
			}
		}
	}()
	return lr
}

func (lr *lineReader) waitFor(re *regexp.Regexp, within time.Duration) ([]string, error) {
	deadline := time.After(within)
	seen := 0
	for {
		lr.mu.Lock()
		for ; seen < len(lr.lines); seen++ {
			if m := re.FindStringSubmatch(lr.lines[seen]); m != nil {
				lr.mu.Unlock()
				return m, nil
			}
		}
		lr.mu.Unlock()
		select {
		case <-lr.added:
		case <-deadline:
			return nil, fmt.Errorf("no line matching %q within %s", re, within)
		}
	}
}

func summarize(sorted []float64) summary {
	if len(sorted) == 0 {
		return summary{}
	}
	q := func(p float64) float64 { return round1(sorted[int(math.Ceil(p*float64(len(sorted))))-1]) }
	return summary{P50: q(0.5), P95: q(0.95), P99: q(0.99), Max: round1(sorted[len(sorted)-1])}
}

func pairOf(v []float64) pair {
	if len(v) == 0 {
		return pair{}
	}
	s := slices.Clone(v)
	slices.Sort(s)
	return pair{P50: round1(s[(len(s)-1)/2]), Max: round1(s[len(s)-1])}
}

func ms(d time.Duration) float64 { return round1(float64(d.Microseconds()) / 1000) }

func round1(f float64) float64 { return math.Round(f*10) / 10 }

// processCPU is a process's user and system CPU so far, from /proc.
func processCPU(pid int) (time.Duration, error) {
	st, err := readProcStat(pid)
	if err != nil {
		return 0, fmt.Errorf("read process CPU: %w", err)
	}
	return st.own, nil
}

// procStat is what /proc/PID/stat says of a process's CPU.
type procStat struct {
	ppid int
	// own is the process's CPU; children that of its children it has
	// reaped.
	own, children time.Duration
}

func readProcStat(pid int) (procStat, error) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return procStat{}, err
	}
	// Fields after the command name, which is in parentheses and may hold spaces.
	fields := strings.Fields(string(raw[bytes.LastIndexByte(raw, ')')+2:]))
	if len(fields) < 15 {
		return procStat{}, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(fields))
	}
	n := func(i int) int64 { v, _ := strconv.ParseInt(fields[i], 10, 64); return v }
	// The kernel counts in clock ticks of 1/100 s (USER_HZ) on Linux.
	const tick = 10 * time.Millisecond
	return procStat{
		ppid:     int(n(1)),
		own:      time.Duration(n(11)+n(12)) * tick,
		children: time.Duration(n(13)+n(14)) * tick,
	}, nil
}

// clusterCPU returns a reader of the CPU the PostgreSQL cluster behind
// pool has used: its postmaster's and every child's, running or reaped.
// ok is false when the server is not a process of this host that can be
// read (a remote database, or its data directory closed to this user).
func clusterCPU(ctx context.Context, pool interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}) (read func() (time.Duration, error), ok bool) {
	var dir string
	if err := pool.QueryRow(ctx, "SHOW data_directory").Scan(&dir); err != nil {
		return nil, false
	}
	raw, err := os.ReadFile(filepath.Join(dir, "postmaster.pid"))
	if err != nil {
		return nil, false
	}
	pid, err := strconv.Atoi(strings.TrimSpace(strings.SplitN(string(raw), "\n", 2)[0]))
	if err != nil {
		return nil, false
	}
	if _, err := readProcStat(pid); err != nil {
		return nil, false
	}
	return func() (time.Duration, error) {
		pm, err := readProcStat(pid)
		if err != nil {
			return 0, fmt.Errorf("read PostgreSQL's CPU: %w", err)
		}
		total := pm.own + pm.children
		entries, err := os.ReadDir("/proc")
		if err != nil {
			return 0, fmt.Errorf("read PostgreSQL's CPU: %w", err)
		}
		for _, e := range entries {
			child, err := strconv.Atoi(e.Name())
			if err != nil {
				continue
			}
			// A process may end between the listing and the read: its
			// CPU then moves to the postmaster's reaped children, and the
			// next reading counts it.
			if st, err := readProcStat(child); err == nil && st.ppid == pid {
				total += st.own
			}
		}
		return total, nil
	}, true
}

// peakRSS is a process's peak resident set, in MiB.
func peakRSS(pid int) (float64, error) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, fmt.Errorf("read process memory: %w", err)
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 64)
			return round1(kb / 1024), err
		}
	}
	return 0, errors.New("no VmHWM in /proc status")
}

// selfCPU is this process's CPU so far.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// machine describes where the figures came from.
func machine() string {
	model := "unknown CPU"
	if raw, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(raw), "\n") {
			if rest, ok := strings.CutPrefix(line, "model name"); ok {
				model = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(rest), ":"))
				break
			}
		}
	}
	return fmt.Sprintf("%d cores, %s", runtimeCPUs(), model)
}

func runtimeCPUs() int { return runtime.NumCPU() }

func discardLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }
