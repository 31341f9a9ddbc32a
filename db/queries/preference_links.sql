-- name: UserCreatedAt :one
-- When a user was made. A link to the user's preferences form names it
-- (jobs/preferences: LinkSigner), so that a link made before the user was
-- erased opens nothing, even should the id be used again.
SELECT created_at FROM users WHERE id = @id;

-- name: ShareUserCreatedAt :one
-- UserCreatedAt, holding the user's row until the transaction ends: an
-- erasure (LockUser) waits for the preferences the form writes meanwhile,
-- and deletes them with the user.
SELECT created_at FROM users WHERE id = @id FOR SHARE;
