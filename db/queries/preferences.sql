-- name: ListCategories :many
-- Every declared category (migration 0024), by name.
SELECT name, critical, cap_count, cap_period_s, created_at, updated_at
FROM categories
ORDER BY name;

-- name: GetCategory :one
SELECT name, critical, cap_count, cap_period_s, created_at, updated_at
FROM categories
WHERE name = @name;

-- name: PutCategory :one
-- PUT /v1/categories/{name}: the caller's rule replaces the category's.
INSERT INTO categories (name, critical, cap_count, cap_period_s)
VALUES (@name, @critical, @cap_count, @cap_period_s)
ON CONFLICT (name) DO UPDATE
SET critical = excluded.critical,
    cap_count = excluded.cap_count,
    cap_period_s = excluded.cap_period_s,
    updated_at = now()
RETURNING name, critical, cap_count, cap_period_s, created_at, updated_at, (xmax = 0)::boolean AS created;

-- name: DeleteCategory :execrows
-- A category deleted is an ordinary one again; the messages that name it
-- keep its name.
DELETE FROM categories WHERE name = @name;

-- name: GetUserPreferences :one
-- A user's preferences with the user's zone; a user without a row of
-- preferences has none: no opt-outs, the installation's quiet hours.
SELECT u.id AS user_id, u.timezone,
       coalesce(p.opt_outs, '{}')::text[] AS opt_outs,
       p.quiet_start, p.quiet_end, p.updated_at
FROM users u
LEFT JOIN user_preferences p ON p.user_id = u.id
WHERE u.id = @user_id;

-- name: PutUserPreferences :exec
-- PUT /v1/users/{id}/preferences: the caller's preferences replace the
-- user's. The user exists (the caller checked in the same transaction).
INSERT INTO user_preferences (user_id, opt_outs, quiet_start, quiet_end)
VALUES (@user_id, @opt_outs, @quiet_start, @quiet_end)
ON CONFLICT (user_id) DO UPDATE
SET opt_outs = excluded.opt_outs,
    quiet_start = excluded.quiet_start,
    quiet_end = excluded.quiet_end,
    updated_at = now();

-- name: GetQuietHoursDefault :one
SELECT quiet_start, quiet_end, timezone, updated_at FROM quiet_hours_default;

-- name: PutQuietHoursDefault :one
INSERT INTO quiet_hours_default (quiet_start, quiet_end, timezone)
VALUES (@quiet_start, @quiet_end, @timezone)
ON CONFLICT (one) DO UPDATE
SET quiet_start = excluded.quiet_start,
    quiet_end = excluded.quiet_end,
    timezone = excluded.timezone,
    updated_at = now()
RETURNING quiet_start, quiet_end, timezone, updated_at;

-- name: DeleteQuietHoursDefault :execrows
DELETE FROM quiet_hours_default;

-- name: DeleteStaleFrequencyCaps :execrows
-- Retention, over the pages from_block to to_block (excluded) of the
-- table, read as a range of row addresses: a cap's history whose last
-- message is older than its category's period counts for no cap any more,
-- nor does one of a category that has no cap now. The retainer sweeps the
-- table a range at a time (migration 0026 dropped the index on last_at, so
-- that a claim's update is heap-only).
DELETE FROM frequency_caps f
WHERE f.ctid >= format('(%s,0)', @from_block::bigint)::tid
  AND f.ctid < format('(%s,0)', @to_block::bigint)::tid
  AND NOT EXISTS (SELECT 1 FROM categories c
                  WHERE c.name = f.category AND c.cap_period_s IS NOT NULL
                    AND f.last_at >= now() - c.cap_period_s * interval '1 second');

-- name: FrequencyCapBlocks :one
-- How many pages the cap histories' table has: where a sweep of
-- DeleteStaleFrequencyCaps ends.
SELECT (pg_relation_size('frequency_caps') / current_setting('block_size')::bigint)::bigint;

-- name: ChunkRules :one
-- What a chunk needs of its message's category and the installation when
-- it begins (db.BeginChunk reads it in the same round trip): the category,
-- whether it is critical, its cap (0 for none), the message's quiet-hours
-- mode, and the installation's default quiet hours with the zone of users
-- who have none. A category without a row is an ordinary one.
SELECT m.category, m.quiet_hours,
       coalesce(c.critical, false)::boolean AS critical,
       coalesce(c.cap_count, 0)::integer AS cap_count,
       coalesce(c.cap_period_s, 0)::integer AS cap_period_s,
       q.quiet_start, q.quiet_end, coalesce(q.timezone, 'UTC')::text AS default_timezone
FROM messages m
LEFT JOIN categories c ON c.name = m.category
LEFT JOIN quiet_hours_default q ON true
WHERE m.id = @message_id;

-- name: HeldDeliveries :many
-- How many deliveries of each of the messages given are held by their
-- users' quiet hours: the sum of what each chunk's last attempt held
-- (message_chunks.held), read without reading the ledger. A delivery held
-- and then cancelled by its device's deletion or move is counted until its
-- chunk's next attempt, at the end of the hours.
SELECT message_id, sum(held)::integer AS held
FROM message_chunks
WHERE message_id = ANY (@message_ids::bigint[])
GROUP BY message_id;
