-- A message sent now is written in two transactions (jobs.Enqueuer's
-- Submit): the first commits the message with its first chunk alone, so
-- that the chunk's pushes start while the second writes the rest of its
-- audience into the ledger. rest_after is the device id after which the
-- audience is still to be written; NULL once the whole of it is in the
-- ledger, which is at once for every other message. A message whose rest is
-- still to be written does not settle (SettleMessage), and whatever acts on
-- the whole of a message (a cancel, an idempotent retry, the reconciler)
-- has the rest written first.
ALTER TABLE messages ADD COLUMN rest_after bigint;

-- The messages whose rest is still to be written, for the reconciler: none,
-- or the few being written this instant.
CREATE INDEX messages_rest_idx ON messages (created_at) WHERE rest_after IS NOT NULL;
