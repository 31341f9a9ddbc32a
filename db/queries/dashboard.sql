-- name: SkewHistogram :many
-- A message's accepted deliveries counted into @buckets equal-width skew
-- buckets between the smallest and the largest skew, in milliseconds.
-- Bucketing here sends the browser a few numbers instead of every row of a
-- 25,000-device message. Buckets without deliveries are left out; lo and hi
-- are the whole range, the same on every row: whole milliseconds, and at
-- least 1 ms per bucket, so that a message whose skews lie close together
-- gets readable bars rather than slivers of a microsecond.
WITH skew AS (
    SELECT (extract(epoch FROM d.accepted_at - d.due_at) * 1000)::double precision AS ms
    FROM deliveries d
    WHERE d.message_id = @message_id AND d.status = 'accepted'
    UNION ALL
    -- The acceptances kept in runs (migration 0028).
    SELECT (extract(epoch FROM (to_timestamp(0) + a.us * interval '1 microsecond') - r.due_at) * 1000)::double precision
    FROM accepted_runs r
    CROSS JOIN LATERAL unnest(r.accepted_us) AS a(us)
    WHERE r.message_id = @message_id
), bounds AS (
    SELECT floor(min(ms)) AS lo, greatest(ceil(max(ms)), floor(min(ms)) + @buckets::integer) AS hi FROM skew
)
SELECT least(width_bucket(skew.ms, bounds.lo, bounds.hi, @buckets::integer), @buckets::integer)::integer AS bucket,
       bounds.lo::double precision AS lo,
       bounds.hi::double precision AS hi,
       count(*)::integer AS devices
FROM skew CROSS JOIN bounds
GROUP BY 1, 2, 3
ORDER BY 1;

-- name: FailureReasons :many
-- How many of a message's deliveries failed or expired, by reason.
SELECT status, coalesce(reason, '')::text AS reason, count(*)::integer AS devices
FROM deliveries
WHERE message_id = @message_id AND status IN ('failed', 'expired')
GROUP BY status, reason
ORDER BY devices DESC, status, reason;

-- name: SLOShare :many
-- The messages settled since @since that were graded (slo_skew_ms, migration
-- 0014: something of them was due), by priority, and how many of them had
-- their maximum skew within @within_ms. Read through
-- messages_settled_at_idx: a day's messages, not the table.
SELECT priority,
       count(*)::integer AS messages,
       count(*) FILTER (WHERE slo_skew_ms <= @within_ms::double precision)::integer AS within_slo
FROM messages
WHERE settled_at >= @since::timestamptz AND slo_skew_ms IS NOT NULL
GROUP BY priority
ORDER BY priority;
