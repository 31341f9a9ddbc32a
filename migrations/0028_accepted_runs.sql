-- Accepted deliveries kept a run at a time (docs/architecture.md, the
-- ledger's write path).
--
-- Since migration 0022 a delivery's ledger row is written once, by its
-- result; at the instant nearly every result is an acceptance, and each
-- one's row (a heap tuple, a primary-key entry, their WAL: some 3 µs of
-- PostgreSQL and 250 bytes of WAL a device) was most of what a send cost
-- the database. A chunk's acceptances are now written as runs: each ledger
-- write appends one row a chunk holding the devices it accepted, with
-- their times, in arrays. A delivery is still in exactly one place: a
-- device of a chunk's snapshot is accepted in one of the chunk's runs, or
-- has a row in deliveries (a failure, a withheld or throttled delivery, a
-- cancel, anything written by a retried chunk's write), or neither, and
-- then it is pending (or takes its message's fate, as before).
--
-- Runs are written by the chunk's execution that read the devices (each
-- execution has a token of its own, kept across a snooze), and only while
-- no other execution's run of the chunk exists and no ledger row names
-- one of its devices: a write that finds either (a chunk taken over, retried, or a device
-- cancelled meanwhile) fails on accepted_runs_once and is made again as
-- the upsert, which skips what a run holds (db.WriteChunks). Every write
-- holds its messages' rows locked (LockMessages), so two never interleave.
CREATE TABLE accepted_runs (
    message_id   bigint NOT NULL REFERENCES messages (id) ON DELETE CASCADE,
    chunk        integer NOT NULL,
    -- The chunk execution that wrote the run: a hash of its River job and
    -- attempt, not zero (jobs.executionOf).
    execution    bigint NOT NULL,
    -- When its deliveries were due, as deliveries.due_at.
    due_at       timestamptz NOT NULL,
    first_device bigint NOT NULL,
    last_device  bigint NOT NULL,
    -- The accepted devices in ascending order, and parallel to them each
    -- one's user as the chunk read it (a device moved to another user
    -- since was still sent as its former owner's, as deliveries.user_id
    -- keeps it), and when each was sent and accepted (microseconds since
    -- the epoch).
    devices      bigint[] NOT NULL,
    user_ids     text[] NOT NULL,
    attempted_us bigint[] NOT NULL,
    accepted_us  bigint[] NOT NULL
);

CREATE INDEX accepted_runs_chunk_idx ON accepted_runs (message_id, chunk);

-- A receipt finds its chunk, and so its chunk's runs, by the chunks' first
-- devices (RecordReceipts): through the key, every chunk of the message
-- was read for each receipt, twenty thousand of a ten-million-device one.
CREATE INDEX chunk_devices_first_device_idx ON chunk_devices (message_id, first_device);

ALTER TABLE accepted_runs ALTER COLUMN devices SET COMPRESSION lz4;
ALTER TABLE accepted_runs ALTER COLUMN user_ids SET COMPRESSION lz4;
ALTER TABLE accepted_runs ALTER COLUMN attempted_us SET COMPRESSION lz4;
ALTER TABLE accepted_runs ALTER COLUMN accepted_us SET COMPRESSION lz4;

-- What a run's write raises when it may not be written (see above).
CREATE FUNCTION accepted_runs_conflict() RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'a delivery of an accepted run was written by another chunk execution'
        USING ERRCODE = 'unique_violation', CONSTRAINT = 'accepted_runs_once';
END
$$;

-- The ledger as the API lists it, runs included.
CREATE OR REPLACE VIEW ledger AS
SELECT d.message_id, d.device_id, d.user_id, d.channel, d.chunk, d.due_at, d.status, d.reason,
       d.attempt, d.attempted_at, d.accepted_at, d.locale, d.not_before
FROM deliveries d
UNION ALL
SELECT c.message_id, s.device_id, v.user_id, v.channel, c.chunk, c.due_at,
       CASE WHEN m.state IN ('scheduled', 'dispatching') THEN 'pending'
            WHEN m.state = 'cancelled' THEN 'cancelled'
            ELSE 'expired' END,
       NULL, 0::smallint, NULL, NULL, c.locales[s.n], NULL
FROM chunk_devices c
CROSS JOIN LATERAL unnest(c.devices) WITH ORDINALITY AS s(device_id, n)
JOIN messages m ON m.id = c.message_id
LEFT JOIN devices v ON v.id = s.device_id
WHERE NOT EXISTS (SELECT 1 FROM deliveries d WHERE d.message_id = c.message_id AND d.device_id = s.device_id)
  -- Joined whole, not looked up a device at a time: a run's array is
  -- searched from its start.
  AND NOT EXISTS (SELECT 1 FROM accepted_runs r CROSS JOIN LATERAL unnest(r.devices) AS a(device_id)
                  WHERE r.message_id = c.message_id AND a.device_id = s.device_id)
UNION ALL
SELECT r.message_id, s.device_id, s.user_id, coalesce(v.channel, g.channel), r.chunk, r.due_at,
       'accepted', NULL, 1::smallint,
       to_timestamp(0) + s.attempted_us * interval '1 microsecond',
       to_timestamp(0) + s.accepted_us * interval '1 microsecond', NULL, NULL
FROM accepted_runs r
CROSS JOIN LATERAL unnest(r.devices, r.user_ids, r.attempted_us, r.accepted_us) AS s(device_id, user_id, attempted_us, accepted_us)
LEFT JOIN devices v ON v.id = s.device_id
LEFT JOIN deleted_devices g ON v.id IS NULL AND g.id = s.device_id;

-- A receipt's webhook event names its delivery's user: a row's, or for a
-- device accepted in a run, the run's (found through the chunk whose
-- snapshot holds the device), or the device's own for one not yet sent.
CREATE OR REPLACE FUNCTION webhook_events_of_receipts() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM webhooks WHERE events && ARRAY['delivery.confirmed', 'delivery.opened']::text[]) THEN
        INSERT INTO webhook_events (webhook_id, message_id, type, device_id, user_id, at)
        SELECT w.id, r.message_id, r.type, r.device_id, coalesce(d.user_id, a.user_id, v.user_id), r.received_at
        FROM (SELECT message_id, device_id, received_at,
                     CASE event WHEN 'delivered' THEN 'delivery.confirmed' ELSE 'delivery.opened' END AS type
              FROM new_receipts) r
        JOIN webhooks w ON r.type = ANY (w.events)
        LEFT JOIN deliveries d ON d.message_id = r.message_id AND d.device_id = r.device_id
        LEFT JOIN LATERAL (
            SELECT u.user_id
            FROM chunk_devices c
            JOIN accepted_runs ar ON ar.message_id = c.message_id AND ar.chunk = c.chunk
            CROSS JOIN LATERAL unnest(ar.devices, ar.user_ids) AS u(device_id, user_id)
            WHERE d.device_id IS NULL AND c.message_id = r.message_id
              AND r.device_id BETWEEN c.first_device AND c.last_device AND r.device_id = ANY (c.devices)
              AND u.device_id = r.device_id
            LIMIT 1
        ) a ON true
        LEFT JOIN devices v ON v.id = r.device_id;
    END IF;
    RETURN NULL;
END
$$;
