package jobs

import (
	"cmp"
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/riverqueue/river"

	"github.com/heraldpush/herald/db"
)

// DatabaseGauges are the gauges read from the database rather than kept by
// a process: the unsettled messages by state, the stranded chunks, the
// chunks failing every attempt, and River's jobs by queue and state (the
// queues' depth). Every process of any
// role exports them, so that an API-only process shows the queue it feeds.
// They are read every Every by Run and a scrape reports the last reading:
// a scrape never queries the database, so that a flood of scrapes costs it
// nothing, and each reading goes through indexes (the unsettled messages
// through messages_state_id_idx, live jobs through River's fetch index),
// never a scan of a table that grows with history.
type DatabaseGauges struct {
	Pool   *pgxpool.Pool
	Logger *slog.Logger
	// Every is how often the gauges are read (DefaultGaugesEvery when zero).
	Every time.Duration

	mu       sync.Mutex
	read     bool
	messages map[string]int64
	stranded int64
	failing  map[string]int64
	jobs     []db.QueueDepth
	webhooks int64
	at       time.Time

	messagesDesc, strandedDesc, failingDesc, jobsDesc, webhooksDesc, ageDesc *prometheus.Desc
}

// FailingChunkAttempts is how many attempts in a row a chunk job must have
// failed to count in herald_failing_chunks. River retries a failed chunk
// after 1 s, then 16 s (its backoff, attempt^4 seconds), so a chunk that
// fails every attempt counts some 20 s after its first failure (plus its
// attempts' own time, up to HERALD_CHUNK_TIMEOUT each), an hour before its
// message's expiry would show it; one that failed once or twice (a
// database fault) and then got through never does.
const FailingChunkAttempts = 3

// NewDatabaseGauges returns the gauges, registered on reg; Run keeps them.
func NewDatabaseGauges(reg prometheus.Registerer, pool *pgxpool.Pool, logger *slog.Logger) *DatabaseGauges {
	g := &DatabaseGauges{
		Pool: pool, Logger: logger,
		messagesDesc: prometheus.NewDesc("herald_messages",
			"Unsettled messages by state (scheduled, dispatching), in the database, as last read.", []string{"state"}, nil),
		strandedDesc: prometheus.NewDesc("herald_stranded_chunks",
			"Chunks of unsettled messages with deliveries pending that no River job will run (discarded, cancelled or deleted): retry them in River UI before they expire, or the reconciler expires them.",
			nil, nil),
		failingDesc: prometheus.NewDesc("herald_failing_chunks",
			"Chunk jobs, by lane, whose last 3 attempts each ended in an error (a poison chunk: args that cannot be decoded, work that errors or panics every time), as last read; a chunk parked behind a breaker snoozes, which is no attempt.",
			[]string{"lane"}, nil),
		jobsDesc: prometheus.NewDesc("herald_river_jobs",
			"River's jobs not finished, by queue and state (available, scheduled, running, retryable), as last read: a queue's depth.",
			[]string{"queue", "state"}, nil),
		webhooksDesc: prometheus.NewDesc("herald_webhook_events_pending",
			"Webhook events not yet delivered (waiting for their batch's call, being retried, or of batches given up and kept for a retry), as last read.",
			nil, nil),
		ageDesc: prometheus.NewDesc("herald_database_gauges_age_seconds",
			"How old the last reading of the database's gauges is.", nil, nil),
	}
	reg.MustRegister(g)
	return g
}

// Run reads the gauges now and then every Every, until ctx is done.
func (g *DatabaseGauges) Run(ctx context.Context) {
	every := cmp.Or(g.Every, DefaultGaugesEvery)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		g.refresh(ctx, every)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// refresh reads every gauge, each query bounded by timeout; one that fails
// keeps its last reading, and the age says how old that is.
func (g *DatabaseGauges) refresh(ctx context.Context, timeout time.Duration) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	rows, err := db.On(g.Pool).UnsettledMessagesByState(ctx)
	if err != nil {
		g.Logger.WarnContext(ctx, "read the database's gauges", "error", err)
		return
	}
	// Every state is reported, zero included, so that an alert on one
	// never sees it vanish.
	messages := map[string]int64{StateScheduled: 0, StateDispatching: 0}
	for _, r := range rows {
		messages[r.State] = r.Messages
	}
	stranded, err := db.StrandedChunks(ctx, g.Pool)
	if err != nil {
		g.Logger.WarnContext(ctx, "read the database's gauges", "error", err)
		return
	}
	failing, err := db.FailingChunks(ctx, g.Pool, chunkKinds, FailingChunkAttempts)
	if err != nil {
		g.Logger.WarnContext(ctx, "read the database's gauges", "error", err)
		return
	}
	jobs, err := db.RiverQueueDepth(ctx, g.Pool)
	if err != nil {
		g.Logger.WarnContext(ctx, "read the database's gauges", "error", err)
		return
	}
	webhooks, err := db.On(g.Pool).PendingWebhookEvents(ctx)
	if err != nil {
		g.Logger.WarnContext(ctx, "read the database's gauges", "error", err)
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.read, g.messages, g.stranded, g.failing, g.jobs, g.webhooks, g.at = true, messages, stranded, failing, jobs, webhooks, time.Now()
}

// Describe implements prometheus.Collector.
func (g *DatabaseGauges) Describe(ch chan<- *prometheus.Desc) {
	ch <- g.messagesDesc
	ch <- g.strandedDesc
	ch <- g.failingDesc
	ch <- g.jobsDesc
	ch <- g.webhooksDesc
	ch <- g.ageDesc
}

// Collect implements prometheus.Collector: the last reading, nothing
// before the first.
func (g *DatabaseGauges) Collect(ch chan<- prometheus.Metric) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.read {
		return
	}
	for state, n := range g.messages {
		ch <- prometheus.MustNewConstMetric(g.messagesDesc, prometheus.GaugeValue, float64(n), state)
	}
	ch <- prometheus.MustNewConstMetric(g.strandedDesc, prometheus.GaugeValue, float64(g.stranded))
	// Both lanes are reported, zero included, so that the alert on a lane
	// never sees its series vanish.
	for _, lane := range LaneQueues {
		ch <- prometheus.MustNewConstMetric(g.failingDesc, prometheus.GaugeValue, float64(g.failing[lane]), lane)
	}
	// Herald's queues are reported in every live state, zero included.
	depth := map[[2]string]int64{}
	for _, q := range []string{QueueUrgent, QueueBulk, QueueWebhooks, river.QueueDefault} {
		for _, state := range []string{"available", "scheduled", "running", "retryable"} {
			depth[[2]string{q, state}] = 0
		}
	}
	for _, q := range g.jobs {
		depth[[2]string{q.Queue, q.State}] = q.Jobs
	}
	for k, n := range depth {
		ch <- prometheus.MustNewConstMetric(g.jobsDesc, prometheus.GaugeValue, float64(n), k[0], k[1])
	}
	ch <- prometheus.MustNewConstMetric(g.webhooksDesc, prometheus.GaugeValue, float64(g.webhooks))
	ch <- prometheus.MustNewConstMetric(g.ageDesc, prometheus.GaugeValue, time.Since(g.at).Seconds())
}
