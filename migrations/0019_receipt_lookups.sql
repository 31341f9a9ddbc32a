-- What reading and erasing receipts (0017) needs besides its primary key.
--
-- early marks a delivered receipt that came before the ledger had the
-- delivery as accepted: the device can answer before Herald has written
-- the provider's acceptance, or for a delivery that then failed. Such a
-- receipt counts in confirmed_count like any other; a message's
-- unconfirmed deliveries (accepted, without a delivered receipt) are its
-- accepted_count less its confirmed_count, plus those of its early
-- receipts whose delivery is still not accepted, which the partial index
-- finds without reading the message's other receipts. accepted is final,
-- so a receipt that found its delivery accepted never needs a second look.
ALTER TABLE receipts ADD COLUMN early boolean NOT NULL DEFAULT false;
CREATE INDEX receipts_early_idx ON receipts (message_id) WHERE early;

-- Erasing a device deletes its receipts, found by the device.
CREATE INDEX receipts_device_idx ON receipts (device_id);

-- The bucket of skew_histogram (0010) a skew falls in, for the ledger's
-- accepted deliveries and the receipts' confirmed ones alike: under 1 ms is
-- bucket 1, then 10% a bucket up to 194. A plain SQL expression, which the
-- planner inlines: it costs what the expression it replaced did.
CREATE FUNCTION skew_histogram_bucket(skew_ms double precision)
RETURNS integer LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN skew_ms < 1 THEN 1
                ELSE least(2 + floor(ln(skew_ms) / ln(1.1))::integer, 194) END
$$;
