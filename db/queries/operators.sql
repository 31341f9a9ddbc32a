-- name: InsertOperator :one
INSERT INTO operators (name, password_hash)
VALUES (@name, @password_hash)
RETURNING id, name, created_at;

-- name: OperatorPasswordHash :one
SELECT password_hash FROM operators WHERE name = @name;

-- name: ListOperators :many
SELECT name, created_at FROM operators ORDER BY name;

-- name: DeleteOperator :execrows
DELETE FROM operators WHERE name = @name;

-- name: CountOperators :one
SELECT count(*)::integer FROM operators;

-- name: InsertDashboardSession :exec
INSERT INTO dashboard_sessions (digest, operator, credential, expires_at)
VALUES (@digest, @operator, @credential, @expires_at);

-- name: LiveDashboardSession :one
-- The operator of a session that is neither revoked nor expired at now,
-- and the tag of the password it was opened with (admin's).
SELECT operator, credential FROM dashboard_sessions
WHERE digest = @digest AND revoked_at IS NULL AND expires_at > @now::timestamptz;

-- name: RevokeDashboardSession :exec
UPDATE dashboard_sessions SET revoked_at = coalesce(revoked_at, now())
WHERE digest = @digest;

-- name: RevokeOperatorSessions :execrows
UPDATE dashboard_sessions SET revoked_at = now()
WHERE operator = @operator AND revoked_at IS NULL;

-- name: DeleteEndedSessions :execrows
-- Deletes at most max_rows sessions that expired before the cutoff; a
-- revoked session goes when it would have expired.
DELETE FROM dashboard_sessions d
USING (
    SELECT s.digest FROM dashboard_sessions s
    WHERE s.expires_at < @cutoff
    ORDER BY s.expires_at
    LIMIT @max_rows
) v
WHERE d.digest = v.digest;

-- name: InsertSigningKey :exec
-- Stores a key for purpose unless one is there: the first process to ask
-- draws it, and every later one reads that (SigningKey, in a statement of
-- its own, so that it sees a key a racing process committed).
INSERT INTO signing_keys (purpose, key) VALUES (@purpose, @key)
ON CONFLICT (purpose) DO NOTHING;

-- name: SigningKey :one
SELECT key FROM signing_keys WHERE purpose = @purpose;
