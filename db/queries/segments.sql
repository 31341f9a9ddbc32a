-- name: UpsertSegment :one
INSERT INTO segments (id, name)
VALUES (@id, @name)
ON CONFLICT (id) DO UPDATE
SET name = excluded.name,
    updated_at = now()
RETURNING id, name, created_at, updated_at, (xmax = 0)::boolean AS created;

-- name: GetSegment :one
SELECT s.id, s.name, s.created_at, s.updated_at,
       (SELECT count(*) FROM segment_members m WHERE m.segment_id = s.id)::integer AS member_count
FROM segments s
WHERE s.id = @id;

-- name: LockSegment :one
-- Holds the segment for the rest of the transaction, so that members are
-- never added to a segment that is being deleted.
SELECT id FROM segments WHERE id = @id FOR KEY SHARE;

-- name: AddSegmentMembers :execrows
INSERT INTO segment_members (segment_id, user_id)
SELECT @segment_id, unnest(@user_ids::text[])
ON CONFLICT (segment_id, user_id) DO NOTHING;

-- name: RemoveSegmentMembers :execrows
DELETE FROM segment_members
WHERE segment_id = @segment_id AND user_id = ANY (@user_ids::text[]);

-- name: ListSegments :many
-- A page of segments in id order, after after_id (keyset pagination on the
-- primary key), with their member counts.
SELECT s.id, s.name, s.created_at, s.updated_at,
       (SELECT count(*) FROM segment_members m WHERE m.segment_id = s.id)::integer AS member_count
FROM segments s
WHERE s.id > @after_id
ORDER BY s.id
LIMIT @page_size;

-- name: ListSegmentMembers :many
-- A page of a segment's members in user id order, after after_user_id
-- (keyset pagination on the primary key).
SELECT user_id, added_at
FROM segment_members
WHERE segment_id = @segment_id AND user_id > @after_user_id
ORDER BY user_id
LIMIT @page_size;

-- name: DeleteSegment :execrows
-- Deletes a segment and its memberships (ON DELETE CASCADE); its users stay.
DELETE FROM segments WHERE id = @id;
