-- Adding a write's skews to a message's histogram (0010) in one call.
--
-- Each result write added its accepted deliveries to the histogram by
-- rebuilding all 194 buckets in SQL (a series joined with the write's
-- buckets, then aggregated), some 80 us of PostgreSQL CPU per message and
-- write, when a write touches about seven buckets. With twenty messages in
-- flight, every write of the ledger paid it twenty times. This function
-- adds the counts in place: about 10 us.
CREATE FUNCTION skew_histogram_add(histogram integer[], buckets integer[], counts integer[])
RETURNS integer[] LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
BEGIN
    IF histogram IS NULL THEN
        histogram := array_fill(0, ARRAY[194]);
    END IF;
    FOR i IN 1 .. coalesce(array_length(buckets, 1), 0) LOOP
        histogram[buckets[i]] := histogram[buckets[i]] + counts[i];
    END LOOP;
    RETURN histogram;
END
$$;
