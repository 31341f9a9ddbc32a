-- name: StuckMessages :many
-- Messages that are not settled and that no chunk will settle: every
-- delivery past its expiry by grace (the message's expires_at is its last
-- wave's), or nothing left pending since grace after dispatch_at. Their
-- chunk jobs were discarded, cancelled or deleted, or a settle was lost.
-- Oldest first, at most batch of them; the partial set of unsettled
-- messages is read through messages_state_id_idx.
SELECT id FROM messages
WHERE state IN ('scheduled', 'dispatching')
  AND (expires_at < clock_timestamp() - make_interval(secs => @grace_seconds::double precision)
       OR (pending_count = 0 AND dispatch_at < clock_timestamp() - make_interval(secs => @grace_seconds::double precision)))
ORDER BY id
LIMIT @batch;

-- name: ExpireStuckDeliveries :many
-- Expires what a stuck message still has pending and moves its counters,
-- after LockMessage; returns how many expired per channel. Its pending
-- ledger rows are settled; the devices of its chunks' snapshots that have
-- no row (migration 0022) and are in no run (0028) are left without one: a settled message's
-- snapshot devices without a row are expired (ListDeliveries), and what
-- they are counted here by channel (a device deleted since by the channel
-- it had, migration 0025).
WITH expired AS (
    UPDATE deliveries d
    SET status = 'expired'
    WHERE d.message_id = @message_id AND d.status = 'pending'
    RETURNING d.channel, d.reason
), unsent AS (
    SELECT coalesce(v.channel, g.channel, '')::text AS channel
    FROM chunk_devices c
    CROSS JOIN LATERAL unnest(c.devices) WITH ORDINALITY AS s(device_id, n)
    LEFT JOIN devices v ON v.id = s.device_id
    LEFT JOIN deleted_devices g ON v.id IS NULL AND g.id = s.device_id
    WHERE c.message_id = @message_id::bigint
      AND NOT EXISTS (SELECT 1 FROM deliveries d WHERE d.message_id = c.message_id AND d.device_id = s.device_id)
      -- Nor one accepted in a run of its chunk (migration 0028).
      AND s.device_id NOT IN (SELECT unnest(r.devices) FROM accepted_runs r
                              WHERE r.message_id = c.message_id AND r.chunk = c.chunk)
), every AS (
    SELECT channel FROM expired UNION ALL SELECT channel FROM unsent
), moved AS (
    UPDATE messages
    SET pending_count = pending_count - (SELECT count(*) FROM every),
        expired_count = expired_count + (SELECT count(*) FROM every),
        -- A delivery held by quiet hours that expires is withheld for them
        -- (migration 0024), as the chunk counts one.
        quiet_hours_count = quiet_hours_count + (SELECT count(*) FROM expired WHERE reason = 'quiet_hours')
    WHERE id = @message_id
)
SELECT channel, count(*)::integer AS expired FROM every GROUP BY channel;
