-- name: RetainableMessages :many
-- The settled messages that settled before the cutoff, oldest first, at most
-- max_messages of them; the index on settled_at finds them without reading
-- the rest of the table.
SELECT id
FROM messages
WHERE settled_at < @cutoff::timestamptz AND state IN ('dispatched', 'cancelled', 'expired')
ORDER BY settled_at
LIMIT @max_messages;

-- name: DeleteLedgerRows :execrows
-- Deletes at most max_rows ledger rows of the given messages, found by the
-- primary key's leading column.
DELETE FROM deliveries d
USING (
    SELECT message_id, device_id
    FROM deliveries
    WHERE message_id = ANY(@message_ids::bigint[])
    LIMIT @max_rows
) v
WHERE d.message_id = v.message_id AND d.device_id = v.device_id;

-- name: DeleteMessagesWithoutLedger :many
-- Deletes those of the given messages whose ledger and receipts are gone
-- (their chunks go with them), and returns their payloads. The caller has
-- locked the messages (LockMessages), so a receipt written meanwhile has
-- committed and is seen here, and keeps its message for the next run.
DELETE FROM messages m
WHERE m.id = ANY(@message_ids::bigint[])
  AND NOT EXISTS (SELECT 1 FROM deliveries d WHERE d.message_id = m.id)
  AND NOT EXISTS (SELECT 1 FROM receipts r WHERE r.message_id = m.id)
RETURNING m.payload_id;

-- name: DeleteUnreferencedPayloads :execrows
-- Deletes those of the given payloads that no message and no schedule
-- references any more (a schedule's runs share its payload).
DELETE FROM payloads p
WHERE p.id = ANY(@payload_ids::bigint[])
  AND NOT EXISTS (SELECT 1 FROM messages m WHERE m.payload_id = p.id)
  AND NOT EXISTS (SELECT 1 FROM schedules s WHERE s.payload_id = p.id);

-- name: DeleteIdempotencyKeys :execrows
-- Deletes at most max_rows idempotency keys claimed before the cutoff whose
-- message is gone, or whose schedule was deleted before the cutoff, oldest
-- first. A key whose message is still kept (one scheduled far ahead) stays,
-- and so does one whose schedule lives, so that a late retry still finds it.
DELETE FROM idempotency_keys k
USING (
    SELECT i.scope, i.key
    FROM idempotency_keys i
    WHERE i.created_at < @cutoff
      AND (i.message_id IS NULL OR NOT EXISTS (SELECT 1 FROM messages m WHERE m.id = i.message_id))
      AND (i.schedule_id IS NULL OR NOT EXISTS (
          SELECT 1 FROM schedules s
          WHERE s.id = i.schedule_id AND (s.deleted_at IS NULL OR s.deleted_at >= @cutoff)))
    ORDER BY i.created_at
    LIMIT @max_rows
) v
WHERE k.scope = v.scope AND k.key = v.key;

-- name: LockEvictedDevices :many
-- Locks at most max_rows devices evicted before the cutoff, those evicted
-- longest ago first (devices_evicted_at_idx), for the caller's transaction
-- to delete. A device that a registration is taking again holds its lock
-- and is skipped; once registered again it is active, and not found here.
SELECT id FROM devices
WHERE status = 'evicted' AND evicted_at < @cutoff::timestamptz
ORDER BY evicted_at
LIMIT @max_rows
FOR UPDATE SKIP LOCKED;

-- name: DeleteDevices :execrows
DELETE FROM devices WHERE id = ANY (@device_ids::bigint[]);

-- name: DeleteDeletedDevices :execrows
-- Deletes at most max_rows of what deleted devices were (migration 0025),
-- those deleted before the cutoff, the oldest first: a message that may
-- name such a device settled before it was deleted, so is past the
-- retention too.
DELETE FROM deleted_devices d
USING (
    SELECT g.id FROM deleted_devices g
    WHERE g.deleted_at < @cutoff
    ORDER BY g.deleted_at
    LIMIT @max_rows
) old
WHERE d.id = old.id;
