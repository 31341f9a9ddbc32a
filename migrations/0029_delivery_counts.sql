-- A ledger write's counts moved into its messages' counters by one function
-- (docs/architecture.md, the ledger's write path).
--
-- Since migration 0028 nearly every ledger write at an instant writes runs
-- and rows it counts itself (db.WriteChunks), and has no row that may
-- exist: all it asked of RecordResults was to move the counters. That
-- statement's plan is built for the upsert (some twenty nodes, 2.3 ms to
-- plan once a connection, again after each ANALYZE of the ledger, and a
-- quarter of a millisecond to start each time), and a 25,000-device message
-- paid it some 110 times. The counters' update lives here now, once:
-- RecordResults calls it with what it wrote and what it was given, and a
-- write with nothing to upsert calls it alone (CountResults).
--
-- The tallies are by message, status, the accepted ones' skew bucket
-- (skew_histogram_bucket; 0 for none) and the withheld ones' reason ('' for
-- none); n is each one's count. A message's row is locked by the caller
-- first (LockMessages). A message given no tally is not returned, and its
-- row is left alone.
CREATE FUNCTION add_delivery_counts(message_ids bigint[], statuses text[], buckets integer[],
                                    withheld text[], n integer[])
RETURNS TABLE (message_id bigint, pending_count integer, accepted integer, failed integer, expired integer)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH counts AS (
        SELECT t.message_id,
               coalesce(sum(t.n) FILTER (WHERE t.status = 'accepted'), 0)::integer AS accepted,
               coalesce(sum(t.n) FILTER (WHERE t.status = 'failed'), 0)::integer AS failed,
               coalesce(sum(t.n) FILTER (WHERE t.status = 'expired'), 0)::integer AS expired,
               coalesce(sum(t.n) FILTER (WHERE t.status = 'cancelled'), 0)::integer AS cancelled,
               coalesce(sum(t.n) FILTER (WHERE t.withheld = 'opted_out'), 0)::integer AS opted_out,
               coalesce(sum(t.n) FILTER (WHERE t.withheld = 'capped'), 0)::integer AS capped,
               coalesce(sum(t.n) FILTER (WHERE t.withheld = 'quiet_hours'), 0)::integer AS quiet_hours,
               array_agg(t.bucket) FILTER (WHERE t.status = 'accepted') AS buckets,
               array_agg(t.n) FILTER (WHERE t.status = 'accepted') AS skews
        FROM unnest(message_ids, statuses, buckets, withheld, n) AS t(message_id, status, bucket, withheld, n)
        GROUP BY t.message_id
    )
    UPDATE messages m
    SET pending_count = m.pending_count - c.accepted - c.failed - c.expired - c.cancelled,
        accepted_count = m.accepted_count + c.accepted,
        failed_count = m.failed_count + c.failed,
        expired_count = m.expired_count + c.expired,
        cancelled_count = m.cancelled_count + c.cancelled,
        opted_out_count = m.opted_out_count + c.opted_out,
        capped_count = m.capped_count + c.capped,
        quiet_hours_count = m.quiet_hours_count + c.quiet_hours,
        skew_histogram = CASE WHEN c.accepted = 0 THEN m.skew_histogram
                              ELSE skew_histogram_add(m.skew_histogram, c.buckets, c.skews) END
    FROM counts c
    WHERE m.id = c.message_id
    RETURNING m.id, m.pending_count, c.accepted, c.failed, c.expired;
END
$$;
