-- name: LockRegistered :many
-- Locks the devices a registration touches, in the order of their ids, and
-- returns them: those holding one of the (channel, token) pairs, and those
-- of the (channel, installation_id) pairs. The arrays of each pair are
-- parallel. Taken before the registration writes, so that it knows which
-- devices change owner (their former owner's pending deliveries are
-- cancelled) and which installation gets a new token.
SELECT v.id, v.user_id, v.channel, v.token, v.installation_id, v.status, v.app_id
FROM devices v
WHERE (v.channel, v.token) IN (SELECT unnest(@channels::text[]), unnest(@tokens::text[]))
   OR (v.channel, v.installation_id) IN (SELECT unnest(@installation_channels::text[]), unnest(@installation_ids::text[]))
ORDER BY v.id
FOR UPDATE;

-- name: RetokenDevices :exec
-- Gives installations' devices their new tokens in place (same device id),
-- so that a refreshed token is not a second device. The arrays are
-- parallel; an empty p256dh or auth stands for NULL.
UPDATE devices v
SET token = r.token, p256dh = NULLIF(r.p256dh, ''), auth = NULLIF(r.auth, ''), updated_at = now()
FROM (SELECT unnest(@ids::bigint[]) AS id, unnest(@tokens::text[]) AS token,
             unnest(@p256dhs::text[]) AS p256dh, unnest(@auths::text[]) AS auth) r
WHERE v.id = r.id;

-- name: RegisterDevices :many
-- Registers devices, or moves existing (channel, token)s to the given users
-- and reactivates them: one statement for one device or a whole batch. The
-- arrays are parallel; an empty p256dh, auth or installation id stands for
-- NULL (a registration without an installation id keeps the one the device
-- has), and a missing environment (a shorter array) for production, a
-- missing app for the default app (1), a missing or zero credential for
-- none (migration 0021). A token registered under another app moves to it.
-- Callers pass each (channel, token) once, in sorted order, so that
-- concurrent batches lock rows in one order.
INSERT INTO devices (user_id, channel, token, p256dh, auth, environment, installation_id, app_id, credential_id)
SELECT d.user_id, d.channel, d.token, NULLIF(d.p256dh, ''), NULLIF(d.auth, ''),
       COALESCE(d.environment, 'production'), NULLIF(d.installation_id, ''),
       COALESCE(d.app_id, 1), NULLIF(d.credential_id, 0)
FROM (
    -- Set-returning functions side by side in a select list advance in step.
    SELECT unnest(@user_ids::text[]) AS user_id,
           unnest(@channels::text[]) AS channel,
           unnest(@tokens::text[]) AS token,
           unnest(@p256dhs::text[]) AS p256dh,
           unnest(@auths::text[]) AS auth,
           unnest(@environments::text[]) AS environment,
           unnest(@installation_ids::text[]) AS installation_id,
           unnest(@app_ids::integer[]) AS app_id,
           unnest(@credential_ids::bigint[]) AS credential_id
) d
ON CONFLICT (channel, token) DO UPDATE
SET user_id = excluded.user_id,
    p256dh = excluded.p256dh,
    auth = excluded.auth,
    environment = excluded.environment,
    installation_id = COALESCE(excluded.installation_id, devices.installation_id),
    app_id = excluded.app_id,
    credential_id = excluded.credential_id,
    status = 'active',
    evicted_reason = NULL,
    evicted_at = NULL,
    updated_at = now()
RETURNING id, user_id, channel, environment, status, app_id, (xmax = 0)::boolean AS created;

-- name: ListUserDevices :many
-- A page of a user's devices: those after after_id, in id order (keyset
-- pagination on devices_by_user_idx).
SELECT id, user_id, channel, token, p256dh, auth, status, evicted_reason, evicted_at, created_at, updated_at, environment, installation_id, app_id
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

-- name: DeleteDevice :execrows
DELETE FROM devices WHERE id = @id;

-- name: LockMessagesOfDevices :exec
-- Locks, in the order of their ids, the messages CancelPendingOfDevices
-- will change, so that its own reading comes after every ledger write of
-- theirs that committed meanwhile: a statement reads the database as it
-- was when it began, and one that waited for a message's lock would not
-- see a run (migration 0028) written while it waited, which no key stops
-- it from writing a row beside. db.Queries.CancelPendingForDevices runs
-- the two.
SELECT m.id
FROM messages m
WHERE m.state IN ('scheduled', 'dispatching')
  AND (EXISTS (SELECT 1 FROM deliveries d
               WHERE d.message_id = m.id AND d.device_id = ANY (@device_ids::bigint[]) AND d.status = 'pending')
       OR EXISTS (SELECT 1 FROM chunk_devices c
                  WHERE c.message_id = m.id AND c.first_device <= (SELECT max(x) FROM unnest(@device_ids::bigint[]) x)
                    AND c.last_device >= (SELECT min(x) FROM unnest(@device_ids::bigint[]) x)
                    AND c.devices && @device_ids::bigint[]))
ORDER BY m.id
FOR UPDATE;

-- name: CancelPendingOfDevices :exec
-- Cancels the devices' pending deliveries, with the reason given, and moves
-- their messages' counters: a deleted device is sent nothing more, nor is a
-- device moved to another user anything of its former owner's (with
-- only_moved, only the pending rows whose user is no longer the device's
-- are cancelled). Only a message that has not settled (scheduled or
-- dispatching) has pending deliveries, so they are found through those few
-- messages (messages_state_id_idx) and the ledger's primary key, without an
-- index on the status: one would keep every result write from being a HOT
-- update (see 0008_ledger_cost.sql).
--
-- A delivery of a chunk's snapshot (migration 0022) has no row until it is
-- sent: it is found through its message's chunks whose range holds the
-- device, and written here, cancelled, as its one row, with its user: the
-- former owner given for it (former_user_ids, parallel to device_ids; a
-- shorter array or '' for the device's own user). Every snapshot that
-- holds the device was written before this runs: the caller waits for
-- messages being made (LockDirectoryExclusive), so a snapshot that read the
-- device's former owner has committed, and one made after reads the new.
--
-- The messages concerned are locked first, in the order of their ids, as a
-- ledger write locks them (LockMessages), so that a registration moving a
-- device and a chunk writing its results never wait for each other in a
-- cycle: by LockMessagesOfDevices, in a statement before this one (see
-- there), and again here, without waiting.
WITH input AS (
    SELECT unnest(@device_ids::bigint[]) AS device_id, unnest(@former_user_ids::text[]) AS former
), snapped AS (
    SELECT c.message_id, c.chunk, c.due_at, i.device_id, i.former
    FROM messages m
    JOIN chunk_devices c ON c.message_id = m.id
    JOIN input i ON i.device_id BETWEEN c.first_device AND c.last_device AND i.device_id = ANY (c.devices)
    WHERE m.state IN ('scheduled', 'dispatching')
), locked AS (
    SELECT m.id
    FROM messages m
    WHERE m.state IN ('scheduled', 'dispatching')
      AND (EXISTS (SELECT 1 FROM deliveries d
                   WHERE d.message_id = m.id AND d.device_id = ANY (@device_ids::bigint[]) AND d.status = 'pending')
           OR m.id IN (SELECT message_id FROM snapped))
    ORDER BY m.id
    FOR UPDATE
), cancelled AS (
    UPDATE deliveries d
    SET status = 'cancelled', reason = @reason::text
    FROM locked m
    WHERE d.message_id = m.id AND d.device_id = ANY (@device_ids::bigint[]) AND d.status = 'pending'
      AND (NOT @only_moved::boolean
           OR NOT EXISTS (SELECT 1 FROM devices v WHERE v.id = d.device_id AND v.user_id = d.user_id))
    RETURNING d.message_id
), written AS (
    INSERT INTO deliveries (message_id, device_id, user_id, channel, chunk, due_at, status, reason)
    SELECT s.message_id, s.device_id, coalesce(nullif(s.former, ''), v.user_id), v.channel, s.chunk, s.due_at,
           'cancelled', @reason::text
    FROM snapped s
    JOIN locked m ON m.id = s.message_id
    JOIN devices v ON v.id = s.device_id
    WHERE NOT EXISTS (SELECT 1 FROM deliveries d WHERE d.message_id = s.message_id AND d.device_id = s.device_id)
      -- One accepted in a run of its chunk (migration 0028) is settled.
      AND NOT EXISTS (SELECT 1 FROM accepted_runs r
                      WHERE r.message_id = s.message_id AND r.chunk = s.chunk AND s.device_id = ANY (r.devices))
    ON CONFLICT (message_id, device_id) DO NOTHING
    RETURNING message_id
), per_message AS (
    SELECT message_id, count(*)::integer AS n
    FROM (SELECT message_id FROM cancelled UNION ALL SELECT message_id FROM written) c
    GROUP BY message_id
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
SELECT id, user_id, channel, token, p256dh, auth, status, evicted_reason, evicted_at, created_at, updated_at, environment, installation_id
FROM devices
WHERE id = @id;
