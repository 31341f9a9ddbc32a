-- What the people reminded are owed (docs/preferences.md): a message's
-- category, each user's opt-outs and quiet hours, and each category's
-- frequency cap, all decided when a delivery is sent, not when its message
-- is scheduled.

-- A category is a name the caller defines. A message names one (default
-- 'default'); a name without a row here is an ordinary category: no cap,
-- not critical. A critical category is never opted out of, never held by
-- quiet hours and never capped (a medication or security alert). A cap is
-- at most cap_count messages to a user in any cap_period_s seconds.
CREATE TABLE categories (
    name         text PRIMARY KEY CHECK (name ~ '^[a-z0-9][a-z0-9._-]{0,62}$'),
    critical     boolean NOT NULL DEFAULT false,
    cap_count    integer CHECK (cap_count BETWEEN 1 AND 10000),
    cap_period_s integer CHECK (cap_period_s BETWEEN 60 AND 31622400),
    created_at   timestamptz NOT NULL DEFAULT now(),
    updated_at   timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT categories_cap_whole CHECK ((cap_count IS NULL) = (cap_period_s IS NULL)),
    CONSTRAINT categories_critical_uncapped CHECK (NOT (critical AND cap_count IS NOT NULL))
);

-- A message's category, and what quiet hours do to it: hold a delivery to
-- the end of its user's window, or skip it (cancelled, quiet_hours). A
-- message scheduled by an earlier release is in 'default' and holds.
ALTER TABLE messages
    ADD COLUMN category    text NOT NULL DEFAULT 'default',
    ADD COLUMN quiet_hours text NOT NULL DEFAULT 'hold' CHECK (quiet_hours IN ('hold', 'skip')),
    -- The deliveries withheld for their users' sake, by reason; each is
    -- also in cancelled_count or expired_count.
    ADD COLUMN opted_out_count   integer NOT NULL DEFAULT 0,
    ADD COLUMN capped_count      integer NOT NULL DEFAULT 0,
    ADD COLUMN quiet_hours_count integer NOT NULL DEFAULT 0;

-- A chunk's deliveries its users' quiet hours held when its last attempt
-- ended: a message's held count is its chunks' sum, read without reading
-- its ledger (which a status read every second of a million-device
-- message cannot afford).
ALTER TABLE message_chunks ADD COLUMN held integer NOT NULL DEFAULT 0;

ALTER TABLE schedules
    ADD COLUMN category    text NOT NULL DEFAULT 'default',
    ADD COLUMN quiet_hours text NOT NULL DEFAULT 'hold' CHECK (quiet_hours IN ('hold', 'skip'));

-- A user's preferences, a row a user who has any, deleted with the user.
-- opt_outs holds 'category' (every channel) or 'category:channel'.
-- quiet_start and quiet_end are the user's quiet hours as wall times in the
-- user's zone (users.timezone, else the installation's default zone): both
-- NULL is the installation's default, equal is none.
CREATE TABLE user_preferences (
    user_id     text PRIMARY KEY REFERENCES users (id) ON DELETE CASCADE,
    opt_outs    text[] NOT NULL DEFAULT '{}',
    quiet_start time,
    quiet_end   time,
    updated_at  timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT user_preferences_quiet_whole CHECK ((quiet_start IS NULL) = (quiet_end IS NULL))
);

-- The installation's default quiet hours, for users who set none: one row
-- or none. timezone is the zone of a user who has none.
CREATE TABLE quiet_hours_default (
    one         boolean PRIMARY KEY DEFAULT true CHECK (one),
    quiet_start time NOT NULL,
    quiet_end   time NOT NULL,
    timezone    text NOT NULL DEFAULT 'UTC',
    updated_at  timestamptz NOT NULL DEFAULT now()
);

-- A cap's history: for a user and a capped category, the last messages
-- sent to the user (as many as the cap counts, oldest first) and when each
-- was first sent. A row is locked by the claim that reads it
-- (db.ClaimFrequencyCaps), so that two processes sending two messages to
-- one user at one instant decide one after the other; a message already in
-- it is counted once however many devices and chunks reach the user.
-- Deleted with the user; the retainer deletes a row whose last message is
-- older than its category's period (last_at).
CREATE TABLE frequency_caps (
    user_id     text NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    category    text NOT NULL,
    message_ids bigint[] NOT NULL,
    sent_at     timestamptz[] NOT NULL,
    last_at     timestamptz NOT NULL,
    PRIMARY KEY (user_id, category)
);

CREATE INDEX frequency_caps_last_idx ON frequency_caps (last_at);

ALTER TABLE webhooks DROP CONSTRAINT webhooks_events_check;
ALTER TABLE webhooks ADD CONSTRAINT webhooks_events_check CHECK (cardinality(events) > 0 AND events <@ ARRAY[
    'delivery.failed', 'delivery.withheld', 'delivery.confirmed', 'delivery.opened',
    'device.evicted', 'message.settled']::text[]);

-- The ledger's reasons gain the three a delivery is withheld for: opted_out
-- and capped (cancelled), quiet_hours (cancelled when skipped, expired when
-- the hours outlast the message, and on a pending delivery held until they
-- end). NOT VALID, as in 0012: the rows already written hold only the old
-- reasons.
ALTER TABLE deliveries DROP CONSTRAINT deliveries_reason_check;
ALTER TABLE deliveries ADD CONSTRAINT deliveries_reason_check
    CHECK (reason IN ('unregistered', 'bad_token', 'payload_rejected', 'rate_limited',
                      'provider_unavailable', 'channel_disabled', 'internal', 'endpoint_forbidden',
                      'wrong_environment', 'device_moved', 'device_deleted', 'device_evicted',
                      'device_replaced', 'credentials_refused', 'wrong_app',
                      'opted_out', 'quiet_hours', 'capped'))
    NOT VALID;
