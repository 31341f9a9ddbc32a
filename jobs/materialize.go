package jobs

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"

	"github.com/heraldpush/herald/db"
	"github.com/heraldpush/herald/jobs/wallclock"
)

// MaterializeKind is the River kind of the periodic job that turns schedule
// runs into messages.
const MaterializeKind = "materialize_schedules"

// MaterializeArgs is the periodic materializer job; it carries nothing.
type MaterializeArgs struct{}

// Kind implements river.JobArgs.
func (MaterializeArgs) Kind() string { return MaterializeKind }

// InsertOpts keeps one materializer job waiting or running at a time: a
// slow pass is not joined by a pile of others.
func (MaterializeArgs) InsertOpts() river.InsertOpts {
	return periodicInsertOpts()
}

// periodicInsertOpts are the insert options of Herald's periodic jobs (the
// materializer, the reconciler, retention): one of each waiting or running
// at a time, so that a slow run is not joined by a pile of others.
func periodicInsertOpts() river.InsertOpts {
	return river.InsertOpts{UniqueOpts: river.UniqueOpts{ByState: []rivertype.JobState{
		rivertype.JobStateAvailable, rivertype.JobStatePending, rivertype.JobStateRunning,
		rivertype.JobStateScheduled, rivertype.JobStateRetryable,
	}}}
}

// Materializer makes each due schedule run into an ordinary message, through
// the same Enqueuer as POST /v1/messages, exactly once per (schedule, run):
// schedules are locked while they are worked (two materializers skip each
// other's), and the messages table is unique on (schedule_id,
// schedule_run_at) should anything else slip.
type Materializer struct {
	cfg MaterializerConfig
}

// MaterializerConfig configures a Materializer. Pool and Logger are
// required.
type MaterializerConfig struct {
	Pool   *pgxpool.Pool
	Logger *slog.Logger
	// ChunkSize is the devices per chunk of the runs' messages
	// (DefaultChunkSize when zero).
	ChunkSize int
	// Lead is how far ahead runs are made (DefaultScheduleLead when zero).
	Lead time.Duration
	// Limits caps the runs of one schedule made and not started
	// (Limits.MaxAhead; defaults when zero).
	Limits ScheduleLimits
	// Now is the authoritative clock; the database's when nil. Tests
	// inject one.
	Now func(ctx context.Context) (time.Time, error)
}

// NewMaterializer returns the Materializer of cfg, its defaults filled, or
// an error naming the setting it cannot work with.
func NewMaterializer(cfg *MaterializerConfig) (*Materializer, error) {
	c, err := configure(cfg)
	if err != nil {
		return nil, err
	}
	return &Materializer{cfg: c}, nil
}

// withDefaults fills the settings left zero with their defaults.
func (c *MaterializerConfig) withDefaults() {
	c.ChunkSize = cmp.Or(c.ChunkSize, DefaultChunkSize)
	c.Lead = cmp.Or(c.Lead, DefaultScheduleLead)
	c.Limits = c.Limits.WithDefaults()
}

// validate names the first setting that no default can mend: a missing
// dependency, or a negative value.
func (c *MaterializerConfig) validate() error {
	switch {
	case c.Pool == nil:
		return errRequired("MaterializerConfig.Pool")
	case c.Logger == nil:
		return errRequired("MaterializerConfig.Logger")
	case c.ChunkSize < 0:
		return fmt.Errorf("jobs: MaterializerConfig.ChunkSize is %d; it must not be negative (zero takes the default)", c.ChunkSize)
	case c.Lead < 0:
		return errNegative("MaterializerConfig.Lead", c.Lead)
	}
	if err := c.Limits.Validate(); err != nil {
		return fmt.Errorf("jobs: MaterializerConfig.Limits: %w", err)
	}
	return nil
}

// Run makes every run due within the lead and returns how many it made.
// A run whose lifetime (ttl_seconds) ended before it could be made is
// recorded as an expired message and not sent; one whose lifetime has not
// ended is sent, late, and its skew shows it.
// Chunk jobs are enqueued through client, the River client.
func (m *Materializer) Run(ctx context.Context, client jobClient) (int, error) {
	enq := NewEnqueuer(client, m.cfg.ChunkSize)
	now, err := m.now(ctx)
	if err != nil {
		return 0, err
	}
	made := 0
	for {
		n, err := m.pass(ctx, enq, now, now.Add(m.cfg.Lead))
		made += n
		if err != nil || n == 0 {
			return made, err
		}
	}
}

func (m *Materializer) now(ctx context.Context) (time.Time, error) {
	if m.cfg.Now != nil {
		return m.cfg.Now(ctx)
	}
	return db.On(m.cfg.Pool).DatabaseNow(ctx)
}

// pass makes at most one run of each due schedule that has fewer than
// Limits.MaxAhead runs waiting, in one transaction.
func (m *Materializer) pass(ctx context.Context, enq *Enqueuer, now, horizon time.Time) (int, error) {
	made := 0
	err := db.InTx(ctx, m.cfg.Pool, func(tx pgx.Tx) error {
		made = 0
		q := db.On(tx)
		due, err := q.DueSchedules(ctx, db.DueSchedulesParams{
			Horizon: horizon, LocalHorizon: horizon.Add(localTimeSpread),
			UnstartedSince: now.Add(-localTimeSpread), MaxAhead: int32(m.cfg.Limits.MaxAhead),
		})
		if err != nil {
			return fmt.Errorf("find due schedules: %w", err)
		}
		for _, s := range due {
			if err := m.materialize(ctx, tx, enq, s, now); err != nil {
				return fmt.Errorf("schedule %d: %w", s.ID, err)
			}
			made++
		}
		return nil
	})
	return made, err
}

func (m *Materializer) materialize(ctx context.Context, tx pgx.Tx, enq *Enqueuer, s db.Schedule, now time.Time) error {
	q := db.On(tx)
	runAt := *s.NextRunAt
	c, err := ScheduleCron(s.Cron, s.Timezone)
	if err != nil {
		return err
	}
	loc := c.Location()
	ttl := time.Duration(s.TtlSeconds) * time.Second
	span := RunSpan(ttl, s.LocalTime)
	exists, err := q.RunExists(ctx, db.RunExistsParams{ScheduleID: &s.ID, RunAt: &runAt})
	if err != nil {
		return fmt.Errorf("find run: %w", err)
	}
	if !exists {
		var audience Audience
		if err := json.Unmarshal(s.Audience, &audience); err != nil {
			return err
		}
		msg := MessageSpec{
			Priority: s.Priority, DispatchAt: runAt, ExpiresAt: runAt.Add(ttl),
			Audience: audience, AudienceJSON: s.Audience,
			PayloadID: s.PayloadID, ScheduleID: &s.ID, ScheduleRunAt: &runAt,
			Category: s.Category, QuietHours: s.QuietHours,
		}
		// The run's last delivery can be made until its span has passed.
		lastChance := runAt.Add(span)
		if s.LocalTime {
			// The run's wall time, at each recipient's in their own zone;
			// the latest zone reaches it localTimeSpread after the earliest.
			fallback, err := time.LoadLocation(s.FallbackTimezone)
			if err != nil {
				return fmt.Errorf("fallback zone %q: %w", s.FallbackTimezone, err)
			}
			spec, _ := json.Marshal(map[string]any{
				"deliver_at_local": wallclock.Of(runAt, loc).Format("2006-01-02T15:04:05"), "fallback_timezone": s.FallbackTimezone,
				"if_passed": s.IfPassed, "ttl_seconds": s.TtlSeconds,
			})
			msg.LocalTime = &LocalTime{
				Wall: wallclock.Of(runAt, loc), Fallback: fallback, SendNow: s.IfPassed == "send_now",
				Now: now, Lifetime: ttl, JSON: spec,
			}
		}
		if !lastChance.After(now) {
			_, err = enq.RecordMissed(ctx, tx, msg)
		} else {
			_, err = enq.Create(ctx, tx, msg)
		}
		if errors.Is(err, ErrUnknownSegment) {
			// The segment was removed since: the run reaches nobody.
			msg.Audience = Audience{}
			_, err = enq.Create(ctx, tx, msg)
		}
		if err != nil {
			return err
		}
	}
	var next *time.Time
	if n, ok := c.NextRun(runAt, s.EndsAt, span); ok {
		next = &n
	}
	return q.AdvanceSchedule(ctx, db.AdvanceScheduleParams{ID: s.ID, NextRunAt: next})
}

// MaterializeWorker runs the Materializer as River's periodic job.
type MaterializeWorker struct {
	river.WorkerDefaults[MaterializeArgs]
	m *Materializer
}

// Work makes the due runs, after removing the completed runs of its own
// kind: one every 15 s, kept a day by River, would bury the chunk jobs in
// River UI's lists.
func (w *MaterializeWorker) Work(ctx context.Context, _ *river.Job[MaterializeArgs]) error {
	if err := db.DeleteCompletedRuns(ctx, w.m.cfg.Pool, MaterializeKind); err != nil {
		return err
	}
	n, err := w.m.Run(ctx, river.ClientFromContext[pgx.Tx](ctx))
	if n > 0 {
		w.m.cfg.Logger.InfoContext(ctx, "materialized schedule runs", "runs", n)
	}
	return err
}
