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
-- after LockMessage; returns how many expired per channel.
WITH expired AS (
    UPDATE deliveries
    SET status = 'expired'
    WHERE message_id = @message_id AND status = 'pending'
    RETURNING channel
), moved AS (
    UPDATE messages
    SET pending_count = pending_count - (SELECT count(*) FROM expired),
        expired_count = expired_count + (SELECT count(*) FROM expired)
    WHERE id = @message_id
)
SELECT channel, count(*)::integer AS expired FROM expired GROUP BY channel;
