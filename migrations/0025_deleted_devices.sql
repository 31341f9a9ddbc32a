-- What a deleted device was: its user and channel, kept as long as the
-- ledger that may name it.
--
-- A delivery of a chunk's snapshot (migration 0022) has no ledger row until
-- it is sent, and takes its user and channel from its device. A device
-- deleted while the message is pending gets its row then, cancelled
-- (CancelPendingForDevices); but one deleted after its message was
-- cancelled, or expired unsent, has no row and, without this table, no user
-- or channel either. The device's token is not kept: only what the ledger's
-- settled rows keep of a device anyway.
CREATE TABLE deleted_devices (
    id         bigint PRIMARY KEY,
    user_id    text NOT NULL,
    channel    text NOT NULL,
    deleted_at timestamptz NOT NULL DEFAULT now()
);

-- The retention deletes the oldest first: a device deleted before the
-- cutoff is named only by messages settled before it, which are gone too.
CREATE INDEX deleted_devices_deleted_at_idx ON deleted_devices (deleted_at);

-- Every way a device goes (DELETE /v1/devices, a user's erasure, a device
-- replaced by its installation's, the retention of evicted devices) is a
-- DELETE on devices: one statement-level trigger writes them all, a row a
-- device, in the deleting transaction.
CREATE FUNCTION devices_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO deleted_devices (id, user_id, channel)
    SELECT id, user_id, channel FROM gone
    ON CONFLICT (id) DO NOTHING;
    RETURN NULL;
END
$$;

CREATE TRIGGER devices_deleted AFTER DELETE ON devices
REFERENCING OLD TABLE AS gone
FOR EACH STATEMENT EXECUTE FUNCTION devices_deleted();
