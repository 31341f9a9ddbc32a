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
FROM ledger
WHERE message_id = @message_id AND status = 'accepted'
ORDER BY 1;

-- name: AcceptanceSpan :one
-- First and last acceptance of a message: its fan-out time.
SELECT min(accepted_at)::timestamptz AS first, max(accepted_at)::timestamptz AS last
FROM ledger
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
-- its workers read them (ChunkPending), once they were sent: herald bench
-- sends them again to measure the floor. (What users' preferences withheld
-- was not sent, and is not sent again.)
SELECT d.chunk, d.device_id, d.channel, v.token, v.p256dh, v.auth, v.environment
FROM ledger d
JOIN devices v ON v.id = d.device_id
WHERE d.message_id = @message_id AND d.chunk >= 0 AND d.status = 'accepted'
ORDER BY d.chunk, d.device_id;

-- name: SetBenchPreferences :exec
-- Gives the population preferences for a run with --preferences, by the
-- number in each user's id (u0, u1, ...): a tenth opted out of the bench's
-- category (n % 10 = 0); a third with quiet hours (n % 3 = 1), of whom a
-- third (n % 9 = 1) are inside them at the instant (held_start to
-- held_end, UTC: they end moments after it) and the rest far from it; and
-- a tenth (n % 10 = 5) at the category's cap already, their history full
-- of cap_count earlier messages.
WITH population AS (
    SELECT id, substring(id from 2)::integer AS n FROM users WHERE id ~ '^u[0-9]+$'
), prefs AS (
    INSERT INTO user_preferences (user_id, opt_outs, quiet_start, quiet_end)
    SELECT id,
           CASE WHEN n % 10 = 0 THEN ARRAY[@category::text] ELSE '{}' END,
           CASE WHEN n % 9 = 1 THEN @held_start::time WHEN n % 3 = 1 THEN @far_start::time END,
           CASE WHEN n % 9 = 1 THEN @held_end::time WHEN n % 3 = 1 THEN @far_end::time END
    FROM population
    WHERE n % 10 = 0 OR n % 3 = 1
    ON CONFLICT (user_id) DO UPDATE
    SET opt_outs = excluded.opt_outs, quiet_start = excluded.quiet_start, quiet_end = excluded.quiet_end
)
INSERT INTO frequency_caps (user_id, category, message_ids, sent_at, last_at)
SELECT id, @category::text, array_agg(-g ORDER BY g), array_agg(now() ORDER BY g), now()
FROM population, generate_series(1, @cap_count::integer) g
WHERE n % 10 = 5
GROUP BY id
ON CONFLICT (user_id, category) DO UPDATE
SET message_ids = excluded.message_ids, sent_at = excluded.sent_at, last_at = excluded.last_at;

-- name: BenchWithheld :one
-- What a --preferences run's message should have withheld, by the rules
-- SetBenchPreferences gave its users (opt-outs first, then quiet hours,
-- then the cap, as the chunks decide), against what its ledger says: the
-- deliveries held by quiet hours are those due after the message.
SELECT count(*) FILTER (WHERE p.n % 10 = 0)::integer AS want_opted_out,
       count(*) FILTER (WHERE p.n % 10 <> 0 AND p.n % 9 = 1)::integer AS want_held,
       count(*) FILTER (WHERE p.n % 10 = 5)::integer AS want_capped,
       count(*) FILTER (WHERE d.status = 'cancelled' AND d.reason = 'opted_out')::integer AS opted_out,
       count(*) FILTER (WHERE d.due_at > m.dispatch_at)::integer AS held,
       count(*) FILTER (WHERE d.status = 'cancelled' AND d.reason = 'capped')::integer AS capped
FROM ledger d
JOIN messages m ON m.id = d.message_id
JOIN devices v ON v.id = d.device_id
JOIN LATERAL (SELECT substring(v.user_id from 2)::integer AS n) p ON true
WHERE d.message_id = @message_id;

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
FROM ledger
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
