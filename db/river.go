package db

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// PromoteDueJobs makes jobs of the given queues that are scheduled (or
// waiting to retry) within horizon available, keeping their scheduled_at:
// River's fetch still waits for that instant, so the job starts on time
// without waiting for River's leader to schedule it. At most limit jobs are
// promoted per call; rows another promoter holds are skipped.
//
// It is the one place Herald writes River's table, and only its state
// column, in a transition River makes itself.
func PromoteDueJobs(ctx context.Context, q DBTX, queues []string, horizon time.Duration, limit int) (int64, error) {
	tag, err := q.Exec(ctx, `
		WITH due AS (
			SELECT id FROM river_job
			WHERE state IN ('scheduled', 'retryable')
			  AND queue = ANY ($1::text[])
			  AND scheduled_at <= now() + $2::interval
			ORDER BY scheduled_at
			LIMIT $3
			FOR UPDATE SKIP LOCKED
		)
		UPDATE river_job j SET state = 'available'
		FROM due WHERE j.id = due.id`, queues, horizon, limit)
	if err != nil {
		return 0, fmt.Errorf("promote due jobs: %w", err)
	}
	return tag.RowsAffected(), nil
}

// DueInstant is an instant at which chunk jobs of a queue fall due.
type DueInstant struct {
	Queue string
	At    time.Time
}

// UpcomingDue lists the distinct instants, after now and within horizon, at
// which available jobs of the given queues fall due, soonest first, at most
// limit of them.
func UpcomingDue(ctx context.Context, q DBTX, queues []string, horizon time.Duration, limit int) ([]DueInstant, error) {
	rows, err := q.Query(ctx, `
		SELECT DISTINCT queue, scheduled_at FROM river_job
		WHERE state = 'available'
		  AND queue = ANY ($1::text[])
		  AND scheduled_at > now()
		  AND scheduled_at <= now() + $2::interval
		ORDER BY scheduled_at
		LIMIT $3`, queues, horizon, limit)
	if err != nil {
		return nil, fmt.Errorf("upcoming due jobs: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (DueInstant, error) {
		var d DueInstant
		return d, r.Scan(&d.Queue, &d.At)
	})
	if err != nil {
		return nil, fmt.Errorf("upcoming due jobs: %w", err)
	}
	return out, nil
}

// QueueDepth is how many of River's jobs of a queue are in a state.
type QueueDepth struct {
	Queue, State string
	Jobs         int64
}

// RiverQueueDepth counts River's jobs that are not finished (available,
// scheduled, running, retryable), by queue and state, through River's own
// index on (state, queue, ...): the finished jobs River keeps for a day are
// never read.
func RiverQueueDepth(ctx context.Context, q DBTX) ([]QueueDepth, error) {
	rows, err := q.Query(ctx, `
		SELECT queue, state::text, count(*)
		FROM river_job
		WHERE state IN ('available', 'scheduled', 'running', 'retryable')
		GROUP BY queue, state`)
	if err != nil {
		return nil, fmt.Errorf("count river jobs: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (QueueDepth, error) {
		var d QueueDepth
		err := r.Scan(&d.Queue, &d.State, &d.Jobs)
		return d, err
	})
	if err != nil {
		return nil, fmt.Errorf("count river jobs: %w", err)
	}
	return out, nil
}
