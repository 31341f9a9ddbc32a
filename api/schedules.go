package api

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/labstack/echo/v4"

	"github.com/heraldpush/herald/db"
	"github.com/heraldpush/herald/jobs"
	"github.com/heraldpush/herald/jobs/apps"
	"github.com/heraldpush/herald/jobs/preferences"
	"github.com/heraldpush/herald/jobs/push"
)

const (
	// defaultTTLSeconds is a run's lifetime when ttl_seconds is not given:
	// a message's default lifetime.
	defaultTTLSeconds = int(jobs.DefaultLifetime / time.Second)
	maxTTLSeconds     = int(jobs.MaxLifetime / time.Second)
	// nextRunsShown is how many upcoming runs a schedule lists, and how many
	// of its runs made into messages and not started.
	nextRunsShown = 5
)

type scheduleRequest struct {
	Cron       string           `json:"cron"`
	Timezone   string           `json:"timezone"`
	Audience   *audienceRequest `json:"audience"`
	Payload    *push.Content    `json:"payload"`
	Priority   string           `json:"priority"`
	TTLSeconds *int             `json:"ttl_seconds"`
	StartsAt   *string          `json:"starts_at"`
	EndsAt     *string          `json:"ends_at"`
	LocalTime  bool             `json:"local_time"`
	// With local_time: the zone of users without one, and what happens to
	// users whose time has passed when the run is made.
	FallbackTimezone *string `json:"fallback_timezone"`
	IfPassed         *string `json:"if_passed"`
	// Category and QuietHours are each run's, as a message's; left out,
	// "default" and "hold" (unlessDefault).
	Category   string `json:"category,omitempty"`
	QuietHours string `json:"quiet_hours,omitempty"`

	cron             *jobs.Cron
	startsAt, endsAt *time.Time
}

func (r *scheduleRequest) validate() error {
	if r.Timezone == "" {
		r.Timezone = "UTC"
	}
	if err := checkTimezone("timezone", r.Timezone); err != nil {
		return err
	}
	loc, _ := time.LoadLocation(r.Timezone)
	if r.Cron == "" {
		return invalid("cron", `cron is required: five fields ("0 9 * * MON-FRI") or a descriptor ("@daily")`)
	}
	c, err := jobs.ParseCron(r.Cron, loc)
	if err != nil {
		return invalid("cron", "cron %q: %v", r.Cron, err)
	}
	r.cron = c
	if !r.LocalTime {
		if r.FallbackTimezone != nil || r.IfPassed != nil {
			return invalid("local_time", "fallback_timezone and if_passed go with local_time: true")
		}
	} else {
		if r.FallbackTimezone == nil {
			utc := "UTC"
			r.FallbackTimezone = &utc
		}
		if err := checkTimezone("fallback_timezone", *r.FallbackTimezone); err != nil {
			return err
		}
		if r.IfPassed == nil {
			skip := "skip"
			r.IfPassed = &skip
		}
		if *r.IfPassed != "skip" && *r.IfPassed != "send_now" {
			return invalid("if_passed", "if_passed %q is not skip or send_now", *r.IfPassed)
		}
	}
	switch r.Priority {
	case "":
		r.Priority = jobs.PriorityBulk
	case jobs.PriorityUrgent, jobs.PriorityBulk:
	default:
		return invalid("priority", "priority %q is not urgent or bulk", r.Priority)
	}
	if r.TTLSeconds == nil {
		ttl := defaultTTLSeconds
		r.TTLSeconds = &ttl
	}
	if *r.TTLSeconds < 1 || *r.TTLSeconds > maxTTLSeconds {
		return invalid("ttl_seconds", "ttl_seconds must be from 1 to %d", maxTTLSeconds)
	}
	for field, src := range map[string]*string{"starts_at": r.StartsAt, "ends_at": r.EndsAt} {
		if src == nil {
			continue
		}
		t, err := parseBoundedInstant(field, *src)
		if err != nil {
			return err
		}
		if field == "starts_at" {
			r.startsAt = &t
		} else {
			r.endsAt = &t
		}
	}
	if r.startsAt != nil && r.endsAt != nil && !r.endsAt.After(*r.startsAt) {
		return invalid("ends_at", "ends_at must be after starts_at")
	}
	if r.Category != "" {
		if err := preferences.CheckCategory(r.Category); err != nil {
			return invalid("category", "category %q %s", r.Category, err)
		}
	}
	if r.QuietHours != "" {
		if err := preferences.CheckQuietMode(r.QuietHours); err != nil {
			return invalid("quiet_hours", "quiet_hours %q %s", r.QuietHours, err)
		}
	}
	if err := r.Audience.validate(); err != nil {
		return err
	}
	return validatePayload(r.Payload)
}

// canonical is the request as its idempotency key remembers it: defaults
// filled in (validate has run) and instants in UTC, so that the same
// schedule said otherwise is the same request.
func (r scheduleRequest) canonical() scheduleRequest {
	utc := func(t *time.Time) *string {
		if t == nil {
			return nil
		}
		s := t.UTC().Format(time.RFC3339Nano)
		return &s
	}
	r.StartsAt, r.EndsAt = utc(r.startsAt), utc(r.endsAt)
	r.Category, r.QuietHours = unlessDefault(r.Category, r.QuietHours)
	return r
}

// scheduleScope is the key space of a caller's schedules' idempotency keys:
// apart from its messages' (whose scope is the caller's own), so that a key
// used for a message never answers a schedule. No caller's scope starts so.
func scheduleScope(caller string) string { return "schedules:" + caller }

// roomForSchedule refuses, with 409 too_many_schedules, a schedule past
// ScheduleLimits.MaxSchedules live ones: each runs on its own, so their
// number bounds the messages schedules make. It counts under a lock that
// every creation takes in its transaction, so that racing creations are
// counted one after another. A retry of a schedule made (its
// Idempotency-Key) is answered before this, at the limit or not.
func (s *Server) roomForSchedule(ctx context.Context, q *db.Queries) error {
	if err := q.LockScheduleCount(ctx); err != nil {
		return fmt.Errorf("lock schedule count: %w", err)
	}
	live, err := q.CountLiveSchedules(ctx)
	if err != nil {
		return fmt.Errorf("count schedules: %w", err)
	}
	if limit := s.cfg.ScheduleLimits.MaxSchedules; live >= int64(limit) {
		return &Error{Status: http.StatusConflict, Code: "too_many_schedules",
			Message: fmt.Sprintf("there are %d schedules, the most there may be (HERALD_MAX_SCHEDULES is %d); delete one to make room", live, limit)}
	}
	return nil
}

// firstRun is a schedule's first run at or after now (and starts_at), or
// nil when it has none before ends_at, or none whose message, lasting span
// after it, would end within year 9999.
func firstRun(c *jobs.Cron, now time.Time, startsAt, endsAt *time.Time, span time.Duration) *time.Time {
	from := now
	if startsAt != nil && startsAt.After(from) {
		from = *startsAt
	}
	next, ok := c.NextRun(from.Add(-time.Nanosecond), endsAt, span)
	if !ok {
		return nil
	}
	return &next
}

// runSpan is how long each run of schedule s lasts after its instant.
func runSpan(s db.Schedule) time.Duration {
	return jobs.RunSpan(time.Duration(s.TtlSeconds)*time.Second, s.LocalTime)
}

func deref(s *string, def string) string {
	if s == nil {
		return def
	}
	return *s
}

type scheduleResponse struct {
	ScheduleID string          `json:"schedule_id"`
	Cron       string          `json:"cron"`
	Timezone   string          `json:"timezone"`
	Audience   json.RawMessage `json:"audience"`
	Priority   string          `json:"priority"`
	TTLSeconds int32           `json:"ttl_seconds"`
	StartsAt   *time.Time      `json:"starts_at"`
	EndsAt     *time.Time      `json:"ends_at"`
	LocalTime  bool            `json:"local_time"`
	// FallbackTimezone and IfPassed apply to a local-time schedule.
	FallbackTimezone string      `json:"fallback_timezone,omitempty"`
	IfPassed         string      `json:"if_passed,omitempty"`
	Category         string      `json:"category"`
	QuietHours       string      `json:"quiet_hours"`
	Paused           bool        `json:"paused"`
	NextRuns         []time.Time `json:"next_runs"`
	// PendingRuns are the runs already made into messages that have not
	// started, earliest first, each with its message: they are among
	// NextRuns, and cancelling a message cancels its run.
	PendingRuns []pendingRun `json:"pending_runs"`
	CreatedAt   time.Time    `json:"created_at"`
	// Payload is what each run sends, as it was stored.
	Payload json.RawMessage `json:"payload"`
}

// pendingRun is a schedule run made into a message that has not started.
type pendingRun struct {
	RunAt     time.Time `json:"run_at"`
	MessageID string    `json:"message_id"`
}

// newScheduleResponse shows schedule s with its payload; pending are its
// runs made into messages and not started (pendingRuns), earliest first.
func newScheduleResponse(s db.Schedule, payload json.RawMessage, pending []db.PendingRunsRow) (scheduleResponse, error) {
	r := scheduleResponse{
		Payload:    payload,
		ScheduleID: formatScheduleID(s.ID), Cron: s.Cron, Timezone: s.Timezone, Audience: s.Audience,
		Priority: s.Priority, TTLSeconds: s.TtlSeconds, StartsAt: utcPtr(s.StartsAt), EndsAt: utcPtr(s.EndsAt),
		LocalTime: s.LocalTime, Paused: s.Paused, NextRuns: []time.Time{}, PendingRuns: []pendingRun{},
		CreatedAt: s.CreatedAt.UTC(), Category: s.Category, QuietHours: s.QuietHours,
	}
	if s.LocalTime {
		r.FallbackTimezone, r.IfPassed = s.FallbackTimezone, s.IfPassed
	}
	// A run is made into a message ahead of its time (a local-time one a
	// day ahead), and next_run_at moves on past it then. Until it starts,
	// it is the schedule's next run all the same, so next_runs lists the
	// runs from the first one not yet sent.
	for _, p := range pending {
		if p.ScheduleRunAt == nil {
			continue
		}
		r.PendingRuns = append(r.PendingRuns, pendingRun{RunAt: p.ScheduleRunAt.UTC(), MessageID: push.FormatMessageID(p.MessageID)})
		r.NextRuns = append(r.NextRuns, p.ScheduleRunAt.UTC())
	}
	// A next run out of range was stored before runs were bounded; it
	// will never be made, so none is shown.
	if s.Paused || s.NextRunAt == nil || !jobs.InstantInRange(*s.NextRunAt) {
		return r, nil
	}
	c, err := jobs.ScheduleCron(s.Cron, s.Timezone)
	if err != nil {
		return r, err
	}
	for _, t := range append([]time.Time{*s.NextRunAt}, c.NextRuns(*s.NextRunAt, nextRunsShown-1, s.EndsAt, runSpan(s))...) {
		if !slices.ContainsFunc(r.NextRuns, t.Equal) {
			r.NextRuns = append(r.NextRuns, t.UTC())
		}
	}
	slices.SortFunc(r.NextRuns, time.Time.Compare)
	r.NextRuns = r.NextRuns[:min(len(r.NextRuns), nextRunsShown)]
	return r, nil
}

// pendingRuns reads the runs of the schedules ids that have been made into
// messages and not started, by schedule, at most nextRunsShown of each.
func pendingRuns(ctx context.Context, q *db.Queries, ids ...int64) (map[int64][]db.PendingRunsRow, error) {
	rows, err := q.PendingRuns(ctx, db.PendingRunsParams{ScheduleIds: ids, PerSchedule: nextRunsShown})
	if err != nil {
		return nil, fmt.Errorf("read pending runs: %w", err)
	}
	out := make(map[int64][]db.PendingRunsRow, len(ids))
	for _, r := range rows {
		if r.ScheduleID != nil {
			out[*r.ScheduleID] = append(out[*r.ScheduleID], r)
		}
	}
	return out, nil
}

// createSchedule stores a recurring reminder; the materializer makes each
// run into a message ahead of its time. With an Idempotency-Key, the same
// request again answers the schedule it made, 200 with the first answer's
// body, and another request with the key is 409; retries racing each other
// make one schedule.
func (s *Server) createSchedule(c echo.Context) error {
	key, err := storedHeader(c, "Idempotency-Key", jobs.MaxIdempotencyKey)
	if err != nil {
		return err
	}
	var req scheduleRequest
	if err := decode(c, messageBodyLimit, &req); err != nil {
		return err
	}
	// How often a schedule runs depends on the server's limits, so it is
	// checked here rather than in validate.
	from := time.Now()
	if req.startsAt != nil && req.startsAt.After(from) {
		from = *req.startsAt
	}
	if err := s.cfg.ScheduleLimits.Check(req.cron, req.LocalTime, s.cfg.ScheduleLead, from); err != nil {
		return invalid("cron", "cron %q: %v", req.Cron, err)
	}
	ctx := c.Request().Context()
	if req.Audience.Apps, err = s.callerApps(ctx, req.Audience.Apps); err != nil {
		return err
	}
	setAuditApp(c, strings.Join(req.Audience.Apps, ","))
	audience, err := json.Marshal(req.Audience)
	if err != nil {
		return fmt.Errorf("encode audience: %w", err)
	}
	content, err := json.Marshal(req.Payload)
	if err != nil {
		return fmt.Errorf("encode payload: %w", err)
	}
	scope := scheduleScope(callerScope(ctx))
	return s.inTx(c, func(tx pgx.Tx) (int, any, error) {
		q := db.On(tx)
		if key != "" {
			prior, err := jobs.ClaimIdempotencyKey(ctx, q, scope, key, req.canonical())
			if err != nil {
				return 0, nil, err
			}
			if prior != nil {
				var made scheduleResponse
				if err := json.Unmarshal(prior, &made); err != nil {
					return 0, nil, fmt.Errorf("read idempotency key's schedule: %w", err)
				}
				// An answer kept from before schedules had categories.
				made.Category = cmp.Or(made.Category, preferences.DefaultCategory)
				made.QuietHours = cmp.Or(made.QuietHours, preferences.QuietHold)
				c.Response().Header().Set(echo.HeaderLocation, "/v1/schedules/"+made.ScheduleID)
				return http.StatusOK, made, nil
			}
		}
		if req.Audience.Type == "segment" {
			exists, err := q.SegmentExists(ctx, req.Audience.ID)
			if err != nil {
				return 0, nil, fmt.Errorf("find segment: %w", err)
			}
			if !exists {
				return 0, nil, invalid("audience.id", "segment %q does not exist", req.Audience.ID)
			}
		}
		if _, err := apps.Resolve(ctx, tx, "audience.apps", req.Audience.Apps); err != nil {
			return 0, nil, err
		}
		if err := s.roomForSchedule(ctx, q); err != nil {
			return 0, nil, err
		}
		now, err := q.DatabaseNow(ctx)
		if err != nil {
			return 0, nil, fmt.Errorf("read clock: %w", err)
		}
		payloadID, err := q.InsertPayload(ctx, content)
		if err != nil {
			return 0, nil, fmt.Errorf("store payload: %w", err)
		}
		sch, err := q.InsertSchedule(ctx, db.InsertScheduleParams{
			Cron: req.Cron, Timezone: req.Timezone, Audience: audience, PayloadID: payloadID,
			Priority: req.Priority, TtlSeconds: int32(*req.TTLSeconds), LocalTime: req.LocalTime,
			FallbackTimezone: deref(req.FallbackTimezone, "UTC"), IfPassed: deref(req.IfPassed, "skip"),
			StartsAt: req.startsAt, EndsAt: req.endsAt, Category: req.Category, QuietHours: req.QuietHours,
			NextRunAt: firstRun(req.cron, now, req.startsAt, req.endsAt,
				jobs.RunSpan(time.Duration(*req.TTLSeconds)*time.Second, req.LocalTime)),
		})
		if err != nil {
			return 0, nil, fmt.Errorf("store schedule: %w", err)
		}
		resp, err := newScheduleResponse(sch, content, nil)
		if err != nil {
			return 0, nil, err
		}
		if key != "" {
			body, err := json.Marshal(resp)
			if err != nil {
				return 0, nil, fmt.Errorf("encode schedule: %w", err)
			}
			if err := q.CompleteIdempotencyKey(ctx, db.CompleteIdempotencyKeyParams{
				Scope: scope, Key: key, ScheduleID: &sch.ID, Response: body,
			}); err != nil {
				return 0, nil, fmt.Errorf("record idempotency key: %w", err)
			}
		}
		c.Response().Header().Set(echo.HeaderLocation, "/v1/schedules/"+resp.ScheduleID)
		return http.StatusCreated, resp, nil
	})
}

func (s *Server) scheduleParam(c echo.Context) (int64, string, error) {
	raw := c.Param("schedule_id")
	id, ok := parseID(schedulePrefix, raw)
	if !ok {
		return 0, raw, notFound("schedule", raw)
	}
	return id, raw, nil
}

func (s *Server) getSchedule(c echo.Context) error {
	q := db.On(s.pool)
	sch, err := fromPath(c, "schedule_id", "schedule", scheduleID, q.GetSchedule)
	if err != nil {
		return err
	}
	pending, err := pendingRuns(c.Request().Context(), q, sch.ID)
	if err != nil {
		return err
	}
	payloads, err := payloadsOf(c.Request().Context(), q, sch.PayloadID)
	if err != nil {
		return err
	}
	resp, err := newScheduleResponse(sch, payloads[sch.PayloadID], pending[sch.ID])
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, resp)
}

type schedulePage struct {
	// Items are scheduleResponses, each encoded on its own (Server.listed).
	Items      []json.RawMessage `json:"items"`
	NextCursor *string           `json:"next_cursor"`
}

func (s *Server) listSchedules(c echo.Context) error {
	pg, err := readPage(c, "schedules")
	if err != nil {
		return err
	}
	params := db.ListSchedulesParams{BeforeID: pg.afterOr(math.MaxInt64), PageSize: pg.fetch()}
	q := db.On(s.pool)
	rows, err := q.ListSchedules(c.Request().Context(), params)
	if err != nil {
		return fmt.Errorf("list schedules: %w", err)
	}
	rows, next := paginate(pg, rows, func(sch db.Schedule) int64 { return sch.ID })
	ids := make([]int64, len(rows))
	payloadIDs := make([]int64, len(rows))
	for i, sch := range rows {
		ids[i], payloadIDs[i] = sch.ID, sch.PayloadID
	}
	pending, err := pendingRuns(c.Request().Context(), q, ids...)
	if err != nil {
		return err
	}
	payloads, err := payloadsOf(c.Request().Context(), q, payloadIDs...)
	if err != nil {
		return err
	}
	page := schedulePage{Items: make([]json.RawMessage, 0, len(rows)), NextCursor: next}
	for _, sch := range rows {
		r, err := newScheduleResponse(sch, payloads[sch.PayloadID], pending[sch.ID])
		if item, ok := s.listed(c, "schedule_id", formatScheduleID(sch.ID), r, err); ok {
			page.Items = append(page.Items, item)
		}
	}
	return c.JSON(http.StatusOK, page)
}

type schedulePatch struct {
	Paused *bool `json:"paused"`
}

func (p *schedulePatch) validate() error {
	if p.Paused == nil {
		return invalid("paused", "paused (true or false) is the one field a schedule's PATCH takes")
	}
	return nil
}

// patchSchedule pauses or resumes a schedule. Pausing cancels the runs
// already made into messages that have not started; resuming starts again
// from the next run after now.
func (s *Server) patchSchedule(c echo.Context) error {
	id, raw, err := s.scheduleParam(c)
	if err != nil {
		return err
	}
	var req schedulePatch
	if err := decode(c, smallBodyLimit, &req); err != nil {
		return err
	}
	ctx := c.Request().Context()
	return s.inTx(c, func(tx pgx.Tx) (int, any, error) {
		q := db.On(tx)
		cur, err := q.GetSchedule(ctx, id)
		if err != nil {
			if errors.Is(err, db.ErrNotFound) {
				return 0, nil, notFound("schedule", raw)
			}
			return 0, nil, fmt.Errorf("read schedule: %w", err)
		}
		var next *time.Time
		if !*req.Paused {
			now, err := q.DatabaseNow(ctx)
			if err != nil {
				return 0, nil, fmt.Errorf("read clock: %w", err)
			}
			c, err := jobs.ScheduleCron(cur.Cron, cur.Timezone)
			if err != nil {
				return 0, nil, err
			}
			next = firstRun(c, now, cur.StartsAt, cur.EndsAt, runSpan(cur))
		}
		sch, err := q.SetSchedulePaused(ctx, db.SetSchedulePausedParams{ID: id, Paused: *req.Paused, NextRunAt: next})
		if err != nil {
			return 0, nil, fmt.Errorf("update schedule: %w", err)
		}
		if *req.Paused {
			if err := s.enqueuer.CancelUnstartedRuns(ctx, tx, id); err != nil {
				return 0, nil, err
			}
		}
		pending, err := pendingRuns(ctx, q, id)
		if err != nil {
			return 0, nil, err
		}
		payloads, err := payloadsOf(ctx, q, sch.PayloadID)
		if err != nil {
			return 0, nil, err
		}
		resp, err := newScheduleResponse(sch, payloads[sch.PayloadID], pending[id])
		return http.StatusOK, resp, err
	})
}

// deleteSchedule stops a schedule and cancels its runs that have not
// started; its past runs stay listable by schedule_id.
func (s *Server) deleteSchedule(c echo.Context) error {
	id, raw, err := s.scheduleParam(c)
	if err != nil {
		return err
	}
	ctx := c.Request().Context()
	err = db.InTx(ctx, s.pool, func(tx pgx.Tx) error {
		n, err := db.On(tx).DeleteSchedule(ctx, id)
		if err != nil {
			return fmt.Errorf("delete schedule: %w", err)
		}
		if n == 0 {
			return notFound("schedule", raw)
		}
		return s.enqueuer.CancelUnstartedRuns(ctx, tx, id)
	})
	if err != nil {
		return err
	}
	return c.NoContent(http.StatusNoContent)
}
