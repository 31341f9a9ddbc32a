-- name: RegisterDevice :one
-- Registers a device, or moves an existing (channel, token) to the given user
-- and reactivates it. One statement, so that racing registrations of the same
-- token end in one row.
INSERT INTO devices (user_id, channel, token, p256dh, auth, environment)
VALUES (@user_id, @channel, @token, @p256dh, @auth, @environment)
ON CONFLICT (channel, token) DO UPDATE
SET user_id = excluded.user_id,
    p256dh = excluded.p256dh,
    auth = excluded.auth,
    environment = excluded.environment,
    status = 'active',
    evicted_reason = NULL,
    evicted_at = NULL,
    updated_at = now()
RETURNING id, user_id, channel, environment, status, (xmax = 0)::boolean AS created;

-- name: RegisterDevices :one
-- The batch form of RegisterDevice: one statement for the whole batch. The
-- arrays are parallel; an empty p256dh or auth stands for NULL, and a
-- missing environment (a shorter array) for production. Callers pass
-- each (channel, token) once, in sorted order, so that concurrent batches lock
-- rows in one order.
WITH upserted AS (
    INSERT INTO devices (user_id, channel, token, p256dh, auth, environment)
    SELECT d.user_id, d.channel, d.token, NULLIF(d.p256dh, ''), NULLIF(d.auth, ''),
           COALESCE(d.environment, 'production')
    FROM (
        -- Set-returning functions side by side in a select list advance in step.
        SELECT unnest(@user_ids::text[]) AS user_id,
               unnest(@channels::text[]) AS channel,
               unnest(@tokens::text[]) AS token,
               unnest(@p256dhs::text[]) AS p256dh,
               unnest(@auths::text[]) AS auth,
               unnest(@environments::text[]) AS environment
    ) d
    ON CONFLICT (channel, token) DO UPDATE
    SET user_id = excluded.user_id,
        p256dh = excluded.p256dh,
        auth = excluded.auth,
        environment = excluded.environment,
        status = 'active',
        evicted_reason = NULL,
        evicted_at = NULL,
        updated_at = now()
    RETURNING (xmax = 0) AS created
)
SELECT count(*) FILTER (WHERE created)::integer AS created,
       count(*) FILTER (WHERE NOT created)::integer AS updated
FROM upserted;

-- name: ListUserDevices :many
-- A page of a user's devices: those after after_id, in id order (keyset
-- pagination on devices_user_id_idx).
SELECT id, user_id, channel, token, p256dh, auth, status, evicted_reason, evicted_at, created_at, updated_at, environment
FROM devices
WHERE user_id = @user_id AND id > @after_id
ORDER BY id
LIMIT @page_size;

-- name: LockUsers :exec
-- Locks users' rows, so that registrations for one user take turns while
-- its limit of devices is checked. Callers pass the ids sorted and
-- distinct: concurrent calls lock in one order and cannot deadlock.
SELECT id FROM users WHERE id = ANY(@ids::text[]) ORDER BY id FOR UPDATE;

-- name: ActiveDeviceCounts :many
-- How many active devices each of the users has. Run after LockUsers, in a
-- statement of its own, so that it sees what the registrations it waited
-- for committed.
SELECT user_id, count(*)::integer AS devices
FROM devices
WHERE user_id = ANY(@user_ids::text[]) AND status = 'active'
GROUP BY user_id;

-- name: ActiveDeviceOwners :many
-- The users whose active devices the given (channel, token) pairs are.
-- The arrays are parallel.
SELECT d.channel, d.token, d.user_id
FROM devices d
JOIN (SELECT unnest(@channels::text[]) AS channel, unnest(@tokens::text[]) AS token) k
  ON d.channel = k.channel AND d.token = k.token
WHERE d.status = 'active';

-- name: DeleteDevice :execrows
DELETE FROM devices WHERE id = @id;

-- name: CancelPendingForDevices :exec
-- Deleted devices are sent nothing more: their pending deliveries are
-- cancelled and their messages' counters moved with them. Only a message
-- that has not settled (scheduled or dispatching) has pending deliveries, so
-- they are found through those few messages (messages_state_id_idx) and the
-- ledger's primary key, without an index on the status: one would keep
-- every result write from being a HOT update (see 0008_ledger_cost.sql).
WITH cancelled AS (
    UPDATE deliveries d
    SET status = 'cancelled'
    FROM messages m
    WHERE m.state IN ('scheduled', 'dispatching')
      AND d.message_id = m.id AND d.device_id = ANY (@device_ids::bigint[]) AND d.status = 'pending'
    RETURNING d.message_id
), per_message AS (
    SELECT message_id, count(*)::integer AS n FROM cancelled GROUP BY message_id
)
UPDATE messages m
SET pending_count = m.pending_count - p.n,
    cancelled_count = m.cancelled_count + p.n
FROM per_message p
WHERE m.id = p.message_id;

-- name: EvictDevice :execrows
-- Marks a device evicted (its token is dead); later messages skip it until it
-- registers again.
UPDATE devices
SET status = 'evicted', evicted_reason = @reason, evicted_at = now(), updated_at = now()
WHERE id = @id AND status = 'active';

-- name: GetDevice :one
SELECT id, user_id, channel, token, p256dh, auth, status, evicted_reason, evicted_at, created_at, updated_at, environment
FROM devices
WHERE id = @id;
