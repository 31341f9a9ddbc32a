-- name: InsertAPIKey :one
-- app_ids NULL: the key acts for every app (migration 0021).
INSERT INTO api_keys (name, scope, digest, expires_at, app_ids)
VALUES (@name, @scope, @digest, @expires_at, @app_ids)
RETURNING *;

-- name: LiveAPIKeys :many
-- The keys a process accepts: not revoked and not expired. Every process
-- reads them about once a second; the table holds a row per key ever made.
SELECT name, scope, digest, expires_at, app_ids
FROM api_keys
WHERE revoked_at IS NULL AND (expires_at IS NULL OR expires_at > now())
ORDER BY id;

-- name: ListAPIKeys :many
-- A page of keys, revoked ones included, oldest first, after after_id.
SELECT * FROM api_keys
WHERE id > @after_id
ORDER BY id
LIMIT @page_size;

-- name: RevokeAPIKey :one
-- Revokes a key; a key revoked already keeps its first revocation.
UPDATE api_keys SET revoked_at = coalesce(revoked_at, now())
WHERE name = @name
RETURNING *;

-- name: TouchAPIKeys :exec
-- Records when keys were last used: a process's batch of what it saw.
UPDATE api_keys k
SET last_used_at = greatest(k.last_used_at, u.used_at)
FROM (SELECT unnest(@names::text[]) AS name, unnest(@used_at::timestamptz[]) AS used_at) u
WHERE k.name = u.name;
