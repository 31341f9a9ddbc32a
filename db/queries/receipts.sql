-- name: RecordReceipts :many
-- Records a group commit's receipts (migration 0017) in one statement, and
-- moves each message's counters by exactly the rows it inserted: a receipt
-- already kept (a replay, from this write or an earlier one) inserts
-- nothing and counts nothing. A receipt is kept only for a delivery the
-- ledger has (a row, or a device of a chunk's snapshot whose result is not
-- written yet: migration 0022) and a device the directory has: one whose
-- device was erased, or whose ledger retention deleted, is returned as not
-- found. The
-- caller takes the directory lock shared and locks the messages first, in
-- the order of their ids (WriteReceipts). received_at is the database's
-- clock, Herald's one authoritative clock; device_at_us is microseconds
-- since the epoch, 0 for none.
--
-- Returns one row per input row found: inserted says whether it was new,
-- and skew_ms is a new delivered receipt's skew (0 otherwise).
-- The input holds each (message, device, event) once.
WITH input AS (
    SELECT unnest(@message_ids::bigint[]) AS message_id,
           unnest(@device_ids::bigint[]) AS device_id,
           unnest(@events::text[]) AS event,
           unnest(@device_at_us::bigint[]) AS device_at_us
), found AS (
    -- Each input row finds its delivery through the ledger's primary key
    -- and its device through the directory's; a delivery without a row,
    -- in a run of the chunk whose range holds the device (migration 0028:
    -- accepted; a run's devices are its chunk's), found through the
    -- chunks' first devices, nearest below first; or else, not yet
    -- written, in that chunk's snapshot. A chunk's snapshot is read (its
    -- array decompressed and searched) only for a receipt that came before
    -- its acceptance.
    SELECT i.message_id, i.device_id, i.event, i.device_at_us, coalesce(d.due_at, a.due_at, c.due_at) AS due_at,
           coalesce(d.status, CASE WHEN a.due_at IS NOT NULL THEN 'accepted' END, 'pending') <> 'accepted' AS early
    FROM input i
    LEFT JOIN deliveries d ON d.message_id = i.message_id AND d.device_id = i.device_id
    LEFT JOIN LATERAL (
        SELECT r.due_at
        FROM chunk_devices c
        JOIN accepted_runs r ON r.message_id = c.message_id AND r.chunk = c.chunk
        WHERE d.device_id IS NULL AND c.message_id = i.message_id
          AND c.first_device <= i.device_id AND c.last_device >= i.device_id
          AND i.device_id BETWEEN r.first_device AND r.last_device AND i.device_id = ANY (r.devices)
        ORDER BY c.first_device DESC
        LIMIT 1
    ) a ON true
    LEFT JOIN LATERAL (
        SELECT c.due_at FROM chunk_devices c
        WHERE d.device_id IS NULL AND a.due_at IS NULL AND c.message_id = i.message_id
          AND c.first_device <= i.device_id AND c.last_device >= i.device_id AND i.device_id = ANY (c.devices)
        ORDER BY c.first_device DESC
        LIMIT 1
    ) c ON true
    JOIN devices v ON v.id = i.device_id
    WHERE d.device_id IS NOT NULL OR a.due_at IS NOT NULL OR c.due_at IS NOT NULL
), inserted AS (
    INSERT INTO receipts (message_id, device_id, event, received_at, device_at, skew_ms, early)
    SELECT f.message_id, f.device_id, f.event, statement_timestamp(),
           CASE WHEN f.device_at_us = 0 THEN NULL
                ELSE to_timestamp(0) + f.device_at_us * interval '1 microsecond' END,
           date_part('epoch', statement_timestamp() - f.due_at) * 1000,
           f.early AND f.event = 'delivered'
    FROM found f
    ON CONFLICT (message_id, device_id, event) DO NOTHING
    RETURNING message_id, device_id, event, skew_ms
), tallies AS (
    -- The rows inserted, by message and event, the delivered ones by the
    -- bucket of their skew in skew_histogram's buckets (migration 0010).
    SELECT message_id, event,
           CASE WHEN event = 'delivered' THEN skew_histogram_bucket(skew_ms) END AS bucket,
           count(*)::integer AS n
    FROM inserted
    GROUP BY 1, 2, 3
), counts AS (
    SELECT message_id,
           coalesce(sum(n) FILTER (WHERE event = 'delivered'), 0)::integer AS confirmed,
           coalesce(sum(n) FILTER (WHERE event = 'opened'), 0)::integer AS opened,
           array_agg(bucket) FILTER (WHERE event = 'delivered') AS buckets,
           array_agg(n) FILTER (WHERE event = 'delivered') AS skews
    FROM tallies
    GROUP BY message_id
), counted AS (
    UPDATE messages m
    SET confirmed_count = m.confirmed_count + c.confirmed,
        opened_count = m.opened_count + c.opened,
        confirmed_histogram = CASE WHEN c.confirmed = 0 THEN m.confirmed_histogram
                                   ELSE skew_histogram_add(m.confirmed_histogram, c.buckets, c.skews) END
    FROM counts c
    WHERE m.id = c.message_id
    RETURNING m.id
)
SELECT f.message_id::bigint AS message_id, f.device_id::bigint AS device_id, f.event::text AS event,
       (n.message_id IS NOT NULL)::boolean AS inserted,
       coalesce(n.skew_ms, 0)::double precision AS skew_ms
FROM found f
LEFT JOIN inserted n ON n.message_id = f.message_id AND n.device_id = f.device_id AND n.event = f.event;

-- name: EarlyUnaccepted :many
-- How many of each message's delivered receipts came for a delivery the
-- ledger does not have as accepted (migration 0019): those confirmed_count
-- holds that the unconfirmed count must not subtract. Messages with none
-- are left out. A delivery of a snapshot without a row yet (migration
-- 0022) is not accepted.
SELECT r.message_id, count(*)::integer AS receipts
FROM receipts r
LEFT JOIN deliveries d ON d.message_id = r.message_id AND d.device_id = r.device_id
WHERE r.message_id = ANY (@message_ids::bigint[]) AND r.early AND coalesce(d.status, 'pending') <> 'accepted'
  -- Nor one accepted in a run (migration 0028), found through its chunk.
  AND NOT EXISTS (SELECT 1 FROM chunk_devices c
                  JOIN accepted_runs a ON a.message_id = c.message_id AND a.chunk = c.chunk
                  WHERE d.device_id IS NULL AND c.message_id = r.message_id
                    AND r.device_id BETWEEN c.first_device AND c.last_device AND r.device_id = ANY (c.devices)
                    AND r.device_id = ANY (a.devices))
GROUP BY r.message_id;

-- name: DeleteDeviceReceipts :execrows
-- Erasing devices deletes their receipts (receipts_device_idx).
DELETE FROM receipts WHERE device_id = ANY (@device_ids::bigint[]);

-- name: DeleteReceiptRows :execrows
-- Deletes at most max_rows receipts of the given messages, found by the
-- primary key's leading column, as DeleteLedgerRows does the ledger's.
DELETE FROM receipts r
USING (
    SELECT message_id, device_id, event
    FROM receipts
    WHERE message_id = ANY(@message_ids::bigint[])
    LIMIT @max_rows
) v
WHERE r.message_id = v.message_id AND r.device_id = v.device_id AND r.event = v.event;
