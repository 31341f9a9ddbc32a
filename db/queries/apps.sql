-- name: AppsVersion :one
-- How many times the apps and their credentials have changed: a process
-- reads them again only when this moved (migration 0021).
SELECT version FROM apps_changed;

-- name: ListApps :many
SELECT id, name, disabled_at, created_at, updated_at FROM apps ORDER BY id;

-- name: GetApp :one
SELECT id, name, disabled_at, created_at, updated_at FROM apps WHERE name = @name;

-- name: CreateApp :one
-- Makes an app; an app of the name already there is returned as it is,
-- created false.
WITH made AS (
    INSERT INTO apps (name) VALUES (@name)
    ON CONFLICT (name) DO NOTHING
    RETURNING id, name, disabled_at, created_at, updated_at
)
SELECT id, name, disabled_at, created_at, updated_at, true AS created FROM made
UNION ALL
SELECT id, name, disabled_at, created_at, updated_at, false AS created FROM apps
WHERE name = @name AND NOT EXISTS (SELECT 1 FROM made);

-- name: SetAppDisabled :one
-- Disables an app, or enables it again.
UPDATE apps
SET disabled_at = CASE WHEN @disabled::boolean THEN coalesce(disabled_at, now()) END,
    updated_at = now()
WHERE name = @name
RETURNING id, name, disabled_at, created_at, updated_at;

-- name: LiveCredentials :many
-- The credentials every process builds its provider clients from: the
-- active and retiring ones of every app.
SELECT id, app_id, channel, version, state, public, sealed, seal_key, created_at
FROM app_credentials
WHERE state <> 'retired'
ORDER BY app_id, channel, version;

-- name: ListAppCredentials :many
-- An app's credentials, retired ones included, newest first: what may be
-- shown of them, never the sealed part.
SELECT id, app_id, channel, version, state, public, created_at, retired_at
FROM app_credentials
WHERE app_id = @app_id
ORDER BY channel, version DESC;

-- name: LockAppChannel :exec
-- Serialises the rotations of one app's channel, so that two of them at
-- once do not both take the next version.
SELECT pg_advisory_xact_lock(hashtextextended('herald.app_credentials.' || @app_channel::text, 0));

-- name: StepDownCredential :exec
-- Before a new credential of an app's channel is added: the active one is
-- retired, or for Web Push kept as retiring, still used for the
-- subscriptions made with its key.
UPDATE app_credentials
SET state = CASE WHEN channel = 'webpush' THEN 'retiring' ELSE 'retired' END,
    retired_at = CASE WHEN channel = 'webpush' THEN NULL ELSE now() END
WHERE app_id = @app_id AND channel = @channel AND state = 'active';

-- name: NextCredentialVersion :one
-- The version an app's channel's next credential takes; run under
-- LockAppChannel, so that the version is still free at the insert.
SELECT (coalesce(max(version), 0) + 1)::integer AS version
FROM app_credentials
WHERE app_id = @app_id AND channel = @channel;

-- name: InsertCredential :one
INSERT INTO app_credentials (app_id, channel, version, state, public, sealed, seal_key)
VALUES (@app_id, @channel, @version, 'active', @public, @sealed, @seal_key)
RETURNING id, app_id, channel, version, state, public, created_at, retired_at;

-- name: ResealCredential :exec
-- Replaces a credential's sealed part, sealed again with another key.
UPDATE app_credentials SET sealed = @sealed, seal_key = @seal_key WHERE id = @id;

-- name: RetireCredentials :many
-- Retires an app's credentials of a channel: every live one, or the one of
-- the given version (0 for all). A retired credential is used for nothing.
UPDATE app_credentials
SET state = 'retired', retired_at = now()
WHERE app_id = @app_id AND channel = @channel AND state <> 'retired'
  AND (@version::integer = 0 OR version = @version::integer)
RETURNING id, app_id, channel, version, state, public, created_at, retired_at;

-- name: RetireUnusedWebPushCredentials :many
-- Retires the retiring Web Push credentials that no active subscription
-- was made with any more: every browser has subscribed again with the new
-- key.
UPDATE app_credentials c
SET state = 'retired', retired_at = now()
WHERE c.state = 'retiring'
  AND NOT EXISTS (SELECT 1 FROM devices d WHERE d.credential_id = c.id AND d.status = 'active')
RETURNING c.id, c.app_id, c.channel, c.version;

-- name: CredentialSubscriptions :many
-- How many active devices each live Web Push credential of an app has.
SELECT c.id, count(d.id)::bigint AS devices
FROM app_credentials c
LEFT JOIN devices d ON d.credential_id = c.id AND d.status = 'active'
WHERE c.app_id = @app_id AND c.channel = 'webpush' AND c.state <> 'retired'
GROUP BY c.id;

-- name: ProcessesWithoutApps :many
-- Processes of a release without apps that reported their providers in the
-- last half minute: they send every device with the environment's
-- credentials, so no other app may be made while one is alive.
SELECT DISTINCT p.process_id
FROM provider_status p
WHERE p.updated_at > clock_timestamp() - interval '30 seconds'
  AND NOT EXISTS (SELECT 1 FROM app_provider_status a WHERE a.process_id = p.process_id)
ORDER BY p.process_id;

-- name: UpsertAppProviderStatus :exec
INSERT INTO app_provider_status (process_id, app_id, channel, configured, state, last_error, last_error_at,
                                 sends, failures, refused, last_refused, last_refused_at, updated_at)
VALUES (@process_id, @app_id, @channel, @configured, @state, @last_error, @last_error_at,
        @sends, @failures, @refused, @last_refused, @last_refused_at, clock_timestamp())
ON CONFLICT (process_id, app_id, channel) DO UPDATE
SET configured = excluded.configured,
    state = excluded.state,
    last_error = excluded.last_error,
    last_error_at = excluded.last_error_at,
    sends = excluded.sends,
    failures = excluded.failures,
    refused = excluded.refused,
    last_refused = excluded.last_refused,
    last_refused_at = excluded.last_refused_at,
    updated_at = excluded.updated_at;

-- name: FreshAppProviderStatus :many
-- The per-app rows of processes that reported recently.
SELECT s.process_id, s.app_id, a.name AS app, s.channel, s.configured, s.state, s.last_error, s.last_error_at,
       s.sends, s.failures, s.refused, s.last_refused, s.last_refused_at, s.updated_at
FROM app_provider_status s
JOIN apps a ON a.id = s.app_id
WHERE s.updated_at > clock_timestamp() - make_interval(secs => @max_age_seconds::double precision)
ORDER BY a.name, s.channel, s.process_id;

-- name: DeleteStaleAppProviderStatus :exec
DELETE FROM app_provider_status WHERE updated_at < clock_timestamp() - interval '1 hour';

-- name: MessageAppCounts :many
-- A message's deliveries by their device's app and status: the message's
-- counters app by app. A delivery whose device was deleted since has no
-- app (app_id 0). It reads the view ledger (migration 0022): the rows, and
-- the snapshots' devices without one, with their message's fate. withheld
-- is the reason of a delivery withheld for its user's sake (migration
-- 0024: opted_out, quiet_hours, capped), empty for any other.
SELECT coalesce(v.app_id, 0)::integer AS app_id, l.status::text AS status,
       (CASE WHEN l.reason IN ('opted_out', 'quiet_hours', 'capped') THEN l.reason ELSE '' END)::text AS withheld,
       count(*)::bigint AS deliveries
FROM ledger l
LEFT JOIN devices v ON v.id = l.device_id
WHERE l.message_id = @message_id
GROUP BY 1, 2, 3
ORDER BY 1, 2, 3;
