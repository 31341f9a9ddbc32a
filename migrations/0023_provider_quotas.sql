-- A provider's sending rate, shared by every process (jobs/quota).
--
-- Until now each process paced its own clients, one lane at a time, so N
-- workers with two lanes each could spend 2N times an FCM project's quota.
-- Now the rate is the project's (for Web Push, the sender's at one push
-- service), and every client that sends under it takes its turns from one
-- token bucket here: a row a quota, its tokens refilled by the time since
-- its last claim at the rate the claimant configures, capped at the
-- bucket's capacity. A process claims a few tokens at a time and spends
-- them within moments.
CREATE TABLE provider_quotas (
    key         text PRIMARY KEY,
    tokens      double precision NOT NULL,
    refilled_at timestamptz NOT NULL
);
