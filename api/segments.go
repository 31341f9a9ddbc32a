package api

import (
	"errors"
	"fmt"
	"net/http"
	"time"

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
	seg, err := fromPath(c, "segment_id", "segment", callerID, db.On(s.pool).GetSegment)
	if err != nil {
		return err
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

type segmentListResponse struct {
	Items      []segmentResponse `json:"items"`
	NextCursor *string           `json:"next_cursor"`
}

// listSegments pages through the segments in id order.
func (s *Server) listSegments(c echo.Context) error {
	pg, err := readPage(c, "segments")
	if err != nil {
		return err
	}
	rows, err := db.On(s.pool).ListSegments(c.Request().Context(), db.ListSegmentsParams{AfterID: pg.afterKey, PageSize: pg.fetch()})
	if err != nil {
		return fmt.Errorf("list segments: %w", err)
	}
	rows, next := paginateByKey(pg, rows, func(r db.ListSegmentsRow) string { return r.ID })
	resp := segmentListResponse{Items: make([]segmentResponse, 0, len(rows)), NextCursor: next}
	for _, r := range rows {
		resp.Items = append(resp.Items, segmentResponse{SegmentID: r.ID, Name: r.Name, MemberCount: r.MemberCount})
	}
	return c.JSON(http.StatusOK, resp)
}

type memberItem struct {
	UserID  string    `json:"user_id"`
	AddedAt time.Time `json:"added_at"`
}

type memberListResponse struct {
	SegmentID  string       `json:"segment_id"`
	Items      []memberItem `json:"items"`
	NextCursor *string      `json:"next_cursor"`
}

// listSegmentMembers pages through a segment's members in user id order.
func (s *Server) listSegmentMembers(c echo.Context) error {
	ctx := c.Request().Context()
	id := c.Param("segment_id")
	if checkID("segment_id", id) != nil {
		return notFound("segment", id)
	}
	pg, err := readPage(c, "members:"+id)
	if err != nil {
		return err
	}
	var rows []db.ListSegmentMembersRow
	err = db.InTx(ctx, s.pool, func(tx pgx.Tx) error {
		q := db.On(tx)
		exists, err := q.SegmentExists(ctx, id)
		if err != nil {
			return fmt.Errorf("find segment: %w", err)
		}
		if !exists {
			return notFound("segment", id)
		}
		rows, err = q.ListSegmentMembers(ctx, db.ListSegmentMembersParams{SegmentID: id, AfterUserID: pg.afterKey, PageSize: pg.fetch()})
		if err != nil {
			return fmt.Errorf("list members: %w", err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	rows, next := paginateByKey(pg, rows, func(r db.ListSegmentMembersRow) string { return r.UserID })
	resp := memberListResponse{SegmentID: id, Items: make([]memberItem, 0, len(rows)), NextCursor: next}
	for _, r := range rows {
		resp.Items = append(resp.Items, memberItem{UserID: r.UserID, AddedAt: r.AddedAt.UTC()})
	}
	return c.JSON(http.StatusOK, resp)
}

// deleteSegment deletes a segment and its memberships; its users stay.
// Messages already made for it keep their audience (it was expanded when
// they were made); a schedule's later runs reach nobody.
func (s *Server) deleteSegment(c echo.Context) error {
	id := c.Param("segment_id")
	if checkID("segment_id", id) != nil {
		return notFound("segment", id)
	}
	n, err := db.On(s.pool).DeleteSegment(c.Request().Context(), id)
	if err != nil {
		return fmt.Errorf("delete segment: %w", err)
	}
	if n == 0 {
		return notFound("segment", id)
	}
	return c.NoContent(http.StatusNoContent)
}
