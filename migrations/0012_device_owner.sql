-- A delivery goes only to a device that is still its user's.
--
-- A device's token can change hands: a user logs out of an app and another
-- logs in on the same phone, and registering the token for the second user
-- moves the device to them. A message scheduled for the first user before
-- that must not reach the phone afterwards. Registering the token for
-- another user now cancels the first user's pending deliveries to it, and a
-- chunk checks, when it reads its devices, that each still belongs to the
-- delivery's user and is active; one that was moved, deleted or evicted
-- since the message was scheduled is not sent, and its delivery is
-- cancelled with a reason that says which (device_moved, device_deleted,
-- device_evicted), or device_replaced when a token refreshed under the same
-- installation took its place. A delivery cancelled without a reason was
-- cancelled with its message.
--
-- NOT VALID: the rows already written hold only the old reasons, and
-- checking them would read the whole ledger under a lock.
ALTER TABLE deliveries DROP CONSTRAINT deliveries_reason_check;
ALTER TABLE deliveries ADD CONSTRAINT deliveries_reason_check
    CHECK (reason IN ('unregistered', 'bad_token', 'payload_rejected', 'rate_limited',
                      'provider_unavailable', 'channel_disabled', 'internal', 'endpoint_forbidden',
                      'wrong_environment', 'device_moved', 'device_deleted', 'device_evicted',
                      'device_replaced'))
    NOT VALID;

-- The app's own id of its installation, optional, as the providers' SDKs
-- model one: an app gets a new token after a reinstall, a restore or a
-- token refresh, and a registration that names the installation replaces
-- the installation's old token in place (same device id; its pending
-- deliveries go to the new token) instead of adding a second device that
-- would get every reminder again until a provider rejects the old token.
ALTER TABLE devices ADD COLUMN installation_id text;

CREATE UNIQUE INDEX devices_channel_installation_key ON devices (channel, installation_id)
    WHERE installation_id IS NOT NULL;
