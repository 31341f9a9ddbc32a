-- APNs environments and localized messages.
--
-- An iOS debug build gets its device token from Apple's sandbox, which the
-- production host does not know: a device says which environment its token
-- is from, and Herald sends it to that host. A user's locale (a BCP 47 tag)
-- picks a message's localization when the message is scheduled.
--
-- A delivery sent to the wrong environment fails with a reason of its own,
-- wrong_environment, so that an operator can tell a device registered with
-- the wrong environment from a dead token; such a device is not evicted.
-- NOT VALID, as in 0004: the new check admits everything the old one did.
ALTER TABLE devices
    ADD COLUMN environment text NOT NULL DEFAULT 'production'
        CHECK (environment IN ('production', 'sandbox'));

ALTER TABLE users ADD COLUMN locale text;

ALTER TABLE deliveries DROP CONSTRAINT deliveries_reason_check;
ALTER TABLE deliveries ADD CONSTRAINT deliveries_reason_check
    CHECK (reason IN ('unregistered', 'bad_token', 'payload_rejected', 'rate_limited',
                      'provider_unavailable', 'channel_disabled', 'internal', 'endpoint_forbidden',
                      'wrong_environment'))
    NOT VALID;
