package jobs

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivertype"

	"github.com/heraldpush/herald/db"
)

// RiverConfig configures Herald's River clients. The zero value of each
// duration takes its default (defaults.go).
type RiverConfig struct {
	Logger *slog.Logger
	// Workers holds the job workers. Nil makes an insert-only client (the
	// api role), which enqueues but works nothing.
	Workers *river.Workers
	// Lanes are the chunk lanes a working client serves; none means both,
	// with default workers, on the process's pool.
	Lanes []Lane
	// FetchPollInterval is how often each lane looks for due chunks.
	FetchPollInterval time.Duration
	// Lookahead is how long before its time a chunk is made available to
	// fetch.
	Lookahead time.Duration
	// ChunkTimeout bounds a chunk attempt; RescueAfter is how long a chunk
	// may run before River, finding its process gone, retries it.
	// RescueAfter must exceed ChunkTimeout.
	ChunkTimeout, RescueAfter time.Duration
	// ShutdownTimeout is how long a stop lets the running chunks finish
	// before it cancels them; they hand themselves back (FanOutWorker).
	ShutdownTimeout time.Duration
	// MaterializeEvery is how often River's leader runs the schedule
	// materializer.
	MaterializeEvery time.Duration
	// Retention is how long settled messages and finished jobs are kept:
	// the retention job's period follows from it, and River's job cleaner
	// never keeps a finished job longer.
	Retention time.Duration
	// WebhookWorkers is how many webhook calls the main client makes at
	// once (DefaultWebhookWorkers when zero).
	WebhookWorkers int
	// ClientID, when set, names each working client: "main" for the main
	// client, the queue for a lane's own. A worker names them after its
	// liveness lock (Liveness.ClientID), so that Takeover can tell whose
	// running chunks are orphaned.
	ClientID func(name string) string
}

func (c *RiverConfig) setDefaults() {
	if len(c.Lanes) == 0 {
		c.Lanes = []Lane{{Queue: QueueUrgent}, {Queue: QueueBulk}}
	}
	c.FetchPollInterval = cmp.Or(c.FetchPollInterval, DefaultFetchPollInterval)
	c.Lookahead = cmp.Or(c.Lookahead, DefaultLookahead)
	c.ChunkTimeout = cmp.Or(c.ChunkTimeout, DefaultChunkTimeout)
	c.RescueAfter = cmp.Or(c.RescueAfter, DefaultRescueAfter)
	c.ShutdownTimeout = cmp.Or(c.ShutdownTimeout, DefaultShutdownTimeout)
	c.MaterializeEvery = cmp.Or(c.MaterializeEvery, DefaultMaterializeEvery)
	c.Retention = cmp.Or(c.Retention, DefaultRetention)
}

// NewRiverClient returns the River client on pool: an insert-only one when
// cfg has no Workers, else the process's main client, which works the
// maintenance queue and every lane of cfg.Lanes that has no Pool of its own
// (NewRiverClients makes the clients of the others).
//
// River makes a job scheduled for later available only from its leader's
// scheduler, every 5 s with a 5 s look-ahead, so a chunk can start up to 5 s
// late (and 10-20 s late while leadership changes hands). Its fetch query,
// though, takes only jobs whose scheduled_at has come. Herald therefore
// inserts chunk jobs due within Lookahead as available with their future
// scheduled_at (availableSoon), and every worker process promotes chunks as
// they come within Lookahead (Promoter); the lanes poll every
// FetchPollInterval. A chunk then starts within about one poll interval of
// its time, whatever the leader is doing.
func NewRiverClient(pool *pgxpool.Pool, cfg RiverConfig) (*river.Client[pgx.Tx], error) {
	if cfg.Logger == nil {
		return nil, errors.New("jobs: RiverConfig.Logger is required")
	}
	cfg.setDefaults()
	rc := cfg.base()
	if cfg.Workers != nil {
		cfg.workerConfig(rc)
		if cfg.ClientID != nil {
			rc.ID = cfg.ClientID("main")
		}
		rc.Queues = map[string]river.QueueConfig{
			// Maintenance (the schedule materializer) runs off the lanes and
			// needs no quick pickup: it polls at River's default second,
			// which saves a third of an idle process's fetches.
			river.QueueDefault: {MaxWorkers: 2, FetchPollInterval: time.Second},
			// Webhook calls (webhook.go) wait for receivers Herald does not
			// control: a few workers of their own, off the lanes, polling
			// at River's default second (an insert wakes them at once).
			QueueWebhooks: {MaxWorkers: cmp.Or(cfg.WebhookWorkers, DefaultWebhookWorkers), FetchPollInterval: time.Second},
		}
		for _, l := range cfg.Lanes {
			if l.Pool == nil {
				rc.Queues[l.Queue] = cfg.queue(l)
			}
		}
	} else {
		// Insert-only: the job kinds are not registered here, so River
		// cannot check them.
		rc.SkipUnknownJobCheck = true
	}
	// River works in the pool's schema, naming it in every query and
	// notification topic (and River UI reads it from the client).
	rc.Schema = db.PoolSchema(pool)
	client, err := river.NewClient(riverpgxv5.New(pool), rc)
	if err != nil {
		return nil, fmt.Errorf("river client: %w", err)
	}
	return client, nil
}

// RiverClients are a worker process's River clients: Main, on the
// process's pool, and one for each lane with a Pool of its own.
type RiverClients struct {
	Main *river.Client[pgx.Tx]
	// byQueue is the client that works each lane, and poolOf the
	// connections it works on.
	byQueue map[string]*river.Client[pgx.Tx]
	poolOf  map[string]*pgxpool.Pool
	all     []*river.Client[pgx.Tx]
}

// NewRiverClients makes a worker's River clients (cfg.Workers is required).
func NewRiverClients(pool *pgxpool.Pool, cfg RiverConfig) (*RiverClients, error) {
	if cfg.Logger == nil || cfg.Workers == nil {
		return nil, errors.New("jobs: a worker's River clients need Logger and Workers")
	}
	cfg.setDefaults()
	main, err := NewRiverClient(pool, cfg)
	if err != nil {
		return nil, err
	}
	c := &RiverClients{Main: main, byQueue: map[string]*river.Client[pgx.Tx]{}, poolOf: map[string]*pgxpool.Pool{}, all: []*river.Client[pgx.Tx]{main}}
	for _, l := range cfg.Lanes {
		if l.Pool == nil {
			c.byQueue[l.Queue], c.poolOf[l.Queue] = main, pool
			continue
		}
		rc := cfg.base()
		rc.Queues = map[string]river.QueueConfig{l.Queue: cfg.queue(l)}
		cfg.workerConfig(rc)
		if cfg.ClientID != nil {
			rc.ID = cfg.ClientID(l.Queue)
		}
		rc.Schema = db.PoolSchema(l.Pool)
		own, err := river.NewClient(riverpgxv5.New(l.Pool), rc)
		if err != nil {
			return nil, fmt.Errorf("river client of the %s lane: %w", l.Queue, err)
		}
		c.byQueue[l.Queue], c.poolOf[l.Queue] = own, l.Pool
		c.all = append(c.all, own)
	}
	return c, nil
}

// Wakers are the functions that wake each lane at once, each on the
// connections of the client that serves it, so that the urgent lane's wake
// never waits for a connection behind the bulk lane's chunks
// (WakerConfig.Lanes).
func (c *RiverClients) Wakers() map[string]func(context.Context) error {
	wake := map[string]func(context.Context) error{}
	for queue, pool := range c.poolOf {
		wake[queue] = RiverNotify(pool, queue)
	}
	return wake
}

// Start starts every client.
func (c *RiverClients) Start(ctx context.Context) error {
	for _, client := range c.all {
		if err := client.Start(ctx); err != nil {
			return fmt.Errorf("start River: %w", err)
		}
	}
	return nil
}

// Stop stops fetching chunks and lets the running ones finish; River
// cancels those still running after the shutdown timeout
// (RiverConfig.ShutdownTimeout), and each hands itself back, its answers
// written, for another worker to take at once (FanOutWorker.finish). ctx
// bounds the wait beyond that. The clients stop together.
func (c *RiverClients) Stop(ctx context.Context, logger *slog.Logger) {
	var wg sync.WaitGroup
	for _, client := range c.all {
		wg.Go(func() {
			if err := client.Stop(ctx); err != nil {
				logger.Error("River did not stop in time", "error", err)
			}
		})
	}
	wg.Wait()
}

// base is what every River client of Herald's has: the logger, and the
// insert middleware that makes chunks due soon available (availableSoon).
func (c RiverConfig) base() *river.Config {
	return &river.Config{
		Logger:     c.Logger,
		Middleware: []rivertype.Middleware{&availableSoon{lookahead: c.Lookahead, now: time.Now}},
	}
}

// queue is a chunk lane's queue: its workers, and the quick poll that
// bounds pickup lag.
func (c RiverConfig) queue(l Lane) river.QueueConfig {
	return river.QueueConfig{MaxWorkers: l.workers(), FetchPollInterval: c.FetchPollInterval, FetchCooldown: c.fetchCooldown()}
}

// fetchCooldown is the least time between two fetches of a lane: a fifth of
// the poll, from River's least (1 ms) to 10 ms, so that a Waker's call is
// answered at once however long the poll.
func (c RiverConfig) fetchCooldown() time.Duration {
	return min(max(c.FetchPollInterval/5, river.FetchCooldownMin), 10*time.Millisecond)
}

// workerConfig sets what every working client shares.
//
// The periodic materializer is one of those. Only River's leader enqueues
// periodic jobs, and every working client takes part in the election: a
// process's urgent client as much as its main one. Were the materializer
// the main client's alone, a deployment whose leader was an urgent client
// would make no schedule runs at all. Either client enqueues it on the
// default queue, which every worker's main client works.
func (c RiverConfig) workerConfig(rc *river.Config) {
	rc.PeriodicJobs = []*river.PeriodicJob{river.NewPeriodicJob(
		river.PeriodicInterval(c.MaterializeEvery),
		func() (river.JobArgs, *river.InsertOpts) { return MaterializeArgs{}, nil },
		&river.PeriodicJobOpts{RunOnStart: true},
	), river.NewPeriodicJob(
		river.PeriodicInterval(DefaultReconcileEvery),
		func() (river.JobArgs, *river.InsertOpts) { return ReconcileArgs{}, nil },
		nil,
	), river.NewPeriodicJob(
		river.PeriodicInterval(retainEvery(c.Retention)),
		func() (river.JobArgs, *river.InsertOpts) { return RetainArgs{}, nil },
		nil,
	)}
	// River's job cleaner, which also runs on the leader, keeps finished
	// jobs no longer than the retention.
	retainRiverJobs(rc, c.Retention)
	rc.Workers = c.Workers
	rc.FetchPollInterval = c.FetchPollInterval
	rc.FetchCooldown = c.fetchCooldown()
	// A chunk attempt is bounded by ChunkTimeout; a chunk whose process
	// died is rescued once it has been running for RescueAfter, so never
	// while its first attempt may still be sending, and within RescueAfter
	// and River's rescue pass (every 30 s), not River's default hour.
	rc.JobTimeout = c.ChunkTimeout
	rc.RescueStuckJobsAfter = c.RescueAfter
	// A stop (a signal cancelling Start's context, or Stop) is soft: no
	// chunk is fetched any more, the running ones finish and write their
	// ledger, and only those still running after ShutdownTimeout are
	// cancelled. Without it, cancelling Start's context was River's hard
	// stop: every rolling deploy cut the sends in flight.
	rc.SoftStopTimeout = c.ShutdownTimeout
}

// availableSoon is the insert middleware that makes chunk jobs due within
// lookahead available at once, keeping their scheduled_at: River's fetch
// waits for it, so they start on time without its scheduler. It reads the
// host clock, which only decides between this path and the Promoter's; the
// start time itself is judged by the database's clock.
type availableSoon struct {
	river.MiddlewareDefaults
	lookahead time.Duration
	now       func() time.Time
}

func (m *availableSoon) InsertMany(ctx context.Context, params []*rivertype.JobInsertParams,
	doInner func(context.Context) ([]*rivertype.JobInsertResult, error),
) ([]*rivertype.JobInsertResult, error) {
	horizon := m.now().Add(m.lookahead)
	for _, p := range params {
		if slices.Contains(chunkKinds, p.Kind) && p.State == rivertype.JobStateScheduled && p.ScheduledAt != nil && !p.ScheduledAt.After(horizon) {
			p.State = rivertype.JobStateAvailable
		}
	}
	return doInner(ctx)
}
