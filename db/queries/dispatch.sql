-- name: ChunkPending :many
-- A chunk's deliveries that are still pending, with what their provider
-- needs from the directory: the device's token, Web Push keys and
-- environment. A chunk is a range of the message's part of the primary key
-- (ExpandAudience cuts it so), read as RecordResults writes it; a retried
-- chunk reads only what was not settled. The status test is a NOT IN so
-- that the planner never reads the range through the partial index of
-- pending deliveries, which holds every message's.
--
-- Gone says why a delivery must not be sent, "" when it may: its device was
-- deleted, moved to another user or evicted since the message was
-- scheduled (migration 0012). Such a row carries no token.
--
-- NotBefore is when a throttled delivery may be sent again (migration
-- 0016), NULL when it may be sent now. AppID and CredentialID are the
-- device's app and Web Push credential (migration 0021; 0 for none).
-- UserID is the delivery's user, as ChunkSnapshotPending gives it.
--
-- OptedOut, QuietStart, QuietEnd and Timezone are what the user asked of
-- the message's category (migration 0024), read when the chunk begins so
-- that a preference set after the message was scheduled holds: whether the
-- user opted out of the category (on every channel, or the device's), the
-- user's quiet hours (NULL for the installation's) and zone ('' for none,
-- and read only when some quiet hours count for the user). HeldDue is,
-- for a delivery held by quiet hours, their end, when it is due; the epoch
-- for any other. Written says the delivery has a ledger row: always here,
-- where the rows were written at scheduling.
--
-- This reads a chunk scheduled with pending ledger rows (by a release
-- before migration 0022, or while one was alive); ChunkSnapshotPending
-- reads one scheduled with a snapshot of its devices.
SELECT d.device_id, d.attempt, d.channel, d.locale,
       coalesce(v.token, '')::text AS token, v.p256dh, v.auth,
       coalesce(v.environment, 'production')::text AS environment,
       (CASE WHEN v.id IS NULL THEN 'device_deleted'
             WHEN v.user_id <> d.user_id THEN 'device_moved'
             WHEN v.status <> 'active' THEN 'device_evicted'
             ELSE '' END)::text AS gone,
       d.not_before,
       coalesce(v.app_id, 1)::integer AS app_id, coalesce(v.credential_id, 0)::bigint AS credential_id,
       d.user_id,
       (p.opt_outs IS NOT NULL AND p.opt_outs && ARRAY[c.category, c.category || ':' || d.channel])::boolean AS opted_out,
       p.quiet_start, p.quiet_end,
       coalesce(CASE WHEN p.quiet_start IS NOT NULL OR c.default_quiet
                     THEN (SELECT u.timezone FROM users u WHERE u.id = d.user_id) END, '')::text AS timezone,
       (CASE WHEN d.reason = 'quiet_hours' THEN d.due_at ELSE 'epoch' END)::timestamptz AS held_due,
       true AS written
FROM deliveries d
-- The message's category and whether the installation has quiet hours,
-- read once (a subquery evaluated once, before the devices).
CROSS JOIN (SELECT (SELECT mm.category FROM messages mm WHERE mm.id = @message_id) AS category,
                   EXISTS (SELECT 1 FROM quiet_hours_default) AS default_quiet OFFSET 0) c
LEFT JOIN devices v ON v.id = d.device_id
-- A user's preferences are looked up only when some user has any
-- (ChunkSnapshotPending says why).
LEFT JOIN LATERAL (SELECT up.opt_outs, up.quiet_start, up.quiet_end FROM user_preferences up
                   WHERE up.user_id = d.user_id AND (SELECT EXISTS (SELECT 1 FROM user_preferences))) p ON true
WHERE d.message_id = @message_id
  AND d.device_id BETWEEN @first_device AND @last_device
  AND d.chunk = @chunk
  AND d.status NOT IN ('accepted', 'failed', 'expired', 'cancelled')
ORDER BY d.device_id;

-- name: ChunkSnapshotPending :many
-- A chunk's pending deliveries, read from its snapshot (migration 0022):
-- the devices it owns that have no settled ledger row, which is all of them
-- but on a retry. The columns are ChunkPending's. A snapshot device's row
-- is written once, by its result; one that exists and is pending is a
-- throttled delivery (not_before) or one parked behind an open breaker.
--
-- A device that was moved to another user, deleted or replaced had its
-- delivery cancelled when it happened (CancelPendingForDevices, which waits
-- for messages being made), so its cancelled row is here and it is not
-- read; one evicted since is read, gone. Its user is the device's, which
-- no move has changed since the snapshot. Each device finds its row and
-- its device through their primary keys; its user's preferences, through
-- theirs, and only when some user has any: a small or empty table is read
-- whole for each device on a generic plan, and even an empty one costs a
-- system call a device (its size asked for at each rescan), which was a
-- third of the read's cost. Written says whether the delivery has a row
-- yet: a device that has none has its result inserted plainly
-- (RecordResults).
SELECT v.device_id::bigint AS device_id, coalesce(d.attempt, 0)::smallint AS attempt, v.channel, c.locales[v.n]::text AS locale,
       v.token, v.p256dh, v.auth, v.environment,
       (CASE WHEN v.status <> 'active' THEN 'device_evicted' ELSE '' END)::text AS gone,
       d.not_before,
       v.app_id, coalesce(v.credential_id, 0)::bigint AS credential_id,
       v.user_id,
       (p.opt_outs IS NOT NULL AND p.opt_outs && ARRAY[k.category, k.category || ':' || v.channel])::boolean AS opted_out,
       p.quiet_start, p.quiet_end,
       coalesce(CASE WHEN p.quiet_start IS NOT NULL OR k.default_quiet
                     THEN (SELECT u.timezone FROM users u WHERE u.id = v.user_id) END, '')::text AS timezone,
       (CASE WHEN d.reason = 'quiet_hours' THEN d.due_at ELSE 'epoch' END)::timestamptz AS held_due,
       (d.device_id IS NOT NULL)::boolean AS written
FROM chunk_devices c
CROSS JOIN (SELECT (SELECT mm.category FROM messages mm WHERE mm.id = @message_id) AS category,
                   EXISTS (SELECT 1 FROM quiet_hours_default) AS default_quiet OFFSET 0) k
-- The chunk's devices, in a subquery of their own so that its plan is the
-- same whatever the rest needs. A dense chunk (its ids span less than three
-- times its devices, as most of an app's audience does) reads them in one
-- walk of the key over its range, joined to its snapshot by hash: half the
-- cost of looking each one up, which a sparse chunk does
-- (jobs.FanOutArgs.Devices).
CROSS JOIN LATERAL (
    SELECT s.device_id, s.n, dv.user_id, dv.channel, dv.token, dv.p256dh, dv.auth, dv.environment, dv.status,
           dv.app_id, dv.credential_id
    FROM unnest(c.devices) WITH ORDINALITY AS s(device_id, n)
    JOIN (
        SELECT dr.id, dr.user_id, dr.channel, dr.token, dr.p256dh, dr.auth, dr.environment, dr.status, dr.app_id, dr.credential_id
        FROM devices dr WHERE @dense::boolean AND dr.id BETWEEN @first_device AND @last_device
        UNION ALL
        SELECT dl.id, dl.user_id, dl.channel, dl.token, dl.p256dh, dl.auth, dl.environment, dl.status, dl.app_id, dl.credential_id
        FROM devices dl WHERE NOT @dense::boolean AND dl.id = ANY (c.devices)
    ) dv ON dv.id = s.device_id
    -- Nor those accepted in the chunk's runs (migration 0028). A chunk's
    -- first attempt has none, which one look says (an InitPlan), and then
    -- no device looks.
    WHERE NOT (SELECT EXISTS (SELECT 1 FROM accepted_runs r WHERE r.message_id = @message_id AND r.chunk = @chunk))
       OR s.device_id NOT IN (SELECT unnest(r.devices) FROM accepted_runs r
                              WHERE r.message_id = @message_id AND r.chunk = @chunk)
    OFFSET 0
) v
-- A device's user's preferences, looked up by the key (a subquery of its own:
-- joined, they were hashed whole for every chunk).
LEFT JOIN LATERAL (SELECT up.opt_outs, up.quiet_start, up.quiet_end FROM user_preferences up
                   WHERE up.user_id = v.user_id AND (SELECT EXISTS (SELECT 1 FROM user_preferences))
                   OFFSET 0) p ON true
-- The rows already written in the chunk's range, read in one walk of the
-- primary key (none on a chunk's first attempt) rather than looked up
-- device by device.
LEFT JOIN (
    SELECT w.device_id, w.status, w.attempt, w.not_before, w.due_at, w.reason
    FROM deliveries w
    WHERE w.message_id = @message_id AND w.device_id BETWEEN @first_device AND @last_device
    OFFSET 0
) d ON d.device_id = v.device_id
WHERE c.message_id = @message_id AND c.chunk = @chunk
  AND coalesce(d.status, 'pending') = 'pending'
ORDER BY v.device_id;

-- name: RecordResults :many
-- Writes the results of a ledger write, for one message or many, in one
-- statement, and moves each message's counters by exactly the rows that
-- changed. A delivery of a snapshot chunk (migration 0022) has no row
-- until this writes it, whole, once: its user, channel, chunk and due time
-- come with its result. One that has a row (scheduled by an earlier
-- release, or left pending by an earlier write) has it settled, and only a
-- pending row is changed, so a result written twice (a retried chunk, a
-- concurrent cancel) counts once. A row may stay pending (parked behind an
-- open breaker, or throttled until its not_before) with its attempt and
-- last reason recorded. Times are microseconds since the epoch in the
-- database's frame; 0 stands for none. A message none of whose rows changed
-- is not returned, and its row is left alone. The caller locks the messages
-- first, in the order of their ids (LockMessages): this statement's own
-- order of them is the plan's. The input holds a delivery once
-- (db.WriteChunks keeps the last result of each). The counted_* arrays
-- are results written by InsertFirstResults earlier in the transaction,
-- already counted (db.WriteChunks): their counts move the counters with
-- this statement's own.
--
-- A result marked first is one whose chunk read no row of it: nearly all
-- of them. Its row is inserted plainly and counted as written, without
-- ON CONFLICT's speculative insertion and the read back of what it wrote
-- (a quarter of the statement's cost a row). A row that appeared since
-- (the chunk taken over, the message cancelled) fails the statement on the
-- primary key, and db.WriteChunks runs the write again with none marked.
WITH input AS (
    SELECT unnest(@message_ids::bigint[]) AS message_id,
           unnest(@device_ids::bigint[]) AS device_id,
           unnest(@user_ids::text[]) AS user_id,
           unnest(@channels::text[]) AS channel,
           unnest(@chunks::integer[]) AS chunk,
           unnest(@due_us::bigint[]) AS due_us,
           unnest(@statuses::text[]) AS status,
           unnest(@reasons::text[]) AS reason,
           unnest(@attempted_us::bigint[]) AS attempted_us,
           unnest(@accepted_us::bigint[]) AS accepted_us,
           unnest(@not_before_us::bigint[]) AS not_before_us,
           unnest(@first::boolean[]) AS first
), result AS (
    -- Each result as its row holds it. The epoch plus so many
    -- microseconds: exact, and a fifth of the cost of to_timestamp(us /
    -- 1e6), whose division is numeric.
    SELECT i.message_id, i.device_id, i.user_id, i.channel, i.chunk,
           to_timestamp(0) + i.due_us * interval '1 microsecond' AS due_at,
           i.status,
           -- An accepted delivery has no reason.
           CASE WHEN i.status = 'accepted' OR i.reason = '' THEN NULL ELSE i.reason END AS reason,
           (CASE WHEN i.attempted_us = 0 THEN 0 ELSE 1 END)::smallint AS attempt,
           CASE WHEN i.attempted_us = 0 THEN NULL
                ELSE to_timestamp(0) + i.attempted_us * interval '1 microsecond' END AS attempted_at,
           CASE WHEN i.accepted_us = 0 THEN NULL
                ELSE to_timestamp(0) + i.accepted_us * interval '1 microsecond' END AS accepted_at,
           CASE WHEN i.not_before_us = 0 THEN NULL
                ELSE to_timestamp(0) + i.not_before_us * interval '1 microsecond' END AS not_before,
           i.first
    FROM input i
), in_runs AS MATERIALIZED (
    -- The devices accepted in the runs of the chunks this write's upserts
    -- touch (none but for a chunk keeping runs whose write was made again).
    SELECT r.message_id, s.device_id
    FROM accepted_runs r
    CROSS JOIN LATERAL unnest(r.devices) AS s(device_id)
    WHERE (r.message_id, r.chunk) IN (SELECT DISTINCT i.message_id, i.chunk FROM input i WHERE NOT i.first)
), inserted AS (
    INSERT INTO deliveries (message_id, device_id, user_id, channel, chunk, due_at, status, reason,
                            attempt, attempted_at, accepted_at, not_before)
    SELECT r.message_id, r.device_id, r.user_id, r.channel, r.chunk, r.due_at, r.status, r.reason,
           r.attempt, r.attempted_at, r.accepted_at, r.not_before
    FROM result r
    WHERE r.first
), updated AS (
    INSERT INTO deliveries AS d (message_id, device_id, user_id, channel, chunk, due_at, status, reason,
                                 attempt, attempted_at, accepted_at, not_before)
    SELECT r.message_id, r.device_id, r.user_id, r.channel, r.chunk, r.due_at, r.status, r.reason,
           r.attempt, r.attempted_at, r.accepted_at, r.not_before
    FROM result r
    WHERE NOT r.first
      -- A delivery accepted in one of its chunk's runs (migration 0028)
      -- is settled: a second result of it changes nothing.
      AND NOT EXISTS (SELECT 1 FROM in_runs x WHERE x.message_id = r.message_id AND x.device_id = r.device_id)
    -- Written for the plan (TestLedgerPlansUseThePrimaryKey): each input
    -- row finds its delivery, if it has one, through the primary key on
    -- both its columns, a lookup per row, on any statistics.
    ON CONFLICT (message_id, device_id) DO UPDATE
    SET status = excluded.status,
        -- One that expires keeps the last transient reason that held it
        -- back.
        reason = CASE WHEN excluded.status = 'accepted' THEN NULL
                      ELSE coalesce(excluded.reason, d.reason) END,
        attempt = d.attempt + excluded.attempt,
        attempted_at = coalesce(excluded.attempted_at, d.attempted_at),
        -- A delivery held by its user's quiet hours is due when they end
        -- (jobs/preferences), and its skew is measured from then.
        due_at = CASE WHEN excluded.reason = 'quiet_hours' AND excluded.status = 'pending'
                      THEN excluded.due_at ELSE d.due_at END,
        accepted_at = excluded.accepted_at,
        not_before = excluded.not_before
    -- Pending is spelled as not settled, on an expression without
    -- statistics (status || ''), so that the plan follows neither a
    -- partial index on the status nor a ledger's history.
    WHERE (d.status || '') NOT IN ('accepted', 'failed', 'expired', 'cancelled')
    RETURNING d.message_id, d.device_id, d.user_id, d.status, d.reason, d.attempted_at, d.accepted_at, d.due_at
), written AS (
    -- What changed: the rows inserted first, as they were written, and
    -- those the upsert changed. date_part, not extract: the skew is a
    -- double, as ln below needs it to be cheap (extract's numeric made ln
    -- cost microseconds a row).
    SELECT w.message_id, w.device_id, w.user_id, w.status, w.reason, w.attempted_at,
           date_part('epoch', w.accepted_at - w.due_at) * 1000 AS skew_ms
    FROM (SELECT r.message_id, r.device_id, r.user_id, r.status, r.reason, r.attempted_at, r.accepted_at, r.due_at
          FROM result r WHERE r.first
          UNION ALL
          SELECT * FROM updated) w
), failure_events AS (
    -- The webhooks' delivery.failed events (migration 0018), written with
    -- the failures themselves, and their delivery.withheld events (0024):
    -- a delivery cancelled or expired for its user's sake (opted out, quiet
    -- hours, capped). want_failed and want_withheld are the process's
    -- reading of whether any webhook wants them (jobs.WebhookTypes): false,
    -- the generic plan's one-time filter skips this, and a ledger write
    -- costs what it did before webhooks.
    -- Each kind is a branch of its own, so that each keeps its one-time
    -- filter.
    INSERT INTO webhook_events (webhook_id, message_id, type, device_id, user_id, reason, at)
    SELECT w.id, u.message_id, 'delivery.failed', u.device_id, u.user_id, u.reason,
           coalesce(u.attempted_at, clock_timestamp())
    FROM written u
    JOIN webhooks w ON 'delivery.failed' = ANY (w.events)
    WHERE @want_failed::boolean AND u.status = 'failed'
    UNION ALL
    SELECT w.id, u.message_id, 'delivery.withheld', u.device_id, u.user_id, u.reason, clock_timestamp()
    FROM written u
    JOIN webhooks w ON 'delivery.withheld' = ANY (w.events)
    WHERE @want_withheld::boolean AND u.status IN ('cancelled', 'expired')
      AND u.reason IN ('opted_out', 'quiet_hours', 'capped')
), tallies AS (
    -- The rows each write settled, by message and status, the accepted
    -- ones by the bucket of their skew in the message's histogram
    -- (migration 0010; read by the API while the message is sent): under
    -- 1 ms is bucket 1, then 10% a bucket up to 194; those withheld for
    -- their users' sake by reason (migration 0024). 0 is no bucket, '' not
    -- withheld.
    SELECT message_id, status,
           CASE WHEN status = 'accepted' THEN skew_histogram_bucket(skew_ms) ELSE 0 END AS bucket,
           CASE WHEN status IN ('cancelled', 'expired') AND reason IN ('opted_out', 'quiet_hours', 'capped')
                THEN reason ELSE '' END AS withheld,
           count(*)::integer AS n
    FROM written
    GROUP BY 1, 2, 3, 4
    UNION ALL
    -- And the results InsertFirstResults wrote in the same transaction,
    -- counted by db.WriteChunks the same way.
    SELECT unnest(@counted_message_ids::bigint[]), unnest(@counted_statuses::text[]),
           unnest(@counted_buckets::integer[]), unnest(@counted_withheld::text[]), unnest(@counted_n::integer[])
)
SELECT c.message_id::bigint AS message_id, c.pending_count::integer AS pending_count,
       c.accepted::integer AS accepted, c.failed::integer AS failed, c.expired::integer AS expired
-- The counters moved by all of them (migration 0029).
FROM (SELECT array_agg(message_id) AS message_ids, array_agg(status) AS statuses, array_agg(bucket) AS buckets,
             array_agg(withheld) AS withheld, array_agg(n) AS n
      FROM tallies) t
CROSS JOIN LATERAL add_delivery_counts(t.message_ids, t.statuses, t.buckets, t.withheld, t.n) c;

-- name: CountResults :many
-- Moves the counters of messages by a ledger write's tallies, counted by
-- db.WriteChunks (add_delivery_counts: migration 0029), for a write that
-- has nothing RecordResults must write. Its rows are RecordResults'.
SELECT c.message_id::bigint AS message_id, c.pending_count::integer AS pending_count,
       c.accepted::integer AS accepted, c.failed::integer AS failed, c.expired::integer AS expired
FROM add_delivery_counts(@message_ids::bigint[], @statuses::text[], @buckets::integer[], @withheld::text[], @n::integer[]) c;

-- name: InsertFirstResults :exec
-- Writes the results of deliveries whose chunk read no row of them (a
-- snapshot's devices on a chunk's first attempt: nearly every result), as
-- RecordResults' plain insert does, and nothing else: db.WriteChunks counts
-- them itself, since every row given is a row written (a row that appeared
-- since fails the statement on the primary key, and the write runs again
-- through RecordResults), and hands the counts to RecordResults, which
-- moves the counters. RecordResults' reading back of what it wrote, to
-- count it by status and skew, cost as much a row as the insert.
INSERT INTO deliveries (message_id, device_id, user_id, channel, chunk, due_at, status, reason,
                        attempt, attempted_at, accepted_at, not_before)
SELECT i.message_id, i.device_id, i.user_id, i.channel, i.chunk,
       to_timestamp(0) + i.due_us * interval '1 microsecond',
       i.status,
       CASE WHEN i.status = 'accepted' OR i.reason = '' THEN NULL ELSE i.reason END,
       (CASE WHEN i.attempted_us = 0 THEN 0 ELSE 1 END)::smallint,
       CASE WHEN i.attempted_us = 0 THEN NULL
            ELSE to_timestamp(0) + i.attempted_us * interval '1 microsecond' END,
       CASE WHEN i.accepted_us = 0 THEN NULL
            ELSE to_timestamp(0) + i.accepted_us * interval '1 microsecond' END,
       CASE WHEN i.not_before_us = 0 THEN NULL
            ELSE to_timestamp(0) + i.not_before_us * interval '1 microsecond' END
FROM (SELECT unnest(@message_ids::bigint[]) AS message_id,
             unnest(@device_ids::bigint[]) AS device_id,
             unnest(@user_ids::text[]) AS user_id,
             unnest(@channels::text[]) AS channel,
             unnest(@chunks::integer[]) AS chunk,
             unnest(@due_us::bigint[]) AS due_us,
             unnest(@statuses::text[]) AS status,
             unnest(@reasons::text[]) AS reason,
             unnest(@attempted_us::bigint[]) AS attempted_us,
             unnest(@accepted_us::bigint[]) AS accepted_us,
             unnest(@not_before_us::bigint[]) AS not_before_us) i;

-- name: InsertAcceptedRuns :exec
-- Writes the accepted first results of chunk executions that keep them as
-- runs (migration 0028), one row a (message, chunk): the slice lo..hi
-- (1-based) of the flat arrays, its devices ascending. Each group is a
-- (message, chunk, execution); one with lo > hi writes nothing and is only
-- checked (a chunk whose first results in this write are rows only: a row
-- beside another execution's run would be a delivery in two places).
-- db.WriteChunks counts the results.
--
-- Before it writes anything (a one-time filter, evaluated even when no
-- group writes) it fails the ledger write (accepted_runs_conflict:
-- accepted_runs_once) when a group may not be written as its execution
-- wrote it: another execution of its chunk has written a run, or a ledger
-- row names one of its devices (a cancel, a retried chunk's upsert).
-- db.WriteChunks then makes the write again as the upsert.
INSERT INTO accepted_runs (message_id, chunk, execution, due_at, first_device, last_device, devices, user_ids,
                           attempted_us, accepted_us)
SELECT g.message_id, g.chunk, g.execution, to_timestamp(0) + g.due_us * interval '1 microsecond',
       (@device_ids::bigint[])[g.lo], (@device_ids::bigint[])[g.hi], (@device_ids::bigint[])[g.lo:g.hi],
       (@user_ids::text[])[g.lo:g.hi], (@attempted_us::bigint[])[g.lo:g.hi], (@accepted_us::bigint[])[g.lo:g.hi]
FROM (SELECT unnest(@message_ids::bigint[]) AS message_id, unnest(@chunks::integer[]) AS chunk,
             unnest(@executions::bigint[]) AS execution, unnest(@group_due_us::bigint[]) AS due_us,
             unnest(@los::integer[]) AS lo, unnest(@his::integer[]) AS hi) g
WHERE g.lo <= g.hi
  AND (SELECT CASE WHEN EXISTS (
                  SELECT 1
                  FROM (SELECT unnest(@message_ids::bigint[]) AS message_id, unnest(@chunks::integer[]) AS chunk,
                               unnest(@executions::bigint[]) AS execution,
                               unnest(@los::integer[]) AS lo, unnest(@his::integer[]) AS hi) c
                  WHERE EXISTS (SELECT 1 FROM accepted_runs r
                                WHERE r.message_id = c.message_id AND r.chunk = c.chunk AND r.execution <> c.execution)
                     OR (c.lo <= c.hi AND EXISTS (
                         SELECT 1 FROM deliveries d
                         WHERE d.message_id = c.message_id
                           AND d.device_id BETWEEN (@device_ids::bigint[])[c.lo] AND (@device_ids::bigint[])[c.hi]
                           AND d.device_id = ANY ((@device_ids::bigint[])[c.lo:c.hi]))))
              THEN accepted_runs_conflict() ELSE true END);

-- name: LockMessages :exec
-- Locks messages' rows in the order of their ids, so that two ledger
-- writes of the same messages (two processes, or a write and a cancel)
-- never wait for each other in a cycle. It comes first: message, then
-- deliveries, the order every transaction that changes both keeps.
SELECT id FROM messages WHERE id = ANY (@ids::bigint[]) ORDER BY id FOR UPDATE;

-- name: EvictDevices :one
-- Evicts the devices whose tokens a provider called dead, unless they
-- registered again after the send began, and writes the webhooks'
-- device.evicted events of those it evicted, naming the message whose send
-- found them dead (migration 0018). Evictions are rare, so the webhooks'
-- table is read every time rather than through the process's reading of it.
WITH evicted AS (
    UPDATE devices
    SET status = 'evicted', evicted_reason = v.reason, evicted_at = clock_timestamp(), updated_at = clock_timestamp()
    FROM (SELECT unnest(@ids::bigint[]) AS id, unnest(@reasons::text[]) AS reason) v
    WHERE devices.id = v.id AND devices.status = 'active' AND devices.updated_at < @sent_after
    RETURNING devices.id, devices.user_id, v.reason, devices.evicted_at
), events AS (
    INSERT INTO webhook_events (webhook_id, message_id, type, device_id, user_id, reason, at)
    SELECT w.id, @message_id, 'device.evicted', e.id, e.user_id, e.reason, e.evicted_at
    FROM evicted e
    JOIN webhooks w ON 'device.evicted' = ANY (w.events)
)
SELECT count(*) FROM evicted;

-- name: RecordChunk :exec
-- What the worker saw of its chunk, for the dispatch breakdown, and how
-- many of its deliveries wait for their users' quiet hours to end.
UPDATE message_chunks
SET started_at = coalesce(started_at, @started_at),
    first_accepted_at = CASE WHEN sqlc.narg('first_accepted_at')::timestamptz IS NULL THEN first_accepted_at
                             ELSE least(coalesce(first_accepted_at, 'infinity'), sqlc.narg('first_accepted_at')::timestamptz) END,
    last_accepted_at = CASE WHEN sqlc.narg('last_accepted_at')::timestamptz IS NULL THEN last_accepted_at
                            ELSE greatest(coalesce(last_accepted_at, '-infinity'), sqlc.narg('last_accepted_at')::timestamptz) END,
    finished_at = sqlc.narg('finished_at'),
    recorded_at = clock_timestamp(),
    -- Its deliveries held by quiet hours as the attempt ended (0024).
    held = @held
WHERE message_id = @message_id AND chunk = @chunk;

-- name: SettleMessage :one
-- Settles a message whose last pending delivery has settled: dispatched, or
-- expired when nothing was sent at all. Its skew percentiles are stored on
-- it now, once, so that reading it later never sorts its ledger. They are
-- computed in the SET list, so only for a message that settles: every
-- chunk asks, and only the last one pays. So is the SLO's number,
-- slo_skew_ms (migration 0014): the latest any due delivery (chunk >= 0: a
-- local-time delivery whose time had passed was never due) was answered
-- after its due time, a refusal by its answer, and one that expired unsent
-- by now, never less than 1001 ms, so that it misses the SLO whatever its
-- lifetime. The same walk of the message's part of the primary key reads
-- them all. The row returned is what the settling process observes in the
-- metrics (herald_message_skew_max_seconds): only one transaction's guard
-- passes, so each message is counted once, by the process that settled it.
-- A message whose rest is still to be written (migration 0020) has more to
-- come and does not settle.
UPDATE messages m
SET state = CASE WHEN m.accepted_count + m.failed_count = 0 AND m.expired_count > 0 THEN 'expired' ELSE 'dispatched' END,
    settled_at = clock_timestamp(),
    (skew_p50_ms, skew_p95_ms, skew_p99_ms, skew_max_ms, slo_skew_ms) = (
        SELECT round(g.p[1]::numeric, 1)::double precision, round(g.p[2]::numeric, 1)::double precision,
               round(g.p[3]::numeric, 1)::double precision, round(g.accepted_max::numeric, 1)::double precision,
               -- Deliveries the reconciler expired without a row (a
               -- snapshot's devices never sent: migration 0022) are the
               -- message's expired count that no row holds.
               round((CASE WHEN m.expired_count > g.expired_rows
                           THEN greatest(coalesce(g.all_max, 0), 1001, date_part('epoch', clock_timestamp() - m.dispatch_at) * 1000)
                           ELSE g.all_max END)::numeric, 1)::double precision
        FROM (
            -- One sort for the three percentiles, of doubles: date_part,
            -- not extract, whose numeric made this a third of the cost.
            SELECT percentile_cont(ARRAY[0.5, 0.95, 0.99]) WITHIN GROUP (ORDER BY a.s) FILTER (WHERE a.status = 'accepted' AND a.due) AS p,
                   max(a.s) FILTER (WHERE a.status = 'accepted' AND a.due) AS accepted_max,
                   max(a.s) FILTER (WHERE a.due) AS all_max,
                   count(*) FILTER (WHERE a.status = 'expired') AS expired_rows
            FROM (
                SELECT d.status, d.chunk >= 0 AS due,
                       CASE d.status
                           WHEN 'accepted' THEN date_part('epoch', d.accepted_at - d.due_at) * 1000
                           WHEN 'failed' THEN date_part('epoch', coalesce(d.attempted_at, clock_timestamp()) - d.due_at) * 1000
                           ELSE greatest(date_part('epoch', clock_timestamp() - d.due_at) * 1000, 1001)
                       END AS s
                FROM deliveries d
                WHERE d.message_id = m.id AND d.status IN ('accepted', 'failed', 'expired')
                UNION ALL
                -- The acceptances kept in runs (migration 0028).
                SELECT 'accepted', r.chunk >= 0,
                       date_part('epoch', (to_timestamp(0) + u.us * interval '1 microsecond') - r.due_at) * 1000
                FROM accepted_runs r
                CROSS JOIN LATERAL unnest(r.accepted_us) AS u(us)
                WHERE r.message_id = m.id
            ) a
        ) g
    )
WHERE m.id = @message_id AND m.pending_count = 0 AND m.state IN ('scheduled', 'dispatching')
  AND m.rest_after IS NULL
RETURNING m.state, m.priority, m.slo_skew_ms;

-- name: LockMessage :one
-- Takes the message's row lock first, so that every transaction that
-- changes a message and its ledger locks them in the same order (message,
-- then deliveries) and none can deadlock another.
SELECT state, expires_at FROM messages WHERE id = @id FOR UPDATE;

-- name: UseLedgerPlans :exec
-- Makes the rest of the current transaction (a pipelined batch's implicit
-- one too, as in CommitWithoutWaitingForDisk) run its prepared statements
-- on their generic plans, which TestLedgerPlansUseThePrimaryKey checks. A
-- custom plan sees the message id, and the statistics of a ledger with
-- history never know a message younger than the last ANALYZE: the planner
-- expected one row of it and scanned the whole message for every chunk's
-- read and write, filtering out all but the chunk's devices (a 25,000-device
-- message: 4 to 9 ms a statement instead of 0.6; on a ledger of 2 M settled
-- rows, 12 to 15 us of PostgreSQL CPU per device in chunk starts alone
-- instead of 2, BenchmarkLedgerLife), after planning it anew every time
-- (0.3 to 5 ms with the chunk's arrays). The cached generic plan looks the
-- chunk up by the primary key on both its columns, and is planned once per
-- connection.
--
-- Nor do they scan a table whole where a key finds the rows: a plan is
-- made on a connection's first use and kept, and one made while the ledger
-- was empty (a young installation's first instant, a bench's) found a scan
-- of it cheapest and kept scanning it as it grew: the runs' check read a
-- preferences run's thousands of withheld rows for every chunk of every
-- write (TestLedgerWritesReadByKeyAsTheLedgerGrows). Every statement that
-- runs after this one finds its rows through keys, or has no key to use.
SELECT set_config('plan_cache_mode', 'force_generic_plan', true), set_config('enable_seqscan', 'off', true);

-- name: CommitWithoutWaitingForDisk :exec
-- Lets the current transaction commit without waiting for its WAL to reach
-- disk (set_config rather than SET LOCAL, so that it also holds for the
-- implicit transaction of a pipelined batch). Safe for a chunk's results:
-- River marks the job done in a later, synchronous commit, which flushes
-- this one's WAL too; a crash before that loses both, and the retried chunk
-- resends what was not recorded. With a synchronous standby
-- (synchronous_standby_names set) the commit waits as the server's own
-- setting says: a result acknowledged must be on the standby, or a failover
-- to it would lose what the worker believes written.
SELECT set_config('synchronous_commit',
    CASE WHEN current_setting('synchronous_standby_names') = '' THEN 'off'
         ELSE current_setting('synchronous_commit') END, true);

-- name: MessageState :one
SELECT state FROM messages WHERE id = @id;
