-- Who may call Herald, and what they did.
--
-- API keys are named and scoped, may expire, and are revoked without a
-- restart: every process keeps the live keys in memory and reads them again
-- about every second (api/keys.go). A key is stored only as the SHA-256 of
-- its secret, which is shown once, when the key is made; a secret is 32
-- random bytes, so a fast digest is enough. A revoked key stays, so that its
-- name is never reused and the audit log's names keep meaning one key.
-- HERALD_API_KEYS's keys are not stored here: each process knows them from
-- its environment, with scope admin.
CREATE TABLE api_keys (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name         text NOT NULL CHECK (name ~ '^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$'),
    scope        text NOT NULL CHECK (scope IN ('read', 'send', 'admin')),
    digest       bytea NOT NULL CHECK (length(digest) = 32),
    created_at   timestamptz NOT NULL DEFAULT now(),
    expires_at   timestamptz,
    revoked_at   timestamptz,
    -- When the key was last used, to within a minute: each process writes
    -- what it saw at most once a minute, never on a request's way.
    last_used_at timestamptz,
    CONSTRAINT api_keys_name_key UNIQUE (name),
    CONSTRAINT api_keys_digest_key UNIQUE (digest)
);

-- Every mutating /v1 call (and the dashboard's), by whom, on what, and how
-- it was answered. Kept HERALD_AUDIT_RETENTION, then deleted by retention,
-- oldest first through audit_log_at_idx. key_name is the API key's name
-- (HERALD_API_KEYS's are named bootstrap:<fingerprint>); operator is the
-- dashboard operator's; one of the two is set.
CREATE TABLE audit_log (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at         timestamptz NOT NULL DEFAULT clock_timestamp(),
    key_name   text,
    operator   text,
    method     text NOT NULL,
    route      text NOT NULL,
    target_id  text,
    status     integer NOT NULL,
    request_id text NOT NULL,
    CONSTRAINT audit_log_actor CHECK ((key_name IS NULL) <> (operator IS NULL))
);

CREATE INDEX audit_log_at_idx ON audit_log (at);
CREATE INDEX audit_log_key_name_idx ON audit_log (key_name, id) WHERE key_name IS NOT NULL;
CREATE INDEX audit_log_operator_idx ON audit_log (operator, id) WHERE operator IS NOT NULL;

-- The dashboard's named operators (`herald operators create`), each with an
-- argon2id hash of its password in PHC form. HERALD_ADMIN_PASSWORD's
-- operator, admin, is not stored: its name is reserved.
CREATE TABLE operators (
    id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name          text NOT NULL CHECK (name ~ '^[A-Za-z0-9][A-Za-z0-9._@-]{0,63}$' AND name <> 'admin'),
    password_hash text NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT operators_name_key UNIQUE (name)
);

-- Dashboard sessions, so that any process serves any session and signing
-- out ends it everywhere. A session token is kept only as its SHA-256.
-- Removing an operator revokes its sessions; retention deletes sessions a
-- day after they ended. An admin session carries a tag of the
-- HERALD_ADMIN_PASSWORD it was opened with (an HMAC of its digest, never the
-- password), so that changing the password ends the sessions opened with
-- the old one.
CREATE TABLE dashboard_sessions (
    digest     bytea PRIMARY KEY CHECK (length(digest) = 32),
    operator   text NOT NULL,
    credential bytea,
    created_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL,
    revoked_at timestamptz
);

CREATE INDEX dashboard_sessions_expires_at_idx ON dashboard_sessions (expires_at);
CREATE INDEX dashboard_sessions_operator_idx ON dashboard_sessions (operator);

-- Keys every process shares, drawn at random by the first process that needs
-- one. The dashboard's sessions carry an HMAC under 'dashboard_session', so
-- that a process refuses a forged cookie without a query; the session's row
-- decides whether a genuine one is still valid.
CREATE TABLE signing_keys (
    purpose    text PRIMARY KEY,
    key        bytea NOT NULL CHECK (length(key) >= 32),
    created_at timestamptz NOT NULL DEFAULT now()
);
