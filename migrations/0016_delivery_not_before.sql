-- A delivery whose device a provider throttled (APNs TooManyRequests, a Web
-- Push 429, FCM's per-device QUOTA_EXCEEDED) stays pending with the instant
-- before which it must not be sent again: the provider's Retry-After, or a
-- backoff when it named none. It is kept in the ledger, not in the chunk's
-- job, so that a retry of the chunk by any process honours it. NULL for
-- every other delivery; adding a column without a default rewrites nothing.
ALTER TABLE deliveries ADD COLUMN not_before timestamptz;
