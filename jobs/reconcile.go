package jobs

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"

	"github.com/heraldpush/herald/db"
	"github.com/heraldpush/herald/jobs/push"
)

// ReconcileKind is the River kind of the periodic reconciliation.
const ReconcileKind = "reconcile"

// ReconcileArgs is the periodic reconciliation job; it carries nothing.
type ReconcileArgs struct{}

// Kind implements river.JobArgs.
func (ReconcileArgs) Kind() string { return ReconcileKind }

// InsertOpts keeps one reconciliation waiting or running at a time.
func (ReconcileArgs) InsertOpts() river.InsertOpts {
	return periodicInsertOpts()
}

// Reconciler finds the messages that no chunk will settle any more and
// settles them. A message normally settles with its last chunk; one whose
// chunk jobs were discarded or cancelled (an operator in River UI, a chunk
// that ran out of attempts), deleted, or whose settle was lost, would stay
// scheduled or dispatching for ever, its deliveries pending. Once every
// delivery is past its expiry by Grace, nothing can send them any more:
// the reconciler expires them and settles the message, and counts both
// (herald_reconciled_messages_total, herald_reconciled_deliveries_total).
// The chunks stranded before that, still retryable from River UI, are
// counted at each scrape (herald_stranded_chunks, RegisterMessageMetrics).
//
// It also runs again the chunks that River completed but whose close the
// database lacks (db.RetryUnclosedChunks: a failover to a standby that had
// not received the close), so that what they had sent is sent again and
// written, rather than left pending until the message expires; it counts
// them (herald_reconciled_chunks_total).
type Reconciler struct {
	cfg ReconcilerConfig
}

// ReconcilerConfig configures a Reconciler. Pool and Logger are required.
type ReconcilerConfig struct {
	Pool    *pgxpool.Pool
	Logger  *slog.Logger
	Metrics *Metrics
	// Grace is how long past its expiry a message may stay unsettled: it
	// must exceed a chunk attempt (which may send until its timeout ends)
	// so that no attempt still running is overtaken
	// (DefaultReconcileGrace when zero).
	Grace time.Duration
	// AttemptSpan is the longest a chunk attempt goes on, its close
	// included: a chunk completed longer ago than this without a close is
	// run again (DefaultChunkTimeout and recordTimeout when zero).
	AttemptSpan time.Duration
}

// NewReconciler returns the Reconciler of cfg, its defaults filled, or an
// error naming the setting it cannot work with.
func NewReconciler(cfg *ReconcilerConfig) (*Reconciler, error) {
	c, err := configure(cfg)
	if err != nil {
		return nil, err
	}
	return &Reconciler{cfg: c}, nil
}

// withDefaults fills the settings left zero with their defaults.
func (c *ReconcilerConfig) withDefaults() {
	c.Grace = cmp.Or(c.Grace, DefaultReconcileGrace)
	c.AttemptSpan = cmp.Or(c.AttemptSpan, DefaultChunkTimeout+recordTimeout)
}

// validate names the first setting that no default can mend: a missing
// dependency, or a negative value.
func (c *ReconcilerConfig) validate() error {
	switch {
	case c.Pool == nil:
		return errRequired("ReconcilerConfig.Pool")
	case c.Logger == nil:
		return errRequired("ReconcilerConfig.Logger")
	case c.Grace < 0:
		return errNegative("ReconcilerConfig.Grace", c.Grace)
	case c.AttemptSpan < 0:
		return errNegative("ReconcilerConfig.AttemptSpan", c.AttemptSpan)
	}
	return nil
}

// reconcileBatch bounds the messages one pass settles, each in its own
// transaction.
const reconcileBatch = 100

// Reconciled is what one reconciliation settled, and the chunks it ran
// again.
type Reconciled struct {
	Messages, Deliveries, Chunks int
}

// Run runs again the chunks completed without their close, then settles
// every stuck message, a batch at a time.
func (r *Reconciler) Run(ctx context.Context) (Reconciled, error) {
	var done Reconciled
	unclosed, err := db.RetryUnclosedChunks(ctx, r.cfg.Pool, r.cfg.AttemptSpan,
		"River completed this chunk but the database lacks its close (a failover to a standby that had not received it): run again to send and write what is pending")
	if err != nil {
		return done, err
	}
	for _, c := range unclosed {
		r.cfg.Metrics.reconciledChunk()
		r.cfg.Logger.WarnContext(ctx, "ran again a chunk completed without its close: the database lost what it had written",
			"job_id", c.ID, "queue", c.Queue, "message_id", push.FormatMessageID(c.MessageID), "chunk", c.Chunk)
	}
	done.Chunks = len(unclosed)
	for {
		ids, err := db.On(r.cfg.Pool).StuckMessages(ctx, db.StuckMessagesParams{GraceSeconds: r.cfg.Grace.Seconds(), Batch: reconcileBatch})
		if err != nil {
			return done, fmt.Errorf("find stuck messages: %w", err)
		}
		for _, id := range ids {
			n, err := r.settle(ctx, id)
			if err != nil {
				return done, fmt.Errorf("message %d: %w", id, err)
			}
			done.Messages++
			done.Deliveries += n
		}
		if len(ids) < reconcileBatch {
			return done, nil
		}
	}
}

// settle expires what a stuck message has pending and settles it, with the
// message row locked first (jobs/state.go's lock order for a message that
// may still be scheduled). It returns how many deliveries expired.
func (r *Reconciler) settle(ctx context.Context, id int64) (int, error) {
	var (
		expired []db.ExpireStuckDeliveriesRow
		settled db.SettleMessageRow
	)
	err := db.InTx(ctx, r.cfg.Pool, func(tx pgx.Tx) error {
		q := db.On(tx)
		if _, err := q.LockMessage(ctx, id); err != nil {
			return fmt.Errorf("lock message: %w", err)
		}
		var err error
		if expired, err = q.ExpireStuckDeliveries(ctx, id); err != nil {
			return fmt.Errorf("expire deliveries: %w", err)
		}
		// Settled meanwhile by a chunk: its guard leaves it alone, and the
		// chunk's process graded it.
		settled = db.SettleMessageRow{}
		if settled, err = q.SettleMessage(ctx, id); err != nil && !errors.Is(err, db.ErrNotFound) {
			return fmt.Errorf("settle message: %w", err)
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	n := 0
	for _, e := range expired {
		n += int(e.Expired)
		r.cfg.Metrics.reconciledDeliveries(e.Channel, int(e.Expired))
	}
	r.cfg.Metrics.reconciledMessage()
	r.cfg.Metrics.settled(settled.Priority, settled.SloSkewMs)
	r.cfg.Logger.WarnContext(ctx, "reconciled a message no chunk would settle: its pending deliveries expired",
		"message_id", id, "expired", n)
	return n, nil
}

// ReconcileWorker runs the Reconciler as River's periodic job.
type ReconcileWorker struct {
	river.WorkerDefaults[ReconcileArgs]
	r         *Reconciler
	chunkSize int
}

// Work settles the stuck messages, after removing the completed runs of
// its own kind so that they do not fill River UI's lists.
func (w *ReconcileWorker) Work(ctx context.Context, _ *river.Job[ReconcileArgs]) error {
	if err := db.DeleteCompletedRuns(ctx, w.r.cfg.Pool, ReconcileKind); err != nil {
		return err
	}
	if err := w.r.completeRests(ctx, NewEnqueuer(river.ClientFromContext[pgx.Tx](ctx), w.chunkSize)); err != nil {
		return err
	}
	_, err := w.r.Run(ctx)
	return err
}

// staleRest is how long a message's rest may wait before the reconciler
// writes it: far longer than its request or its backstop job take.
const staleRest = time.Minute

// completeRests writes the rests that neither their request nor their
// backstop job wrote (an operator deleted the job in River UI, or it ran
// out of attempts), so that no message stays unsettled for want of them.
func (r *Reconciler) completeRests(ctx context.Context, e *Enqueuer) error {
	ids, err := db.On(r.cfg.Pool).StaleMessageRests(ctx, time.Now().Add(-staleRest))
	if err != nil {
		return fmt.Errorf("find stale rests: %w", err)
	}
	for _, id := range ids {
		if err := completeRest(ctx, r.cfg.Pool, e, id); err != nil {
			return fmt.Errorf("write the rest of message %d: %w", id, err)
		}
		r.cfg.Logger.WarnContext(ctx, "wrote the rest of a message sent now that its request and backstop did not", "message_id", id)
	}
	return nil
}
