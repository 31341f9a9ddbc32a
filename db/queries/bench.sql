-- name: ChunkTimings :many
-- Where a message's time went, chunk by chunk, in milliseconds after each
-- chunk's due time (database clock): River pickup, first and last provider
-- acceptance, end of sending, and results written. -1 stands for never.
SELECT chunk, device_count,
       coalesce(extract(epoch FROM started_at - due_at) * 1000, -1)::double precision AS pickup_ms,
       coalesce(extract(epoch FROM first_accepted_at - due_at) * 1000, -1)::double precision AS first_accept_ms,
       coalesce(extract(epoch FROM last_accepted_at - due_at) * 1000, -1)::double precision AS last_accept_ms,
       coalesce(extract(epoch FROM finished_at - due_at) * 1000, -1)::double precision AS finished_ms,
       coalesce(extract(epoch FROM recorded_at - finished_at) * 1000, -1)::double precision AS write_ms
FROM message_chunks
WHERE message_id = @message_id
ORDER BY chunk;

-- name: AcceptedSkews :many
-- Every accepted delivery's skew in milliseconds, in order.
SELECT (extract(epoch FROM accepted_at - due_at) * 1000)::double precision AS skew_ms
FROM deliveries
WHERE message_id = @message_id AND status = 'accepted'
ORDER BY 1;

-- name: AcceptanceSpan :one
-- First and last acceptance of a message: its fan-out time.
SELECT min(accepted_at)::timestamptz AS first, max(accepted_at)::timestamptz AS last
FROM deliveries
WHERE message_id = @message_id AND status = 'accepted';

-- name: AnalyzeDeliveries :exec
-- Gives the planner the ledger's statistics once a message's rows are in.
ANALYZE deliveries;

-- name: Ping :exec
-- One round trip that does nothing: what a database probe measures.
SELECT 1;

-- name: DataDirectory :one
-- Where the server keeps its data, to find its postmaster's process.
SELECT current_setting('data_directory')::text;

-- name: TableSizes :many
-- The size on disk of each named table, its heap and its indexes apart, and
-- the live rows the statistics count (herald soak).
SELECT t.name::text AS name,
       pg_relation_size(t.name::regclass)::bigint AS heap_bytes,
       pg_indexes_size(t.name::regclass)::bigint AS index_bytes,
       pg_stat_get_live_tuples(t.name::regclass)::bigint AS live_rows
FROM unnest(@names::text[]) AS t(name)
ORDER BY 1;

-- name: InsertHistoryMessage :one
-- One settled message of the history `herald bench --history` fills in,
-- dispatched at dispatch_at to devices devices in chunks of 500.
WITH p AS (
    SELECT @dispatch_at::timestamptz AS at, @devices::integer AS n, @payload_id::bigint AS payload_id
), m AS (
    INSERT INTO messages (state, priority, dispatch_at, expires_at, payload_id, audience, recipient_count,
                          device_count, chunk_count, accepted_count, started_at, settled_at, created_at)
    SELECT 'dispatched', 'bulk', p.at, p.at + interval '1 hour', p.payload_id, '{}', p.n,
           p.n, (p.n + 499) / 500, p.n, p.at, p.at + interval '2 seconds', p.at
    FROM p
    RETURNING id
), c AS (
    INSERT INTO message_chunks (message_id, chunk, job_id, due_at, device_count)
    SELECT m.id, k, 0, p.at, 500 FROM m, p, generate_series(0, (p.n - 1) / 500) k
)
SELECT id FROM m;

-- name: InsertHistoryDeliveries :execrows
-- A history message's ledger: devices 1 to devices, all accepted.
INSERT INTO deliveries (message_id, device_id, user_id, channel, chunk, due_at, status, attempt, attempted_at, accepted_at)
SELECT p.message_id, d, 'u' || d, 'apns', (d - 1) / 500, p.at, 'accepted', 1, p.at, p.at + interval '50 milliseconds'
FROM (SELECT @message_id::bigint AS message_id, @dispatch_at::timestamptz AS at) p, generate_series(1, @devices::integer) d;

-- name: VacuumAnalyze :exec
-- Leaves nothing for autovacuum to do during a measurement, as on a
-- database whose history was written long ago.
VACUUM ANALYZE;

-- name: Checkpoint :exec
-- Writes the history's pages out before a measurement, so that the
-- checkpointer's CPU is not counted in it.
CHECKPOINT;

-- name: SetBenchLocales :execrows
-- Gives the population's users locales for a localized run: a fifth each
-- de-AT, pt-BR, fr, es, and none, spread by id.
UPDATE users SET locale = (ARRAY['de-AT', 'pt-BR', 'fr', 'es', NULL])[1 + abs(hashtext(id)) % 5];

-- name: BenchChunkTargets :many
-- A message's devices chunk by chunk, with what their provider needs, as
-- its workers read them (ChunkPending) but whatever their status: herald
-- bench sends them again to measure the floor.
SELECT d.chunk, d.device_id, d.channel, v.token, v.p256dh, v.auth, v.environment
FROM ledger d
JOIN devices v ON v.id = d.device_id
WHERE d.message_id = @message_id AND d.chunk >= 0
ORDER BY d.chunk, d.device_id;

-- name: VacuumMessageTables :exec
-- What autovacuum does, sooner or later, after a message settled: the
-- dead versions of its ledger rows, chunks, message row and chunk jobs
-- removed, and the statistics of the tables it changed brought up to date.
VACUUM (ANALYZE) deliveries, chunk_devices, message_chunks, messages, payloads, river_job;

-- name: BackendPIDs :many
-- The server processes of the connections that named themselves
-- application_name: whose CPU a bench reads apart.
SELECT a.pid::integer AS pid FROM pg_stat_get_activity(NULL) AS a WHERE a.application_name = @application_name::text;

-- name: SkewSpan :one
-- A message's first and last acceptance after its due time, in
-- milliseconds (database clock).
SELECT coalesce(min(extract(epoch FROM accepted_at - due_at) * 1000), -1)::double precision AS first_ms,
       coalesce(max(extract(epoch FROM accepted_at - due_at) * 1000), -1)::double precision AS last_ms
FROM deliveries
WHERE message_id = @message_id AND status = 'accepted';

-- name: BenchConfirmed :one
-- A message's deliveries confirmed by their devices, and opened, as its
-- row counts them.
SELECT confirmed_count, opened_count FROM messages WHERE id = @message_id;

-- name: ConfirmedSkews :many
-- Every delivered receipt's skew in milliseconds (received_at less the
-- delivery's due_at), in order.
SELECT skew_ms FROM receipts
WHERE message_id = @message_id AND event = 'delivered'
ORDER BY 1;

-- name: DatabaseSize :one
-- The bench database's size on disk, in bytes: what scheduling made it
-- grow by before the instant.
SELECT pg_database_size(current_database())::bigint;
