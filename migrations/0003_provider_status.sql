-- What each worker process's circuit breakers say about each provider, so
-- that GET /v1/providers tells the truth in a deployment of many processes,
-- API-only ones included. Each worker upserts its rows every few seconds; a
-- row not refreshed for a while belongs to a process that is gone.
CREATE TABLE provider_status (
    process_id    text NOT NULL,
    channel       text NOT NULL CHECK (channel IN ('apns', 'fcm', 'webpush')),
    configured    boolean NOT NULL,
    state         text NOT NULL CHECK (state IN ('closed', 'open', 'half_open')),
    last_error    text,
    last_error_at timestamptz,
    -- Sends answered and transient failures since the process started, for
    -- error rates.
    sends         bigint NOT NULL DEFAULT 0,
    failures      bigint NOT NULL DEFAULT 0,
    updated_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (process_id, channel)
);
