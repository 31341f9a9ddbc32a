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

-- name: Analyze :exec
-- Gives the planner statistics of every table, as a production database
-- has them (herald bench, after the population).
ANALYZE;

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
