-- name: InsertAuditEntry :exec
INSERT INTO audit_log (key_name, operator, method, route, target_id, status, request_id, app)
VALUES (@key_name, @operator, @method, @route, @target_id, @status, @request_id, @app);

-- name: ListAuditEntries :many
-- A page of the audit log, newest first, before before_id, of one key or
-- one operator when given (audit_log_key_name_idx, audit_log_operator_idx).
SELECT * FROM audit_log
WHERE id < @before_id
  AND (sqlc.narg(key_name)::text IS NULL OR key_name = sqlc.narg(key_name)::text)
  AND (sqlc.narg(operator)::text IS NULL OR operator = sqlc.narg(operator)::text)
ORDER BY id DESC
LIMIT @page_size;

-- name: DeleteAuditEntries :execrows
-- Deletes at most max_rows entries older than the cutoff, oldest first.
DELETE FROM audit_log a
USING (
    SELECT e.id FROM audit_log e
    WHERE e.at < @cutoff
    ORDER BY e.at
    LIMIT @max_rows
) v
WHERE a.id = v.id;
