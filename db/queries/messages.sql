-- name: DatabaseNow :one
-- The database's clock is Herald's one authoritative clock: dispatch times
-- are compared with it, never with a host's.
SELECT clock_timestamp()::timestamptz AS now;

-- name: InsertPayload :one
INSERT INTO payloads (content) VALUES (@content) RETURNING id;

-- name: GetPayload :one
SELECT content FROM payloads WHERE id = @id;

-- name: GetPayloads :many
-- The payloads of a page of messages or schedules, read back as stored.
SELECT id, content FROM payloads WHERE id = ANY (@ids::bigint[]);

-- name: SegmentExists :one
SELECT EXISTS (SELECT 1 FROM segments WHERE id = @id)::boolean;

-- name: InsertMessage :one
-- Deliveries are pending, except those of a local-time message whose time
-- had passed in their zone (expired_count of them, with if_passed skip).
INSERT INTO messages (
    state, priority, dispatch_at, expires_at, payload_id, audience, local_time,
    recipient_count, device_count, chunk_count, pending_count, expired_count,
    schedule_id, schedule_run_at, settled_at, category, quiet_hours
) VALUES (
    @state, @priority, @dispatch_at, @expires_at, @payload_id, @audience, @local_time,
    @recipient_count, @device_count, @chunk_count, @pending_count, @expired_count,
    @schedule_id, @schedule_run_at, @settled_at,
    -- Empty: the defaults (migration 0024).
    coalesce(nullif(@category::text, ''), 'default'), coalesce(nullif(@quiet_hours::text, ''), 'hold')
)
RETURNING *;

-- name: SetMessageAudience :one
-- What the expansion of a message's audience wrote, in the same
-- transaction: its counts, and its state when nothing is left to send.
UPDATE messages
SET state = @state, settled_at = @settled_at,
    recipient_count = @recipient_count, device_count = @device_count, chunk_count = @chunk_count,
    pending_count = @pending_count, expired_count = @expired_count, rest_after = sqlc.narg('rest_after')
WHERE id = @id
RETURNING *;

-- name: LockMessageRest :exec
-- Taken by whatever writes the rest of a message's audience, and held until
-- its transaction ends: the request that made the message takes it before
-- the message commits, so that a cancel, a retry or the reconciler waits
-- for the rest rather than racing it. Keyed by the message's id, folded
-- into the second key of the two-key form (which is apart from every
-- one-key lock).
SELECT pg_advisory_xact_lock(hashtext('herald:message-rest'), mod(@id::bigint, 2147483647)::integer);

-- name: TryLockMessageRest :one
SELECT pg_try_advisory_xact_lock(hashtext('herald:message-rest'), mod(@id::bigint, 2147483647)::integer) AS locked;

-- name: FinishMessageRest :one
-- Adds what the rest of a message's audience wrote to its counts and says
-- the whole audience is in the ledger. recipient_count is given whole (the
-- rest's users may have devices in the first chunk too). The receipt an
-- idempotent retry replays gets the final counts.
WITH finished AS (
    UPDATE messages m
    SET rest_after = NULL, recipient_count = @recipient_count::integer,
        device_count = m.device_count + @devices::integer, pending_count = m.pending_count + @devices::integer,
        chunk_count = m.chunk_count + @chunks::integer
    WHERE m.id = @id
    RETURNING m.*
), keys AS (
    UPDATE idempotency_keys k
    SET response = k.response || jsonb_build_object(
            'recipient_count', f.recipient_count, 'device_count', f.device_count, 'chunk_count', f.chunk_count)
    FROM finished f
    WHERE k.message_id = f.id AND k.response IS NOT NULL
)
SELECT pending_count FROM finished;

-- name: StaleMessageRests :many
-- Messages whose rest has been waiting longer than it takes to write: the
-- request that made them died before writing it.
SELECT id FROM messages
WHERE rest_after IS NOT NULL AND created_at < @before
ORDER BY created_at
LIMIT 100;

-- name: InsertMessageChunks :exec
INSERT INTO message_chunks (message_id, chunk, job_id, due_at, device_count)
SELECT @message_id, unnest(@chunks::integer[]), unnest(@job_ids::bigint[]),
       unnest(@due_ats::timestamptz[]), unnest(@device_counts::integer[]);

-- name: GetMessage :one
SELECT * FROM messages WHERE id = @id;

-- name: MessageWaves :many
-- A local-time message's waves and how far each has got: the deliveries
-- sent at one instant (its chunks; those whose time had passed and were
-- skipped are chunk -1 and belong to no wave). A wave's devices are its
-- chunks'; what has settled is its ledger rows, found through the message's
-- part of the primary key, and the rest is pending, as ListDeliveries has
-- it: a snapshot's device without a row (migration 0022) is pending while
-- its message is, and then cancelled or expired with it.
WITH waves AS (
    SELECT due_at, sum(device_count)::integer AS devices
    FROM message_chunks
    WHERE message_id = @message_id
    GROUP BY due_at
), settled AS (
    SELECT due_at,
           count(*) FILTER (WHERE status = 'accepted')::integer AS accepted,
           count(*) FILTER (WHERE status = 'failed')::integer AS failed,
           count(*) FILTER (WHERE status = 'expired')::integer AS expired,
           count(*) FILTER (WHERE status = 'cancelled')::integer AS cancelled
    FROM deliveries
    WHERE message_id = @message_id AND chunk >= 0 AND status <> 'pending'
    GROUP BY due_at
    UNION ALL
    -- The acceptances kept in runs (migration 0028).
    SELECT due_at, sum(cardinality(devices))::integer, 0, 0, 0
    FROM accepted_runs
    WHERE message_id = @message_id AND chunk >= 0
    GROUP BY due_at
), counted AS (
    SELECT w.due_at, w.devices,
           coalesce(s.accepted, 0) AS accepted, coalesce(s.failed, 0) AS failed,
           coalesce(s.expired, 0) AS expired, coalesce(s.cancelled, 0) AS cancelled,
           w.devices - coalesce(s.accepted + s.failed + s.expired + s.cancelled, 0) AS unsettled
    FROM waves w
    LEFT JOIN (SELECT due_at, sum(accepted) AS accepted, sum(failed) AS failed, sum(expired) AS expired,
                      sum(cancelled) AS cancelled
               FROM settled GROUP BY due_at) s ON s.due_at = w.due_at
)
SELECT c.due_at, c.devices::integer AS devices, c.accepted::integer AS accepted, c.failed::integer AS failed,
       (c.expired + CASE WHEN m.state IN ('dispatched', 'expired') THEN c.unsettled ELSE 0 END)::integer AS expired,
       (c.cancelled + CASE WHEN m.state = 'cancelled' THEN c.unsettled ELSE 0 END)::integer AS cancelled,
       (CASE WHEN m.state IN ('scheduled', 'dispatching') THEN c.unsettled ELSE 0 END)::integer AS pending
FROM counted c
CROSS JOIN messages m
WHERE m.id = @message_id
ORDER BY c.due_at;

-- name: MessageChunkJobs :many
SELECT job_id FROM message_chunks WHERE message_id = @message_id ORDER BY chunk;

-- name: ListDeliveries :many
-- One page of a message's ledger rows in device order, after a cursor, of
-- one status or of all, of one reason or of all, and of those confirmed by
-- a delivered receipt or not (migration 0017), with their receipts' times,
-- and of one app or all (migration 0021: the device's app, 0 when the
-- device is gone). Each delivery finds its receipts and its device through
-- their primary keys. The deliveries of chunks' snapshots that have no row
-- yet are listed by ListSnapshotDeliveries; Queries.ListAllDeliveries
-- merges the two.
SELECT d.device_id, d.user_id, d.channel, d.status, d.reason, d.attempted_at, d.accepted_at, d.due_at,
       rd.received_at AS confirmed_at, rd.device_at AS confirmed_device_at, rd.skew_ms AS confirmed_skew_ms,
       ro.received_at AS opened_at, ro.device_at AS opened_device_at,
       coalesce(v.app_id, 0)::integer AS app_id
FROM deliveries d
LEFT JOIN receipts rd ON rd.message_id = d.message_id AND rd.device_id = d.device_id AND rd.event = 'delivered'
LEFT JOIN receipts ro ON ro.message_id = d.message_id AND ro.device_id = d.device_id AND ro.event = 'opened'
LEFT JOIN devices v ON v.id = d.device_id
WHERE d.message_id = @message_id
  AND d.device_id > @after_device_id
  AND (sqlc.narg('status')::text IS NULL OR d.status = sqlc.narg('status')::text)
  AND (sqlc.narg('reason')::text IS NULL OR d.reason = sqlc.narg('reason')::text)
  AND (sqlc.narg('confirmed')::boolean IS NULL OR (rd.message_id IS NOT NULL) = sqlc.narg('confirmed')::boolean)
  AND (sqlc.narg('app_id')::integer IS NULL OR v.app_id = sqlc.narg('app_id')::integer)
ORDER BY d.device_id
LIMIT @page_size;

-- name: SnapshotChunksAfter :many
-- The chunks of a message's snapshot (migration 0022) that hold devices
-- after a cursor, in the order of their first device: where
-- ListSnapshotDeliveries looks, a few chunks at a time.
SELECT chunk, first_device, last_device
FROM chunk_devices
WHERE message_id = @message_id AND last_device > @after_device_id
ORDER BY first_device, chunk;

-- name: ListSnapshotDeliveries :many
-- The deliveries of the given chunks' snapshots that have no ledger row
-- (migration 0022), after a cursor, as ListDeliveries lists a row: such a
-- delivery is accepted when a run of its chunk holds it (migration 0028),
-- with the times the run keeps; otherwise it is pending while its message
-- is, cancelled with it, or expired with it when the reconciler settled
-- it. Its user is the run's, as the chunk read it; otherwise its user
-- and channel are its device's, which no move has changed, or what the
-- device was when it was deleted since (migration 0025). An early
-- receipt may be there before the row is.
SELECT s.device_id::bigint AS device_id, coalesce(a.user_id, v.user_id, g.user_id, '')::text AS user_id,
       coalesce(v.channel, g.channel, '')::text AS channel,
       (CASE WHEN a.device_id IS NOT NULL THEN 'accepted'
             WHEN m.state IN ('scheduled', 'dispatching') THEN 'pending'
             WHEN m.state = 'cancelled' THEN 'cancelled'
             ELSE 'expired' END)::text AS status,
       -- The epoch for none (db.ListAllDeliveries).
       coalesce(a.attempted_at, 'epoch')::timestamptz AS attempted_at,
       coalesce(a.accepted_at, 'epoch')::timestamptz AS accepted_at,
       c.due_at,
       rd.received_at AS confirmed_at, rd.device_at AS confirmed_device_at, rd.skew_ms AS confirmed_skew_ms,
       ro.received_at AS opened_at, ro.device_at AS opened_device_at,
       coalesce(v.app_id, 0)::integer AS app_id
FROM chunk_devices c
CROSS JOIN LATERAL unnest(c.devices) WITH ORDINALITY AS s(device_id, n)
JOIN messages m ON m.id = c.message_id
LEFT JOIN (SELECT r.chunk, unnest(r.devices) AS device_id, unnest(r.user_ids) AS user_id,
                  (to_timestamp(0) + unnest(r.attempted_us) * interval '1 microsecond')::timestamptz AS attempted_at,
                  (to_timestamp(0) + unnest(r.accepted_us) * interval '1 microsecond')::timestamptz AS accepted_at
           FROM accepted_runs r
           WHERE r.message_id = @message_id AND r.chunk = ANY (@chunks::integer[])
             AND r.last_device > @after_device_id::bigint) a ON a.chunk = c.chunk AND a.device_id = s.device_id
LEFT JOIN receipts rd ON rd.message_id = m.id AND rd.device_id = s.device_id AND rd.event = 'delivered'
LEFT JOIN receipts ro ON ro.message_id = m.id AND ro.device_id = s.device_id AND ro.event = 'opened'
LEFT JOIN devices v ON v.id = s.device_id
LEFT JOIN deleted_devices g ON v.id IS NULL AND g.id = s.device_id
WHERE m.id = @message_id
  AND c.chunk = ANY (@chunks::integer[])
  AND s.device_id > @after_device_id::bigint
  AND NOT EXISTS (SELECT 1 FROM deliveries d WHERE d.message_id = m.id AND d.device_id = s.device_id)
  AND (sqlc.narg('status')::text IS NULL
       OR sqlc.narg('status')::text = (CASE WHEN a.device_id IS NOT NULL THEN 'accepted'
                                            WHEN m.state IN ('scheduled', 'dispatching') THEN 'pending'
                                            WHEN m.state = 'cancelled' THEN 'cancelled'
                                            ELSE 'expired' END))
  AND (sqlc.narg('confirmed')::boolean IS NULL OR (rd.message_id IS NOT NULL) = sqlc.narg('confirmed')::boolean)
  AND (sqlc.narg('app_id')::integer IS NULL OR v.app_id = sqlc.narg('app_id')::integer)
ORDER BY s.device_id
LIMIT @page_size;

-- name: HasSnapshot :one
-- Whether a message was scheduled with chunks' snapshots (migration 0022):
-- the rest of a message sent now is written as its first chunk was.
SELECT EXISTS (SELECT 1 FROM chunk_devices WHERE message_id = @message_id)::boolean;

-- name: ListMessages :many
-- One page of messages, newest first, before a cursor, with optional filters.
SELECT *
FROM messages
WHERE id < @before_id
  AND (sqlc.narg('state')::text IS NULL OR state = sqlc.narg('state')::text)
  AND (sqlc.narg('schedule_id')::bigint IS NULL OR schedule_id = sqlc.narg('schedule_id')::bigint)
ORDER BY id DESC
LIMIT @page_size;

-- name: CancelMessage :one
-- Cancels a message that has not started. The guard on state is what
-- settles a race with the first chunk: whichever updates the row first wins,
-- and the other finds the state changed.
UPDATE messages
SET state = 'cancelled',
    cancelled_at = clock_timestamp(),
    settled_at = clock_timestamp(),
    cancelled_count = cancelled_count + pending_count,
    pending_count = 0
WHERE id = @id AND state = 'scheduled'
RETURNING *;

-- name: CancelPendingDeliveries :execrows
UPDATE deliveries SET status = 'cancelled'
WHERE message_id = @message_id AND status = 'pending';

-- name: ClaimIdempotencyKey :one
-- Claims a key for this transaction. A concurrent claim of the same key
-- waits here until this transaction ends, then finds the key taken.
INSERT INTO idempotency_keys (scope, key, request_hash)
VALUES (@scope, @key, @request_hash)
ON CONFLICT (scope, key) DO NOTHING
RETURNING true AS claimed;

-- name: GetIdempotencyKey :one
SELECT request_hash, response FROM idempotency_keys WHERE scope = @scope AND key = @key;

-- name: CompleteIdempotencyKey :exec
-- Records what a claimed key made (a message or a schedule) and the answer
-- a retry replays.
UPDATE idempotency_keys SET message_id = @message_id, schedule_id = @schedule_id, response = @response
WHERE scope = @scope AND key = @key;

-- name: StartMessage :exec
-- A chunk's first act: mark the message dispatching if it is still
-- scheduled. Only the first chunk changes the row; a cancel or an expiry
-- that came first leaves it alone, and the state read after says so.
UPDATE messages
SET state = 'dispatching',
    started_at = coalesce(started_at, clock_timestamp())
WHERE id = @id AND state = 'scheduled';

-- name: UnsettledMessagesByState :many
-- How many messages are scheduled and dispatching, for the metrics: only
-- those, through messages_state_id_idx, never the settled history, which
-- grows until the retention.
SELECT state, count(*)::bigint AS messages
FROM messages
WHERE state IN ('scheduled', 'dispatching')
GROUP BY state;
