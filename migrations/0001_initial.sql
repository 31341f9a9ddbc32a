-- Herald's schema for the whole product: the directory (users, devices,
-- segments), what callers schedule (messages, payloads, schedules,
-- idempotency keys) and the per-device delivery ledger. River's own tables
-- come from River's migrator in the same `herald migrate` step.
--
-- Identifiers chosen by callers (users, segments) are text; identifiers
-- Herald mints (devices, messages, payloads, schedules) are bigint identities,
-- because the ledger holds one row per (message, device) and the chunk jobs
-- carry device ids by the thousand, so their width is paid many times over.
-- Statuses are text with CHECK constraints rather than enum types, so that a
-- later migration can add a value inside a transaction.

CREATE TABLE users (
    id         text PRIMARY KEY,
    -- IANA zone used for local-time delivery; NULL means the request's fallback.
    timezone   text,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE devices (
    id             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    user_id        text NOT NULL REFERENCES users (id),
    channel        text NOT NULL CHECK (channel IN ('apns', 'fcm', 'webpush')),
    -- The APNs or FCM token, or the Web Push endpoint: whatever identifies the
    -- device to its provider. Its length is capped by the API so that it fits
    -- in a btree entry.
    token          text NOT NULL,
    -- The Web Push subscription's keys (base64url); NULL on other channels.
    p256dh         text,
    auth           text,
    status         text NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'evicted')),
    evicted_reason text,
    evicted_at     timestamptz,
    created_at     timestamptz NOT NULL DEFAULT now(),
    updated_at     timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT devices_channel_token_key UNIQUE (channel, token),
    CONSTRAINT devices_webpush_keys CHECK ((channel = 'webpush') = (p256dh IS NOT NULL AND auth IS NOT NULL)),
    CONSTRAINT devices_eviction CHECK ((status = 'evicted') = (evicted_at IS NOT NULL))
);

-- Audience expansion reads a user's active devices; listing reads them all.
CREATE INDEX devices_user_id_idx ON devices (user_id, id);

CREATE TABLE segments (
    id         text PRIMARY KEY,
    name       text NOT NULL DEFAULT '',
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE segment_members (
    segment_id text NOT NULL REFERENCES segments (id) ON DELETE CASCADE,
    user_id    text NOT NULL REFERENCES users (id),
    added_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (segment_id, user_id)
);

-- A message's content, stored once and referenced by the message and by every
-- chunk job, so that a 50-chunk message does not carry 50 copies of it. A
-- schedule's runs share the schedule's payload.
CREATE TABLE payloads (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    content    jsonb NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE schedules (
    id                bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    cron              text NOT NULL,
    timezone          text NOT NULL,
    audience          jsonb NOT NULL,
    payload_id        bigint NOT NULL REFERENCES payloads (id),
    priority          text NOT NULL CHECK (priority IN ('urgent', 'bulk')),
    ttl_seconds       integer NOT NULL CHECK (ttl_seconds > 0),
    -- When true each run is delivered at the run's wall time in every
    -- recipient's own zone, with fallback_timezone and if_passed as on a
    -- local-time message.
    local_time        boolean NOT NULL DEFAULT false,
    fallback_timezone text NOT NULL DEFAULT 'UTC',
    if_passed         text NOT NULL DEFAULT 'skip' CHECK (if_passed IN ('skip', 'send_now')),
    starts_at         timestamptz,
    ends_at           timestamptz,
    paused            boolean NOT NULL DEFAULT false,
    -- The first run instant not yet turned into a message; NULL once the
    -- schedule has no runs left. The materializer advances it.
    next_run_at       timestamptz,
    created_at        timestamptz NOT NULL DEFAULT now(),
    updated_at        timestamptz NOT NULL DEFAULT now(),
    -- Schedules are deleted softly: their past runs stay listable by schedule_id.
    deleted_at        timestamptz
);

CREATE INDEX schedules_due_idx ON schedules (next_run_at)
    WHERE NOT paused AND deleted_at IS NULL AND next_run_at IS NOT NULL;

CREATE TABLE messages (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- The message's progress only; per-device truth lives in deliveries.
    state           text NOT NULL DEFAULT 'scheduled'
                    CHECK (state IN ('scheduled', 'dispatching', 'dispatched', 'cancelled', 'expired')),
    priority        text NOT NULL CHECK (priority IN ('urgent', 'bulk')),
    -- For a local-time message, the earliest wave; each delivery has its own due_at.
    dispatch_at     timestamptz NOT NULL,
    -- The earliest wave's expiry. A delivery expires at its due_at plus the
    -- message's lifetime (expires_at - dispatch_at).
    expires_at      timestamptz NOT NULL,
    payload_id      bigint NOT NULL REFERENCES payloads (id),
    -- The audience as the caller gave it, for display.
    audience        jsonb NOT NULL,
    -- {"deliver_at_local","fallback_timezone","if_passed"} for a local-time message.
    local_time      jsonb,
    recipient_count integer NOT NULL DEFAULT 0,
    device_count    integer NOT NULL DEFAULT 0,
    chunk_count     integer NOT NULL DEFAULT 0,
    -- Delivery counters, kept in the same transaction as every ledger change,
    -- so that reading a message's status is one row however large it is, and
    -- device_count always equals their sum.
    pending_count   integer NOT NULL DEFAULT 0,
    accepted_count  integer NOT NULL DEFAULT 0,
    failed_count    integer NOT NULL DEFAULT 0,
    expired_count   integer NOT NULL DEFAULT 0,
    cancelled_count integer NOT NULL DEFAULT 0,
    schedule_id     bigint REFERENCES schedules (id),
    schedule_run_at timestamptz,
    started_at      timestamptz,
    settled_at      timestamptz,
    cancelled_at    timestamptz,
    -- Skew percentiles over accepted deliveries (accepted_at - due_at, in
    -- milliseconds), written once when the message settles so that reading a
    -- settled message never re-sorts its ledger.
    skew_p50_ms     double precision,
    skew_p95_ms     double precision,
    skew_p99_ms     double precision,
    skew_max_ms     double precision,
    created_at      timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT messages_expiry CHECK (expires_at > dispatch_at),
    CONSTRAINT messages_counters CHECK (
        device_count = pending_count + accepted_count + failed_count + expired_count + cancelled_count),
    -- One message per schedule run, however many materializers race.
    CONSTRAINT messages_schedule_run_key UNIQUE (schedule_id, schedule_run_at)
);

-- Listing is newest first by id, optionally by state or schedule.
CREATE INDEX messages_state_id_idx ON messages (state, id);
CREATE INDEX messages_schedule_id_idx ON messages (schedule_id, id) WHERE schedule_id IS NOT NULL;

-- The delivery ledger: one row per (message, device), written pending when the
-- message is scheduled and settled by the chunk worker. Its primary key is
-- what makes at-least-once chunk execution idempotent.
--
-- It has no foreign keys: every row is written in the message's own
-- transaction (so the message exists), checking 25,000 references at schedule
-- time would cost more than the check is worth, and the ledger must outlive a
-- deleted device as the record of what was sent to it.
CREATE TABLE deliveries (
    message_id   bigint NOT NULL,
    device_id    bigint NOT NULL,
    -- The user and channel as they were when the message was scheduled.
    user_id      text NOT NULL,
    channel      text NOT NULL CHECK (channel IN ('apns', 'fcm', 'webpush')),
    chunk        integer NOT NULL,
    -- When this device is due: the message's dispatch_at, or its wave's for
    -- local-time delivery. Skew is accepted_at - due_at.
    due_at       timestamptz NOT NULL,
    status       text NOT NULL DEFAULT 'pending'
                 CHECK (status IN ('pending', 'accepted', 'failed', 'expired', 'cancelled')),
    reason       text CHECK (reason IN ('unregistered', 'bad_token', 'payload_rejected', 'rate_limited',
                                        'provider_unavailable', 'channel_disabled', 'internal')),
    attempt      smallint NOT NULL DEFAULT 0,
    attempted_at timestamptz,
    accepted_at  timestamptz,
    PRIMARY KEY (message_id, device_id),
    -- A failure always says why; an expired delivery may say what kept it back.
    CONSTRAINT deliveries_reason CHECK (status <> 'failed' OR reason IS NOT NULL)
);

-- No index on status: counts live on the message row, and a page of one
-- status walks the primary key of one message (tens of thousands of rows at
-- most), which is cheaper than maintaining a second index through every
-- status change on the dispatch path.
--
-- Deleting a device cancels what is still pending for it. The index is
-- partial, so a delivery leaves it when it settles and costs nothing after.
CREATE INDEX deliveries_pending_device_idx ON deliveries (device_id) WHERE status = 'pending';

-- The chunks of a message: the River job that carries each, the wave it
-- belongs to, and what the worker saw, so that a slow dispatch can be broken
-- down (pickup lag, first and last acceptance) and a cancel can find its jobs.
CREATE TABLE message_chunks (
    message_id        bigint NOT NULL REFERENCES messages (id) ON DELETE CASCADE,
    chunk             integer NOT NULL,
    job_id            bigint NOT NULL,
    due_at            timestamptz NOT NULL,
    device_count      integer NOT NULL,
    started_at        timestamptz,
    first_accepted_at timestamptz,
    last_accepted_at  timestamptz,
    -- When the worker finished sending, and when its results were written
    -- (inside the writing transaction): the difference is the ledger write.
    finished_at       timestamptz,
    recorded_at       timestamptz,
    PRIMARY KEY (message_id, chunk)
);

-- Idempotency keys of POST /v1/messages. The scope is a digest of the API key
-- that used it, so two callers never share a key space.
CREATE TABLE idempotency_keys (
    scope        text NOT NULL,
    key          text NOT NULL,
    request_hash bytea NOT NULL,
    -- Filled in by the same transaction that claimed the key; a concurrent
    -- retry waits on the claim and then reads them.
    message_id   bigint,
    response     jsonb,
    created_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (scope, key)
);

CREATE INDEX idempotency_keys_created_at_idx ON idempotency_keys (created_at);
