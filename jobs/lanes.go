package jobs

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivertype"
)

// Lanes: each priority has its own River queue and its own workers, so that
// a one-device urgent message never waits behind a bulk fan-out.
const (
	QueueUrgent = "urgent"
	QueueBulk   = "bulk"
)

// Priorities a message may have; each names its lane.
const (
	PriorityUrgent = "urgent"
	PriorityBulk   = "bulk"
)

// Lanes are the chunk lanes a worker process serves. A deployment that must
// keep urgent pushes fast while its workers are saturated by bulk fan-outs
// runs some processes with the urgent lane alone: inside one process the
// lanes share the Go scheduler, and nothing there puts an urgent goroutine
// ahead of a bulk one (README, "Sizing").
type Lanes struct{ Urgent, Bulk bool }

// AllLanes is what a worker serves unless told otherwise.
var AllLanes = Lanes{Urgent: true, Bulk: true}

// ParseLanes reads a comma-separated list of lanes ("urgent", "bulk");
// empty means both.
func ParseLanes(s string) (Lanes, error) {
	if strings.TrimSpace(s) == "" {
		return AllLanes, nil
	}
	var l Lanes
	for _, name := range strings.Split(s, ",") {
		switch strings.TrimSpace(name) {
		case QueueUrgent:
			l.Urgent = true
		case QueueBulk:
			l.Bulk = true
		default:
			return Lanes{}, fmt.Errorf("unknown lane %q: the lanes are urgent and bulk, comma-separated", strings.TrimSpace(name))
		}
	}
	return l, nil
}

// queues are the River queues of the lanes.
func (l Lanes) queues() []string {
	var queues []string
	if l.Urgent {
		queues = append(queues, QueueUrgent)
	}
	if l.Bulk {
		queues = append(queues, QueueBulk)
	}
	return queues
}

// String lists the lanes as ParseLanes reads them.
func (l Lanes) String() string { return strings.Join(l.queues(), ",") }

func laneQueue(priority string) string {
	if priority == PriorityUrgent {
		return QueueUrgent
	}
	return QueueBulk
}

// RiverConfig configures Herald's River client.
type RiverConfig struct {
	Logger *slog.Logger
	// Workers holds the job workers. Nil makes an insert-only client (the
	// api role), which enqueues but works nothing.
	Workers *river.Workers
	// UrgentWorkers and BulkWorkers are each lane's concurrent chunk jobs
	// per process. Defaults 10 and 50: enough bulk workers that every chunk
	// of a 25,000-device message starts at once, leaving the providers'
	// in-flight limits to bound the real concurrency (see README, Sizing).
	UrgentWorkers, BulkWorkers int
	// FetchPollInterval is how often each lane looks for due chunks; it
	// bounds the lag between a chunk's time and its start. Default 50 ms.
	FetchPollInterval time.Duration
	// Lookahead is how long before its time a chunk is made available to
	// fetch (fetching still waits for its time). Default 10 s.
	Lookahead time.Duration
	// ChunkTimeout bounds a chunk attempt (default 30 s); RescueAfter is
	// how long a chunk may run before River, finding its process gone,
	// retries it (default 1 min). RescueAfter must exceed ChunkTimeout.
	ChunkTimeout, RescueAfter time.Duration
	// MaterializeEvery is how often River's leader runs the schedule
	// materializer (default 15 s); it is a fraction of the schedule lead, so
	// a run is made several passes before it is due.
	MaterializeEvery time.Duration
	// Retention is how long settled messages and finished jobs are kept
	// (DefaultRetention when zero): the retention job's period follows from
	// it, and River's job cleaner never keeps a finished job longer.
	Retention time.Duration
	// UrgentPool, when set, gives the urgent lane a River client of its own
	// on these connections (NewUrgentRiverClient), and the client
	// NewRiverClient returns leaves the urgent queue to it.
	UrgentPool *pgxpool.Pool
	// Lanes are the lanes a working client serves; zero means both.
	Lanes Lanes
}

func (c *RiverConfig) setDefaults() {
	if c.Lanes == (Lanes{}) {
		c.Lanes = AllLanes
	}
	if c.UrgentWorkers <= 0 {
		c.UrgentWorkers = 10
	}
	if c.BulkWorkers <= 0 {
		c.BulkWorkers = 50
	}
	if c.FetchPollInterval <= 0 {
		c.FetchPollInterval = 50 * time.Millisecond
	}
	if c.Lookahead <= 0 {
		c.Lookahead = 10 * time.Second
	}
	if c.ChunkTimeout <= 0 {
		c.ChunkTimeout = 30 * time.Second
	}
	if c.RescueAfter <= 0 {
		c.RescueAfter = time.Minute
	}
	if c.MaterializeEvery <= 0 {
		c.MaterializeEvery = 15 * time.Second
	}
	if c.Retention <= 0 {
		c.Retention = DefaultRetention
	}
}

// NewRiverClient returns the River client for pool, with the lanes cfg.Lanes
// names when it has workers (the urgent one only when it has no UrgentPool).
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
		rc.Queues = map[string]river.QueueConfig{
			// Maintenance (the schedule materializer) runs off the lanes and
			// needs no quick pickup: it polls at River's default second,
			// which saves a third of an idle process's fetches.
			river.QueueDefault: {MaxWorkers: 2, FetchPollInterval: time.Second},
		}
		if cfg.Lanes.Bulk {
			rc.Queues[QueueBulk] = cfg.lane(cfg.BulkWorkers)
		}
		if cfg.Lanes.Urgent && cfg.UrgentPool == nil {
			rc.Queues[QueueUrgent] = cfg.lane(cfg.UrgentWorkers)
		}
	} else {
		// Insert-only: the job kinds are not registered here, so River
		// cannot check them.
		rc.SkipUnknownJobCheck = true
	}
	client, err := river.NewClient(riverpgxv5.New(pool), rc)
	if err != nil {
		return nil, fmt.Errorf("river client: %w", err)
	}
	return client, nil
}

// NewUrgentRiverClient returns the urgent lane's own River client, on
// cfg.UrgentPool: at the instant a bulk message is due, its chunks take
// every connection of the shared pool, and the urgent lane's fetches and
// completions would queue behind them.
func NewUrgentRiverClient(cfg RiverConfig) (*river.Client[pgx.Tx], error) {
	if cfg.Logger == nil || cfg.Workers == nil || cfg.UrgentPool == nil {
		return nil, errors.New("jobs: the urgent lane's River client needs Logger, Workers and UrgentPool")
	}
	cfg.setDefaults()
	rc := cfg.base()
	rc.Queues = map[string]river.QueueConfig{QueueUrgent: cfg.lane(cfg.UrgentWorkers)}
	cfg.workerConfig(rc)
	client, err := river.NewClient(riverpgxv5.New(cfg.UrgentPool), rc)
	if err != nil {
		return nil, fmt.Errorf("urgent river client: %w", err)
	}
	return client, nil
}

// base is what every River client of Herald's has: the logger, and the
// insert middleware that makes chunks due soon available (availableSoon).
func (c RiverConfig) base() *river.Config {
	return &river.Config{
		Logger:     c.Logger,
		Middleware: []rivertype.Middleware{&availableSoon{lookahead: c.Lookahead, now: time.Now}},
	}
}

// lane is a chunk lane's queue: workers, and the quick poll that bounds
// pickup lag.
func (c RiverConfig) lane(workers int) river.QueueConfig {
	return river.QueueConfig{MaxWorkers: workers, FetchPollInterval: c.FetchPollInterval, FetchCooldown: c.fetchCooldown()}
}

// fetchCooldown is the least time between two fetches of a lane: a fifth of
// the poll, from River's least (1 ms) to 10 ms, so that a Waker's call is
// answered at once however long the poll.
func (c RiverConfig) fetchCooldown() time.Duration {
	return min(max(c.FetchPollInterval/5, river.FetchCooldownMin), 10*time.Millisecond)
}

// workerConfig sets what every working client shares.
//
// The periodic jobs (the materializer, retention) are among those. Only River's leader enqueues
// periodic jobs, and every working client takes part in the election: a
// process's urgent client as much as its main one. Were the materializer
// the main client's alone, a deployment whose leader was an urgent client
// would make no schedule runs at all. Either client enqueues it on the
// default queue, which every worker's main client works. So is River's job
// cleaner, which also runs on the leader.
func (c RiverConfig) workerConfig(rc *river.Config) {
	rc.PeriodicJobs = []*river.PeriodicJob{river.NewPeriodicJob(
		river.PeriodicInterval(c.MaterializeEvery),
		func() (river.JobArgs, *river.InsertOpts) { return MaterializeArgs{}, nil },
		&river.PeriodicJobOpts{RunOnStart: true},
	), river.NewPeriodicJob(
		river.PeriodicInterval(retainEvery(c.Retention)),
		func() (river.JobArgs, *river.InsertOpts) { return RetainArgs{}, nil },
		nil,
	)}
	retainRiverJobs(rc, c.Retention)
	rc.Workers = c.Workers
	rc.FetchPollInterval = c.FetchPollInterval
	rc.FetchCooldown = c.fetchCooldown()
	// A chunk attempt is bounded by ChunkTimeout (30 s); a chunk whose
	// process died is rescued once it has been running for RescueAfter (a
	// minute), so never while its first attempt may still be sending, and
	// within about 90 s (River's rescuer looks every 30 s), not River's
	// default hour.
	rc.JobTimeout = c.ChunkTimeout
	rc.RescueStuckJobsAfter = c.RescueAfter
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
		if p.Kind == FanOutKind && p.State == rivertype.JobStateScheduled && p.ScheduledAt != nil && !p.ScheduledAt.After(horizon) {
			p.State = rivertype.JobStateAvailable
		}
	}
	return doInner(ctx)
}
