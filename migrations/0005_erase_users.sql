-- Erasing a user removes its memberships: found by user, which the primary
-- key (segment_id, user_id) cannot do without reading every segment's
-- members.
CREATE INDEX segment_members_user_id_idx ON segment_members (user_id);
