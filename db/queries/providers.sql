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

-- name: UpsertProcessFeatures :exec
-- What this process's release can do (migration 0022), reported before its
-- provider status so that it is never taken for an earlier release.
INSERT INTO process_features (process_id, features, updated_at)
VALUES (@process_id, @features::text[], clock_timestamp())
ON CONFLICT (process_id) DO UPDATE SET features = excluded.features, updated_at = excluded.updated_at;

-- name: ProcessesWithoutFeature :many
-- Processes that reported their providers in the last half minute without
-- naming the feature: of a release without it, or of one before features
-- were reported.
SELECT DISTINCT p.process_id
FROM provider_status p
WHERE p.updated_at > clock_timestamp() - interval '30 seconds'
  AND NOT EXISTS (SELECT 1 FROM process_features f
                  WHERE f.process_id = p.process_id AND @feature::text = ANY (f.features))
ORDER BY p.process_id;

-- name: DeleteStaleProcessFeatures :exec
DELETE FROM process_features WHERE updated_at < clock_timestamp() - interval '1 hour';
