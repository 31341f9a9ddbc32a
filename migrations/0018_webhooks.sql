-- Webhooks: Herald posts what happened to a caller's URL instead of being
-- polled for it (docs/webhooks.md).
--
-- A webhook is a URL, the event types it wants and the secret its calls are
-- signed with. The secret is kept as it is, not as a digest: Herald needs it
-- to sign. It is shown once, in the answer that made the webhook.
CREATE TABLE webhooks (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    url        text NOT NULL CHECK (length(url) BETWEEN 1 AND 2048),
    events     text[] NOT NULL CHECK (cardinality(events) > 0 AND events <@ ARRAY[
                   'delivery.failed', 'delivery.confirmed', 'delivery.opened',
                   'device.evicted', 'message.settled']::text[]),
    secret     text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);

-- The outbox: one row per webhook and fact, written in the transaction of
-- the fact itself (a ledger write, an eviction, a settle, a receipt), and
-- only for the webhooks that want its type, so that nothing is written
-- while no webhook exists. A fact committed is a fact that will be posted;
-- one rolled back was never seen.
--
-- The dispatcher (jobs/webhook_dispatch.go) claims rows whose batch_id is
-- NULL with FOR UPDATE SKIP LOCKED, gives each (webhook, message) group a
-- batch id from webhook_batches and inserts its River job in the same
-- transaction. It never reads by an id cursor: identities are drawn in one
-- order and committed in another, and a cursor would skip the rows of a
-- transaction that committed late. A batch's rows are deleted once it is
-- delivered; those of a batch given up stay, so that its job can be retried
-- from River UI, until retention deletes them.
--
-- No foreign keys, as in the ledger: a check per row would be paid on the
-- ledger's path. Deleting a webhook deletes its rows; a row written for a
-- webhook deleted meanwhile is dropped by its job.
CREATE TABLE webhook_events (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    webhook_id bigint NOT NULL,
    message_id bigint NOT NULL,
    type       text NOT NULL,
    device_id  bigint,
    user_id    text,
    reason     text,
    at         timestamptz NOT NULL,
    -- What else an event type carries (message.settled: its state and
    -- counters), as it is posted.
    data       jsonb,
    batch_id   bigint,
    created_at timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- Every index is paid for by each event the ledger writes (an index entry
-- cost about 3 us of PostgreSQL CPU a failure), so there are only those the
-- dispatcher and the batch jobs read often: the unclaimed events, and a
-- batch's. Deleting a webhook and retention read the table by its primary
-- key: it holds only what is not yet delivered.
CREATE INDEX webhook_events_unclaimed_idx ON webhook_events (id) WHERE batch_id IS NULL;
CREATE INDEX webhook_events_batch_idx ON webhook_events (batch_id) WHERE batch_id IS NOT NULL;

CREATE SEQUENCE webhook_batches;

-- delivery.confirmed and delivery.opened come from the receipts a device
-- sends back. One statement-level trigger per insert statement: it reads
-- the rows the statement added (a replay that inserted nothing adds none)
-- and writes events only when some webhook wants them, so receipts cost
-- one look at an empty table while no webhook exists.
CREATE FUNCTION webhook_events_of_receipts() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM webhooks WHERE events && ARRAY['delivery.confirmed', 'delivery.opened']::text[]) THEN
        INSERT INTO webhook_events (webhook_id, message_id, type, device_id, user_id, at)
        SELECT w.id, r.message_id, r.type, r.device_id, d.user_id, r.received_at
        FROM (SELECT message_id, device_id, received_at,
                     CASE event WHEN 'delivered' THEN 'delivery.confirmed' ELSE 'delivery.opened' END AS type
              FROM new_receipts) r
        JOIN webhooks w ON r.type = ANY (w.events)
        LEFT JOIN deliveries d ON d.message_id = r.message_id AND d.device_id = r.device_id;
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER receipts_webhook_events
AFTER INSERT ON receipts
REFERENCING NEW TABLE AS new_receipts
FOR EACH STATEMENT EXECUTE FUNCTION webhook_events_of_receipts();

-- message.settled, wherever a message settles: its last chunk's ledger
-- write, the reconciler, a cancel. The trigger fires only on an update that
-- sets state (the counters' updates of every ledger write do not), and its
-- WHEN only on the one update that settles the message, so each message
-- writes it at most once.
CREATE FUNCTION webhook_events_of_settle() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO webhook_events (webhook_id, message_id, type, at, data)
    SELECT w.id, NEW.id, 'message.settled', coalesce(NEW.settled_at, clock_timestamp()),
           jsonb_build_object('state', NEW.state, 'accepted', NEW.accepted_count, 'failed', NEW.failed_count,
                              'expired', NEW.expired_count, 'cancelled', NEW.cancelled_count)
    FROM webhooks w
    WHERE 'message.settled' = ANY (w.events);
    RETURN NULL;
END
$$;

CREATE TRIGGER messages_settled_webhook_events
AFTER UPDATE OF state ON messages
FOR EACH ROW
WHEN (OLD.state IN ('scheduled', 'dispatching') AND NEW.state IN ('dispatched', 'expired', 'cancelled'))
EXECUTE FUNCTION webhook_events_of_settle();
