-- A Web Push delivery whose endpoint Herald will not post to (a host that is
-- not a known push service, or a name that resolves to an address inside a
-- network) fails with its own reason, so that an operator can tell it from
-- a dead subscription.
--
-- NOT VALID: the new check admits everything the old one did, so the rows
-- already in the ledger need no scan, and the table is locked only for the
-- moment the catalogue changes, however large the ledger has grown.
ALTER TABLE deliveries DROP CONSTRAINT deliveries_reason_check;
ALTER TABLE deliveries ADD CONSTRAINT deliveries_reason_check
    CHECK (reason IN ('unregistered', 'bad_token', 'payload_rejected', 'rate_limited',
                      'provider_unavailable', 'channel_disabled', 'internal', 'endpoint_forbidden'))
    NOT VALID;
