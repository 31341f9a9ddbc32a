-- name: EnsureUsers :exec
-- Creates the users that do not exist yet. Callers pass the ids sorted and
-- distinct, so that concurrent calls lock rows in one order and cannot deadlock.
INSERT INTO users (id)
SELECT unnest(@ids::text[])
ON CONFLICT (id) DO NOTHING;

-- name: UpsertUser :one
-- PUT /v1/users/{id}: the caller's fields replace the user's.
INSERT INTO users (id, timezone, locale)
VALUES (@id, @timezone, @locale)
ON CONFLICT (id) DO UPDATE
SET timezone = excluded.timezone,
    locale = excluded.locale,
    updated_at = now()
RETURNING id, timezone, locale, created_at, updated_at, (xmax = 0)::boolean AS created;

-- name: UserExists :one
SELECT EXISTS (SELECT 1 FROM users WHERE id = @id)::boolean;

-- name: GetUser :one
-- A user with how many devices it has, and how many of them are active
-- (the ones messages go to).
SELECT u.id, u.timezone, u.locale, u.created_at, u.updated_at,
       (SELECT count(*) FROM devices d WHERE d.user_id = u.id)::integer AS device_count,
       (SELECT count(*) FROM devices d WHERE d.user_id = u.id AND d.status = 'active')::integer AS active_device_count
FROM users u
WHERE u.id = @id;

-- name: LockUser :one
-- Holds a user for its erasure: registrations and membership changes for
-- it wait (they lock or reference the row), so none lands half-way.
SELECT id FROM users WHERE id = @id FOR UPDATE;

-- name: UserDeviceIDs :many
SELECT id FROM devices WHERE user_id = @user_id ORDER BY id;

-- name: DeleteUserMemberships :execrows
DELETE FROM segment_members WHERE user_id = @user_id;

-- name: DeleteUserDevices :execrows
DELETE FROM devices WHERE user_id = @user_id;

-- name: DeleteUser :execrows
DELETE FROM users WHERE id = @id;

-- name: LockDirectoryShared :exec
-- Taken by every transaction that expands an audience into a message's
-- ledger, before it reads the devices; erasing a device or a user takes the
-- same lock exclusively (LockDirectoryExclusive) before cancelling their
-- pending deliveries. So a message being made while a device is erased has
-- either committed its ledger rows before the erasure cancels them, or reads
-- the devices after the erasure committed and never sees them.
SELECT pg_advisory_xact_lock_shared(hashtextextended('herald:directory-erase', 0));

-- name: LockDirectoryExclusive :exec
SELECT pg_advisory_xact_lock(hashtextextended('herald:directory-erase', 0));
