package api

import (
	"errors"
	"fmt"
	"net/http"

	"github.com/jackc/pgx/v5"
	"github.com/labstack/echo/v4"

	"github.com/heraldpush/herald/db"
)

const (
	// maxMembersPerCall caps one membership change.
	maxMembersPerCall = 10_000
	maxSegmentName    = 200
)

type segmentRequest struct {
	Name string `json:"name"`
}

func (r *segmentRequest) validate() error {
	if len(r.Name) > maxSegmentName {
		return invalid("name", "name is longer than %d characters", maxSegmentName)
	}
	return nil
}

type segmentResponse struct {
	SegmentID   string `json:"segment_id"`
	Name        string `json:"name"`
	MemberCount int32  `json:"member_count"`
}

func (s *Server) putSegment(c echo.Context) error {
	id := c.Param("segment_id")
	if err := checkID("segment_id", id); err != nil {
		return err
	}
	var req segmentRequest
	if err := decode(c, smallBodyLimit, &req); err != nil {
		return err
	}
	ctx := c.Request().Context()
	var (
		created bool
		seg     db.GetSegmentRow
	)
	err := db.InTx(ctx, s.pool, func(tx pgx.Tx) error {
		q := db.On(tx)
		row, err := q.UpsertSegment(ctx, db.UpsertSegmentParams{ID: id, Name: req.Name})
		if err != nil {
			return fmt.Errorf("put segment: %w", err)
		}
		created = row.Created
		if seg, err = q.GetSegment(ctx, id); err != nil {
			return fmt.Errorf("read segment: %w", err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	status := http.StatusOK
	if created {
		status = http.StatusCreated
	}
	return c.JSON(status, segmentResponse{SegmentID: seg.ID, Name: seg.Name, MemberCount: seg.MemberCount})
}

func (s *Server) getSegment(c echo.Context) error {
	id := c.Param("segment_id")
	if checkID("segment_id", id) != nil {
		return notFound("segment", id)
	}
	seg, err := db.On(s.pool).GetSegment(c.Request().Context(), id)
	if err != nil {
		if errors.Is(err, db.ErrNotFound) {
			return notFound("segment", id)
		}
		return fmt.Errorf("read segment: %w", err)
	}
	return c.JSON(http.StatusOK, segmentResponse{SegmentID: seg.ID, Name: seg.Name, MemberCount: seg.MemberCount})
}

type membersRequest struct {
	UserIDs []string `json:"user_ids"`
}

func (r *membersRequest) validate() error {
	if len(r.UserIDs) == 0 || len(r.UserIDs) > maxMembersPerCall {
		return invalid("user_ids", "user_ids must hold 1 to %d ids, not %d", maxMembersPerCall, len(r.UserIDs))
	}
	for i, id := range r.UserIDs {
		if err := checkID(fmt.Sprintf("user_ids[%d]", i), id); err != nil {
			return err
		}
	}
	return nil
}

type membersResponse struct {
	SegmentID   string `json:"segment_id"`
	Added       *int64 `json:"added,omitempty"`
	Removed     *int64 `json:"removed,omitempty"`
	MemberCount int32  `json:"member_count"`
}

// addMembers adds users to a segment, creating the users that are new.
// Adding a member twice is not an error; the response counts what changed.
func (s *Server) addMembers(c echo.Context) error {
	return s.changeMembers(c, func(q *db.Queries, c echo.Context, id string, users []string) (membersResponse, error) {
		ctx := c.Request().Context()
		if err := q.EnsureUsers(ctx, users); err != nil {
			return membersResponse{}, fmt.Errorf("ensure users: %w", err)
		}
		n, err := q.AddSegmentMembers(ctx, db.AddSegmentMembersParams{SegmentID: id, UserIds: users})
		if err != nil {
			return membersResponse{}, fmt.Errorf("add members: %w", err)
		}
		return membersResponse{Added: &n}, nil
	})
}

func (s *Server) removeMembers(c echo.Context) error {
	return s.changeMembers(c, func(q *db.Queries, c echo.Context, id string, users []string) (membersResponse, error) {
		n, err := q.RemoveSegmentMembers(c.Request().Context(), db.RemoveSegmentMembersParams{SegmentID: id, UserIds: users})
		if err != nil {
			return membersResponse{}, fmt.Errorf("remove members: %w", err)
		}
		return membersResponse{Removed: &n}, nil
	})
}

// changeMembers is the shared shape of adding and removing members: decode,
// hold the segment, change, count.
func (s *Server) changeMembers(c echo.Context,
	change func(q *db.Queries, c echo.Context, id string, users []string) (membersResponse, error),
) error {
	id := c.Param("segment_id")
	if checkID("segment_id", id) != nil {
		return notFound("segment", id)
	}
	var req membersRequest
	if err := decode(c, batchBodyLimit, &req); err != nil {
		return err
	}
	users := sortedUnique(req.UserIDs)
	ctx := c.Request().Context()
	var resp membersResponse
	err := db.InTx(ctx, s.pool, func(tx pgx.Tx) error {
		q := db.On(tx)
		if _, err := q.LockSegment(ctx, id); err != nil {
			if errors.Is(err, db.ErrNotFound) {
				return notFound("segment", id)
			}
			return fmt.Errorf("find segment: %w", err)
		}
		var err error
		if resp, err = change(q, c, id, users); err != nil {
			return err
		}
		seg, err := q.GetSegment(ctx, id)
		if err != nil {
			return fmt.Errorf("count members: %w", err)
		}
		resp.SegmentID, resp.MemberCount = id, seg.MemberCount
		return nil
	})
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, resp)
}
