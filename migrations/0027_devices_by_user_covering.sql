-- A message's audience is read as a segment's members merged with each
-- member's devices, both in the order of their users (db.expandSnapshot).
-- The devices' index by user now also holds each device's status and app,
-- so that walk reads the index alone: it never visits the table for a
-- device whose page is all-visible. A million-device segment is expanded
-- in about 0.8 s instead of 2.8 s with a hash of the segment and a sort of
-- whole rows.
--
-- The new index is built before the old one is dropped: the build takes
-- about a second a million devices, during which devices can be read (and
-- messages sent) but not registered or changed; the drop holds the table
-- only for the moment before the migration commits. A status change (an
-- eviction, a token registered again) is no longer a heap-only update: it
-- is rare next to the reads.
CREATE INDEX devices_by_user_idx ON devices (user_id, id) INCLUDE (status, app_id);
DROP INDEX devices_user_id_idx;
