-- name: InsertSchedule :one
INSERT INTO schedules (cron, timezone, audience, payload_id, priority, ttl_seconds, local_time,
                       fallback_timezone, if_passed, starts_at, ends_at, next_run_at, category, quiet_hours)
VALUES (@cron, @timezone, @audience, @payload_id, @priority, @ttl_seconds, @local_time,
        @fallback_timezone, @if_passed, @starts_at, @ends_at, @next_run_at,
        coalesce(nullif(@category::text, ''), 'default'), coalesce(nullif(@quiet_hours::text, ''), 'hold'))
RETURNING *;

-- name: GetSchedule :one
SELECT * FROM schedules WHERE id = @id AND deleted_at IS NULL;

-- name: ListSchedules :many
SELECT * FROM schedules
WHERE deleted_at IS NULL AND id < @before_id
ORDER BY id DESC
LIMIT @page_size;

-- name: SetSchedulePaused :one
-- Pausing stops new runs; resuming starts again from the next run after
-- now (runs that fell in the pause are skipped, not made up).
UPDATE schedules
SET paused = @paused,
    next_run_at = CASE WHEN @paused::boolean THEN next_run_at ELSE @next_run_at END,
    updated_at = clock_timestamp()
WHERE id = @id AND deleted_at IS NULL
RETURNING *;

-- name: DeleteSchedule :execrows
UPDATE schedules SET deleted_at = clock_timestamp(), updated_at = clock_timestamp()
WHERE id = @id AND deleted_at IS NULL;

-- name: UnstartedRuns :many
-- A schedule's runs that have been made into messages but not started.
SELECT id FROM messages WHERE schedule_id = @schedule_id AND state = 'scheduled' ORDER BY id;

-- name: DueSchedules :many
-- Schedules with a run within the lead, locked so that two materializers
-- never work the same schedule at once. The runs of a local-time schedule
-- are made earlier still (local_horizon), because the zones furthest
-- east reach the wall time of a run up to 26 hours before the zone of the
-- schedule does. A schedule with max_ahead runs made and not started waits
-- until some start: it is left out here, so that it neither gets more nor
-- holds a place that another due schedule needs. Its waiting runs are
-- counted among those since unstarted_since (the unique index on
-- (schedule_id, schedule_run_at) finds them without reading its history);
-- a run older than that and still not started is late, not ahead.
SELECT * FROM schedules
WHERE deleted_at IS NULL AND NOT paused AND next_run_at IS NOT NULL
  AND next_run_at <= (CASE WHEN local_time THEN sqlc.arg(local_horizon)::timestamptz ELSE sqlc.arg(horizon)::timestamptz END)
  AND (SELECT count(*) FROM messages m
       WHERE m.schedule_id = schedules.id AND m.schedule_run_at >= sqlc.arg(unstarted_since)::timestamptz
         AND m.state = 'scheduled') < sqlc.arg(max_ahead)::integer
ORDER BY next_run_at
LIMIT 100
FOR UPDATE SKIP LOCKED;

-- name: AdvanceSchedule :exec
UPDATE schedules SET next_run_at = @next_run_at, updated_at = clock_timestamp() WHERE id = @id;

-- name: RunExists :one
SELECT EXISTS (SELECT 1 FROM messages WHERE schedule_id = @schedule_id AND schedule_run_at = @run_at)::boolean;

-- name: PendingRuns :many
-- The runs of the given schedules that have been made into messages and
-- not started, earliest first, at most per_schedule of each: what a
-- schedule will send before its next_run_at. The unique index on
-- (schedule_id, schedule_run_at) finds them.
SELECT schedule_id, schedule_run_at, id AS message_id FROM (
    SELECT schedule_id, schedule_run_at, id,
           row_number() OVER (PARTITION BY schedule_id ORDER BY schedule_run_at) AS n
    FROM messages
    WHERE schedule_id = ANY (@schedule_ids::bigint[]) AND state = 'scheduled'
) runs
WHERE n <= @per_schedule::integer
ORDER BY schedule_id, schedule_run_at;

-- name: LockScheduleCount :exec
-- Taken by every creation of a schedule, in its transaction: creations
-- count the live schedules one at a time, so that racing ones cannot all
-- see room for one more.
SELECT pg_advisory_xact_lock(hashtextextended('herald:schedule-count', 0));

-- name: CountLiveSchedules :one
SELECT count(*) FROM schedules WHERE deleted_at IS NULL;
