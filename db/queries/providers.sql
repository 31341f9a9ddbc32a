-- name: UpsertProviderStatus :exec
INSERT INTO provider_status (process_id, channel, configured, state, last_error, last_error_at, sends, failures, updated_at)
VALUES (@process_id, @channel, @configured, @state, @last_error, @last_error_at, @sends, @failures, clock_timestamp())
ON CONFLICT (process_id, channel) DO UPDATE
SET configured = excluded.configured,
    state = excluded.state,
    last_error = excluded.last_error,
    last_error_at = excluded.last_error_at,
    sends = excluded.sends,
    failures = excluded.failures,
    updated_at = excluded.updated_at;

-- name: FreshProviderStatus :many
-- The rows of processes that reported recently.
SELECT process_id, channel, configured, state, last_error, last_error_at, sends, failures, updated_at
FROM provider_status
WHERE updated_at > clock_timestamp() - make_interval(secs => @max_age_seconds::double precision)
ORDER BY channel, process_id;

-- name: DeleteStaleProviderStatus :exec
DELETE FROM provider_status WHERE updated_at < clock_timestamp() - interval '1 hour';
