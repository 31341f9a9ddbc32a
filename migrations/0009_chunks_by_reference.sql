-- Chunk jobs name their devices instead of carrying them.
--
-- A chunk job used to carry its devices' tokens and Web Push keys, copied
-- from the directory when the message was scheduled: about 150 bytes a
-- device that PostgreSQL compressed, stored out of line and later deleted
-- again, and that the scheduling process held in memory for the whole
-- audience at once. A chunk is now a range of the message's part of the
-- ledger (its first and last device id, and its number), and its worker
-- reads the pending deliveries of that range with their devices' tokens in
-- the one round trip that begins the chunk. Scheduling writes the ledger
-- from the directory with one INSERT ... SELECT, so no Herald process holds
-- an audience, however large.
--
-- The localization a delivery gets is picked when the message is scheduled
-- (from its user's locale) and kept here, since the job no longer carries
-- it: NULL is the message's own text.
ALTER TABLE deliveries ADD COLUMN locale text;

-- Chunk jobs enqueued before this migration still carry their targets; the
-- worker reads its devices from the ledger whatever the job holds, so the
-- copies of the tokens are removed from River's table.
UPDATE river_job SET args = args - 'targets' WHERE kind = 'fan_out' AND args ? 'targets';
