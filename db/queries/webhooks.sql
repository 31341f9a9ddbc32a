-- name: CreateWebhook :one
-- Makes a webhook unless the installation holds max_webhooks already: the
-- count and the insert are one statement under a lock of the table's own,
-- so two concurrent creations cannot both pass the bound. Nothing is
-- returned when the bound refuses it.
WITH locked AS (
    SELECT pg_advisory_xact_lock(hashtext('herald.webhooks'))
), n AS (
    SELECT count(*) AS n FROM webhooks, locked
)
INSERT INTO webhooks (url, events, secret)
SELECT @url, @events::text[], @secret FROM n WHERE n.n < @max_webhooks::bigint
RETURNING id, url, events, created_at;

-- name: ListWebhooks :many
SELECT id, url, events, created_at FROM webhooks ORDER BY id;

-- name: GetWebhook :one
SELECT id, url, events, created_at FROM webhooks WHERE id = @id;

-- name: DeleteWebhook :execrows
-- Deletes a webhook and the events it has not been sent: nothing more is
-- posted to it. A batch job of it already queued finds it gone and ends.
WITH gone AS (
    DELETE FROM webhooks WHERE webhooks.id = @id RETURNING webhooks.id
), events AS (
    DELETE FROM webhook_events WHERE webhook_id IN (SELECT g.id FROM gone g)
)
SELECT g.id FROM gone g;

-- name: WantedWebhookEvents :many
-- The event types some webhook wants: every process reads them about every
-- second (jobs.WebhookTypes) so that the ledger writes failures' events
-- only while one does.
SELECT DISTINCT unnest(events)::text AS type FROM webhooks;

-- name: ClaimWebhookEvents :many
-- Claims up to max_events unclaimed events and gives them batch ids: one
-- batch per webhook and message, of at most batch_size events, in the order
-- the events were written. A batch that would not be full waits until its
-- oldest event is hold_seconds old, so that the failures of a message still
-- being sent fill batches rather than leave one part-batch each pass. Rows
-- another dispatcher is claiming are skipped (SKIP LOCKED), so every worker
-- process may run this at once. The caller inserts one River job per batch
-- returned in the same transaction.
WITH claimed AS (
    SELECT id, webhook_id, message_id, created_at FROM webhook_events
    WHERE batch_id IS NULL
    ORDER BY id
    LIMIT @max_events
    FOR UPDATE SKIP LOCKED
), numbered AS (
    SELECT id, webhook_id, message_id, created_at,
           (row_number() OVER (PARTITION BY webhook_id, message_id ORDER BY id) - 1) / @batch_size::bigint AS part
    FROM claimed
), parts AS (
    SELECT webhook_id, message_id, part
    FROM numbered
    GROUP BY webhook_id, message_id, part
    HAVING count(*) = @batch_size::bigint
        OR min(created_at) < clock_timestamp() - make_interval(secs => @hold_seconds::double precision)
), groups AS (
    SELECT webhook_id, message_id, part, nextval('webhook_batches') AS batch_id FROM parts
), assigned AS (
    UPDATE webhook_events e
    SET batch_id = g.batch_id
    FROM numbered n JOIN groups g USING (webhook_id, message_id, part)
    WHERE e.id = n.id
    RETURNING g.batch_id, g.webhook_id, g.message_id
)
SELECT batch_id::bigint AS batch_id, webhook_id, message_id, count(*)::integer AS events
FROM assigned
GROUP BY batch_id, webhook_id, message_id
ORDER BY batch_id;

-- name: WebhookTarget :one
-- Where a batch goes, and its secret.
SELECT url, secret FROM webhooks WHERE id = @id;

-- name: WebhookBatchEvents :many
SELECT type, message_id, device_id, user_id, reason, at, data
FROM webhook_events
WHERE batch_id = @batch_id::bigint
ORDER BY id;

-- name: DeleteWebhookBatch :execrows
-- A batch delivered, or whose webhook is gone: its events are done with.
DELETE FROM webhook_events WHERE batch_id = @batch_id::bigint;

-- name: PendingWebhookEvents :one
-- Events not yet delivered, claimed or not (a gauge): those of batches given
-- up are counted until retention deletes them. The table holds nothing
-- else, so the count is of what is pending, not of history.
SELECT count(*) FROM webhook_events;

-- name: DeleteOldWebhookEvents :execrows
-- Retention of the outbox: events older than the cutoff, in practice those
-- of batches given up (a delivered batch's are deleted at once), a bounded
-- number a call, oldest first. Ids grow with time, so the walk of the
-- primary key finds the old ones first; the table holds only what is not
-- delivered, so the walk that finds none is short.
DELETE FROM webhook_events
WHERE id IN (SELECT o.id FROM webhook_events o WHERE o.created_at < @before ORDER BY o.id LIMIT @batch);
