-- What the phone saw: receipts a device sends back for a push.
--
-- Every push carries a receipt token naming its delivery (jobs/receipt); the
-- app posts it back from the device with the event delivered (the push
-- reached the app or its extension) and later opened (the user tapped it).
-- A receipt is kept once per delivery and event: the first of a kind
-- counts, a replay changes nothing. received_at is Herald's own clock, the
-- one that is trusted; device_at is the device's reading, kept beside it
-- for what it is worth. skew_ms is received_at less the delivery's due_at,
-- so the skew of a confirmed delivery needs no join with the ledger.
--
-- Like the ledger it has no foreign keys: a receipt is written only for a
-- delivery that exists (the insert reads it), and it is deleted with its
-- message's ledger by retention and with its user by erasure.
CREATE TABLE receipts (
    message_id  bigint NOT NULL,
    device_id   bigint NOT NULL,
    event       text NOT NULL CHECK (event IN ('delivered', 'opened')),
    received_at timestamptz NOT NULL,
    device_at   timestamptz,
    skew_ms     double precision NOT NULL,
    PRIMARY KEY (message_id, device_id, event)
);

-- A message's confirmed and opened deliveries, counted in the same
-- transaction as the receipts that confirm them, and the confirmed
-- deliveries' skew from their due_at in the buckets of skew_histogram
-- (0010), so that a message's confirmed figures are its row, and bucket
-- counts add across messages. Constant defaults rewrite nothing.
ALTER TABLE messages
    ADD COLUMN confirmed_count integer NOT NULL DEFAULT 0,
    ADD COLUMN opened_count integer NOT NULL DEFAULT 0,
    ADD COLUMN confirmed_histogram integer[];
