-- A claim under a frequency cap (db.ClaimFrequencyCaps) rewrites its user's
-- row once a message: at the instant of a capped message, a row a user. The
-- index on last_at, which only the retainer read, made every one of those
-- rewrites also insert into both indexes; without it, and with room left
-- on each page for the row's next version, a claim is a heap-only (HOT)
-- update, written in place of its page with no index entry. The claims'
-- PostgreSQL time falls by about two fifths and their WAL by three fifths.
--
-- The retainer finds the rows to delete by sweeping the table, a range of
-- its pages at a time (db.DeleteStaleFrequencyCaps), instead of through
-- the index.
DROP INDEX frequency_caps_last_idx;
ALTER TABLE frequency_caps SET (fillfactor = 50);
