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
