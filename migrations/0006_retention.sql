-- Retention (HERALD_RETENTION): a periodic job deletes settled messages older
-- than the retention, their ledger and chunks, the payloads no longer
-- referenced and the idempotency keys of deleted messages, in bounded
-- batches. These indexes keep each batch's cost independent of how much
-- history the tables hold.
--
-- The oldest settled messages first, found without reading the others.
CREATE INDEX messages_settled_at_idx ON messages (settled_at) WHERE settled_at IS NOT NULL;
-- Whether a payload is still referenced, and the foreign keys' own checks
-- when one is deleted, without a scan of every message or schedule.
CREATE INDEX messages_payload_id_idx ON messages (payload_id);
CREATE INDEX schedules_payload_id_idx ON schedules (payload_id);
