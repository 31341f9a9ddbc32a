package db

// Every statement of Herald's that reads or writes River's own tables, or
// speaks River's notification protocol, is in this file, and nowhere else:
// River keeps its schema to itself and may change it in any release, so
// these are the exceptions to using River's public API only, each pinned by
// a test in river_test.go against the River this binary embeds. Upgrading
// River means reading those tests' failures first.

import (
	"context"
	"errors"
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

// FailingChunks counts, by queue, the live jobs of kinds (available,
// scheduled, running or retryable: not finished) whose last `attempts`
// attempts each ended in an error: a job River cannot decode, one whose
// work panics or errors every time, one whose worker dies under it (River's
// rescue and Herald's takeover record an error for the attempt). An attempt
// that completed breaks the run (a job retried by hand after it completed
// keeps its attempt count). A snooze is no attempt: River gives the attempt
// back when a job snoozes (its attempt number goes down by one), so a chunk
// parked behind a breaker or waiting for a throttle, however often, never
// counts, nor one that failed fewer times before it parked; parks between
// errors neither count nor break their run. A running job's attempt under
// way has not ended: its last attempts are those before it. River writes
// each attempt's error with that attempt's number
// (rivertype.AttemptError.Attempt); TestFailingChunksAreRiversFailedAttempts
// pins both against the River this binary embeds. Only live jobs are read,
// through River's index on their state, never the finished history.
func FailingChunks(ctx context.Context, q DBTX, kinds []string, attempts int) (map[string]int64, error) {
	rows, err := q.Query(ctx, `
		SELECT j.queue, count(*)
		FROM river_job j
		CROSS JOIN LATERAL (SELECT j.attempt - (j.state = 'running')::int AS ended) a
		WHERE j.state IN ('available', 'scheduled', 'running', 'retryable')
		  AND j.kind = ANY ($1::text[])
		  AND a.ended >= $2
		  AND (SELECT count(DISTINCT (e->>'attempt')::int) FROM unnest(j.errors) e
		       WHERE (e->>'attempt')::int > a.ended - $2 AND (e->>'attempt')::int <= a.ended) = $2
		GROUP BY j.queue`, kinds, attempts)
	if err != nil {
		return nil, fmt.Errorf("count failing chunks: %w", err)
	}
	out := map[string]int64{}
	var (
		queue string
		n     int64
	)
	if _, err := pgx.ForEachRow(rows, []any{&queue, &n}, func() error {
		out[queue] = n
		return nil
	}); err != nil {
		return nil, fmt.Errorf("count failing chunks: %w", err)
	}
	return out, nil
}

// NotifyRiverInsert sends River's insert notification for queue, as
// River's own insert of an available job sends it: the River clients of
// schema that serve queue fetch at once instead of at their next poll.
// River keeps the topic (its schema, then ".river_insert") and the payload
// ({"queue": ...}) to itself; TestRiverInsertNotificationIsRivers pins them
// against the River this binary embeds.
func NotifyRiverInsert(ctx context.Context, q DBTX, schema, queue string) error {
	if _, err := q.Exec(ctx, `SELECT pg_notify($1 || '.river_insert', json_build_object('queue', $2::text)::text)`, schema, queue); err != nil {
		return fmt.Errorf("notify river of queue %s: %w", queue, err)
	}
	return nil
}

// StrandedChunks counts the chunks of unsettled messages that still have
// pending deliveries and that no River job will run: their job was
// discarded or cancelled (in River UI, or after its last attempt), or
// deleted. Retried from River UI before their expiry they send what is
// pending; otherwise the reconciler expires them once their message is past
// its expiry.
//
// A chunk's deliveries are found by walking its message's part of the
// ledger, so only the chunks without a live job are looked at (the
// materialized step): during a fan-out the finished chunks of a message
// still dispatching are many, and each walk reads the whole message.
func StrandedChunks(ctx context.Context, q DBTX) (int64, error) {
	var n int64
	err := q.QueryRow(ctx, `
		WITH idle AS MATERIALIZED (
			SELECT mc.message_id, mc.chunk
			FROM message_chunks mc
			JOIN messages m ON m.id = mc.message_id
			LEFT JOIN river_job j ON j.id = mc.job_id
			WHERE m.state IN ('scheduled', 'dispatching')
			  AND (j.id IS NULL OR j.state IN ('discarded', 'cancelled'))
		)
		SELECT count(*)
		FROM idle
		WHERE EXISTS (
			SELECT 1 FROM deliveries d
			WHERE d.message_id = idle.message_id AND d.chunk = idle.chunk AND d.status = 'pending')
		   -- A chunk's snapshot (migration 0022) holds a device without a
		   -- settled row.
		   OR EXISTS (
			SELECT 1 FROM chunk_devices c CROSS JOIN LATERAL unnest(c.devices) AS s(id)
			WHERE c.message_id = idle.message_id AND c.chunk = idle.chunk
			  AND NOT EXISTS (SELECT 1 FROM deliveries d
			                  WHERE d.message_id = c.message_id AND d.device_id = s.id AND d.status <> 'pending')
			  -- Nor one accepted in a run of the chunk (migration 0028).
			  AND s.id NOT IN (SELECT unnest(r.devices) FROM accepted_runs r
			                   WHERE r.message_id = c.message_id AND r.chunk = c.chunk))`).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("count stranded chunks: %w", err)
	}
	return n, nil
}

// DeleteCompletedRuns deletes the completed jobs of a periodic kind. Herald's
// periodic jobs (the schedule materializer every 15 s, the reconciler) call
// it as each run starts: River keeps completed jobs for a day, and thousands
// of them a day would bury the chunk jobs in River UI's lists. A run that
// failed stays, for the operator to see.
func DeleteCompletedRuns(ctx context.Context, q DBTX, kind string) error {
	if _, err := q.Exec(ctx, `DELETE FROM river_job WHERE kind = $1 AND state = 'completed'`, kind); err != nil {
		return fmt.Errorf("delete completed %s jobs: %w", kind, err)
	}
	return nil
}

// LivenessLockSpace is the first key of the session advisory locks by which
// worker processes say they are alive (pg_advisory_lock(LivenessLockSpace,
// key)): "HRLD".
const LivenessLockSpace int32 = 0x48524c44

// AbandonedChunk is a running job whose worker process is gone.
type AbandonedChunk struct {
	ID int64
	// ClientID is the River client that ran it (the last of attempted_by).
	ClientID string
	Queue    string
}

// AbandonedChunks lists the running jobs of kind whose last attempt was
// made by a River client of a worker process that no longer holds its
// liveness lock. A worker's clients are named herald-<key>-<name>, key its
// lock's second key (jobs.Liveness); a client named otherwise (an older
// release, a client of River's own naming) is never listed: River's rescue
// after RescueAfter still covers it. PostgreSQL releases a session's
// advisory locks when the session ends, which it notices at once for a
// process killed on the database's machine or another's (the socket
// closes), so a dead worker's chunks show here within moments.
func AbandonedChunks(ctx context.Context, q DBTX, kinds []string) ([]AbandonedChunk, error) {
	rows, err := q.Query(ctx, `
		SELECT j.id, j.attempted_by[cardinality(j.attempted_by)], j.queue
		FROM river_job j
		WHERE j.state = 'running' AND j.kind = ANY ($1::text[])
		  AND j.attempted_by[cardinality(j.attempted_by)] ~ '^herald-[0-9]{1,10}-'
		  AND NOT EXISTS (
			SELECT 1 FROM pg_locks l
			WHERE l.locktype = 'advisory' AND l.granted
			  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
			  AND l.classid = $2::bigint::oid AND l.objsubid = 2
			  AND l.objid = split_part(j.attempted_by[cardinality(j.attempted_by)], '-', 2)::bigint::oid)`,
		kinds, int64(LivenessLockSpace))
	if err != nil {
		return nil, fmt.Errorf("list abandoned chunks: %w", err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowToStructByPos[AbandonedChunk])
	if err != nil {
		return nil, fmt.Errorf("list abandoned chunks: %w", err)
	}
	return out, nil
}

// EndSilentLiveness ends the sessions that hold a liveness lock but have
// not been heard from for lease: idle since their last statement, when a
// living worker pings its lock's session every DefaultLivenessPing. Such a
// worker is frozen (a stopped process, a stalled VM) or cut off from the
// database (its host lost power or its network), and PostgreSQL, which
// keeps a session until its socket closes, would keep the lock, and with
// it the worker's chunks, until River's rescue. Ending the session frees
// the lock, so that AbandonedChunks lists the worker's chunks; the worker
// itself stopped sending a lease earlier (its fence), and takes a lock
// again if it comes back. It returns the liveness keys whose sessions it
// ended. The other sessions of the same role may be ended by any of them;
// sessions whose activity PostgreSQL does not track are never ended.
func EndSilentLiveness(ctx context.Context, q DBTX, lease time.Duration) ([]int64, error) {
	rows, err := q.Query(ctx, `
		WITH silent AS MATERIALIZED (
			SELECT l.objid::bigint AS key, a.pid
			FROM pg_locks l
			JOIN pg_stat_activity a ON a.pid = l.pid
			WHERE l.locktype = 'advisory' AND l.granted
			  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
			  AND l.classid = $1::bigint::oid AND l.objsubid = 2
			  AND a.pid <> pg_backend_pid()
			  AND a.state = 'idle' AND a.state_change < clock_timestamp() - $2::interval)
		-- The candidates are chosen first, in full (MATERIALIZED), so that
		-- no other session is ever ended.
		SELECT key FROM silent WHERE pg_terminate_backend(pid)`,
		int64(LivenessLockSpace), lease)
	if err != nil {
		return nil, fmt.Errorf("end silent liveness sessions: %w", err)
	}
	keys, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, fmt.Errorf("end silent liveness sessions: %w", err)
	}
	return keys, nil
}

// retryEntry is an entry of a River job's errors saying why Herald made
// it available again (RetakeChunk, RetryUnclosedChunks), in River's own
// shape, reason its parameter: River UI lists it among the attempt's
// errors.
func retryEntry(reason string) string {
	return `array_append(errors, jsonb_build_object('at', now(), 'attempt', attempt, 'error', ` + reason + `::text, 'trace', ''))`
}

// RetakeChunk makes a running job whose worker is gone available again at
// once, as River's rescuer would after RescueAfter, with an error entry
// that says why: only if it is still running under the same client, so a
// job that finished or moved on meanwhile is left alone. It reports
// whether the job was taken.
func RetakeChunk(ctx context.Context, q DBTX, c AbandonedChunk, reason string) (bool, error) {
	tag, err := q.Exec(ctx, `
		UPDATE river_job
		SET state = 'available', scheduled_at = now(), errors = `+retryEntry("$3")+`
		WHERE id = $1 AND state = 'running'
		  AND attempted_by[cardinality(attempted_by)] = $2`, c.ID, c.ClientID, reason)
	if err != nil {
		return false, fmt.Errorf("retake chunk %d: %w", c.ID, err)
	}
	return tag.RowsAffected() == 1, nil
}

// UnclosedChunk is a chunk job River completed whose close its message
// lacks.
type UnclosedChunk struct {
	ID        int64
	Queue     string
	MessageID int64
	Chunk     int32
}

// RetryUnclosedChunks makes available again, at once, the chunk jobs of
// unsettled messages that River marked completed at least span ago while
// their chunk's close (message_chunks.finished_at, written by the ledger
// writer before the attempt returns) is missing, with an error entry that
// says why. On one server the completion always follows the close. The
// close goes missing when the database fails over to a standby that had
// not yet received it: the attempt returned, and River's completer,
// trying again, wrote the completion on the promoted standby. The
// chunk's deliveries whose answers went with the close are then pending
// with no attempt to send them; run again, the chunk sends them. span is
// the longest an attempt goes on, so that a chunk completed by an attempt
// that had lost it to another worker (FanOutWorker.afterFence) is left to
// that attempt to close, and retried only if it does not. The message's
// state is read through messages_state_id_idx, as StuckMessages does.
// River's JobRetry makes the same change to the job's columns.
func RetryUnclosedChunks(ctx context.Context, q DBTX, span time.Duration, reason string) ([]UnclosedChunk, error) {
	rows, err := q.Query(ctx, `
		WITH unclosed AS MATERIALIZED (
			SELECT j.id, mc.message_id, mc.chunk
			FROM messages m
			JOIN message_chunks mc ON mc.message_id = m.id
			JOIN river_job j ON j.id = mc.job_id
			WHERE m.state IN ('scheduled', 'dispatching')
			  AND m.dispatch_at < clock_timestamp() - $1::interval
			  AND mc.finished_at IS NULL
			  AND j.state = 'completed' AND j.finalized_at < clock_timestamp() - $1::interval)
		UPDATE river_job j
		SET state = 'available', scheduled_at = now(), finalized_at = NULL,
		    max_attempts = CASE WHEN j.attempt >= j.max_attempts THEN j.attempt + 1 ELSE j.max_attempts END,
		    metadata = j.metadata - 'cancel_attempted_at', errors = `+retryEntry("$2")+`
		FROM unclosed u
		WHERE j.id = u.id AND j.state = 'completed'
		RETURNING j.id, j.queue, u.message_id, u.chunk`, span, reason)
	if err != nil {
		return nil, fmt.Errorf("retry unclosed chunks: %w", err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowToStructByPos[UnclosedChunk])
	if err != nil {
		return nil, fmt.Errorf("retry unclosed chunks: %w", err)
	}
	return out, nil
}

// TryLivenessLock takes this session's liveness lock (LivenessLockSpace,
// key) if no other session holds it.
func TryLivenessLock(ctx context.Context, conn *pgx.Conn, key int32) (bool, error) {
	var ok bool
	if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock($1::int, $2::int)`, LivenessLockSpace, key).Scan(&ok); err != nil {
		return false, fmt.Errorf("take the liveness lock: %w", err)
	}
	return ok, nil
}

// ChunkAttemptOwned says whether job is still running the attempt that
// client made: false once another worker has taken it over (RetakeChunk,
// then a fetch) or it ended.
func ChunkAttemptOwned(ctx context.Context, q DBTX, job int64, client string) (bool, error) {
	var owned bool
	err := q.QueryRow(ctx, `
		SELECT state = 'running' AND attempted_by[cardinality(attempted_by)] = $2
		FROM river_job WHERE id = $1`, job, client).Scan(&owned)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("read chunk %d's attempt: %w", job, err)
	}
	return owned, nil
}

// WALPosition is the cluster's current WAL write position, in bytes since
// its start: two readings' difference is the WAL written between them.
func WALPosition(ctx context.Context, q DBTX) (int64, error) {
	var at int64
	if err := q.QueryRow(ctx, `SELECT (pg_current_wal_lsn() - '0/0'::pg_lsn)::bigint`).Scan(&at); err != nil {
		return 0, fmt.Errorf("read the WAL position: %w", err)
	}
	return at, nil
}
