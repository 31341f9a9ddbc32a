-- The ledger writes each device once (docs/architecture.md).
--
-- Until now a message's ledger held a pending row for every device from its
-- scheduling, which the device's chunk read at the instant and then updated
-- with its result: two writes a device, the first of them a whole row
-- written seconds or days before anything was sent (a million-device
-- message wrote some 260 MB before its instant). Now the scheduling writes a
-- snapshot of each chunk's audience, the device ids the chunk owns (and,
-- for a localized message, the localization each gets), one row a chunk;
-- the chunk reads its devices from it, and a delivery's ledger row is
-- written once, by the write of its result. A device of a snapshot without
-- a row is pending. A cancel, an expiry or a device's erasure writes the
-- rows of the devices it settles, as the send would have.
--
-- The rows of a message scheduled by an earlier release stay as they were
-- (pending rows, chunk jobs of kind fan_out) and are sent as before: the
-- result write inserts a row or settles the pending one, whichever is
-- there.
CREATE TABLE chunk_devices (
    message_id   bigint NOT NULL REFERENCES messages (id) ON DELETE CASCADE,
    chunk        integer NOT NULL,
    due_at       timestamptz NOT NULL,
    first_device bigint NOT NULL,
    last_device  bigint NOT NULL,
    -- The chunk's device ids, in no particular order.
    devices      bigint[] NOT NULL,
    -- The localization key of each device (parallel to devices, NULL for
    -- the message's own text); NULL when the message has none.
    locales      text[],
    PRIMARY KEY (message_id, chunk)
);

-- Sorted ids compress: lz4 is cheaper to write and read than pglz.
ALTER TABLE chunk_devices ALTER COLUMN devices SET COMPRESSION lz4;
ALTER TABLE chunk_devices ALTER COLUMN locales SET COMPRESSION lz4;

-- What each process's release can do, written by its status reporter
-- before its provider status (jobs.StatusReporter). A process that reports
-- its providers without a row here is of an earlier release. Scheduling
-- writes snapshots (feature ledger_once) only while no process of a release
-- without them is alive: such a worker would read a snapshot chunk's
-- ledger rows and find none. It cannot run one anyway: a snapshot chunk's
-- job is of a kind of its own (fan_out_snapshot), which an earlier release
-- does not know, and River hands such a job back to be retried.
CREATE TABLE process_features (
    process_id text PRIMARY KEY,
    features   text[] NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- Every delivery of every message as the API lists it: the ledger's rows,
-- and the devices of the chunks' snapshots that have none, pending while
-- their message is, then cancelled or expired with it. For reading by hand
-- (psql) and by tests; Herald's own reads look at each part through its
-- primary key (Queries.ListAllDeliveries).
CREATE VIEW ledger AS
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
WHERE NOT EXISTS (SELECT 1 FROM deliveries d WHERE d.message_id = c.message_id AND d.device_id = s.device_id);

-- A ledger row is now written once, whole, by its result: the room its
-- page kept for the settled version of a pending row (fill factor 45,
-- migration 0008) is only wasted. A row updated after it (a throttled or
-- parked delivery, a row of a message scheduled with rows) is rare.
ALTER TABLE deliveries SET (fillfactor = 100);
