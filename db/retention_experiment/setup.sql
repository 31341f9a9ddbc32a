-- Two copies of the ledger's shape with :messages messages of 25,000 rows
-- each: ledger_flat as Herald has it, ledger_part partitioned by message id
-- into :partitions partitions (what time-partitioning would be: message ids
-- grow with time). Run by run.sh.
\set ON_ERROR_STOP on
DROP TABLE IF EXISTS ledger_flat, ledger_part CASCADE;
CREATE TABLE ledger_flat (
    message_id bigint NOT NULL, device_id bigint NOT NULL, user_id text NOT NULL, channel text NOT NULL,
    chunk integer NOT NULL, due_at timestamptz NOT NULL, status text NOT NULL DEFAULT 'pending',
    reason text, attempt smallint NOT NULL DEFAULT 0, attempted_at timestamptz, accepted_at timestamptz,
    PRIMARY KEY (message_id, device_id));
CREATE INDEX ledger_flat_pending ON ledger_flat (device_id) WHERE status = 'pending';
CREATE TABLE ledger_part (LIKE ledger_flat INCLUDING DEFAULTS, PRIMARY KEY (message_id, device_id))
    PARTITION BY RANGE (message_id);
CREATE INDEX ledger_part_pending ON ledger_part (device_id) WHERE status = 'pending';
SELECT format('CREATE TABLE ledger_part_%s PARTITION OF ledger_part FOR VALUES FROM (%s) TO (%s)',
              p, p * (:messages / :partitions) + 1, (p + 1) * (:messages / :partitions) + 1)
FROM generate_series(0, :partitions) p \gexec
INSERT INTO ledger_flat (message_id, device_id, user_id, channel, chunk, due_at, status, attempt, accepted_at)
SELECT m, d, 'u' || d, 'apns', d / 500, now(), 'accepted', 1, now()
FROM generate_series(1, :messages) m, generate_series(1, 25000) d;
INSERT INTO ledger_part SELECT * FROM ledger_flat;
VACUUM ANALYZE ledger_flat;
VACUUM ANALYZE ledger_part;
