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
