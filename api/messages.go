package api

import (
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"net/http"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/labstack/echo/v4"

	"github.com/heraldpush/herald/db"
	"github.com/heraldpush/herald/jobs"
	"github.com/heraldpush/herald/jobs/push"
)

const (
	// maxAudienceUsers caps an explicit list of users.
	maxAudienceUsers = 10_000
	// messageBodyLimit fits 10,000 user ids of the longest kind and a payload.
	messageBodyLimit = 4 << 20
	// defaultLifetime is a message's lifetime when expires_at is not given.
	defaultLifetime = time.Hour
	// maxLifetime is the longest a message may live: APNs, FCM and Web
	// Push services keep a push for at most four weeks, so a later expiry
	// would promise what none of them keeps.
	maxLifetime       = 28 * 24 * time.Hour
	maxIdempotencyKey = 255
)

type messageRequest struct {
	DispatchAt *string          `json:"dispatch_at"`
	ExpiresAt  *string          `json:"expires_at"`
	Priority   string           `json:"priority"`
	Audience   *audienceRequest `json:"audience"`
	Payload    *push.Content    `json:"payload"`

	// Local-time delivery: a wall time (no offset) sent at in each
	// recipient's own zone, instead of dispatch_at.
	DeliverAtLocal   *string `json:"deliver_at_local,omitempty"`
	FallbackTimezone *string `json:"fallback_timezone,omitempty"`
	IfPassed         *string `json:"if_passed,omitempty"`
	TTLSeconds       *int    `json:"ttl_seconds,omitempty"`

	dispatchAt, expiresAt *time.Time
	local                 *localRequest
}

// localRequest is a validated local-time delivery.
type localRequest struct {
	wall     time.Time
	fallback *time.Location
	sendNow  bool
	lifetime time.Duration
	json     []byte
}

// wallLayouts are the forms deliver_at_local takes: a date and a wall time,
// without offset.
var wallLayouts = []string{"2006-01-02T15:04", "2006-01-02T15:04:05"}

func (r *messageRequest) validateLocal() error {
	if r.DeliverAtLocal == nil {
		for field, set := range map[string]bool{"fallback_timezone": r.FallbackTimezone != nil, "if_passed": r.IfPassed != nil, "ttl_seconds": r.TTLSeconds != nil} {
			if set {
				return invalid(field, "%s goes with deliver_at_local", field)
			}
		}
		return nil
	}
	if r.DispatchAt != nil {
		return invalid("deliver_at_local", "give dispatch_at or deliver_at_local, not both")
	}
	if r.ExpiresAt != nil {
		return invalid("expires_at", "a local-time message has a lifetime per wave: give ttl_seconds instead of expires_at")
	}
	local := &localRequest{lifetime: defaultLifetime}
	var err error
	for _, layout := range wallLayouts {
		if local.wall, err = time.Parse(layout, *r.DeliverAtLocal); err == nil {
			break
		}
	}
	if err != nil {
		return invalid("deliver_at_local", "deliver_at_local must be a wall time without offset, such as 2026-09-04T09:00")
	}
	fallback := "UTC"
	if r.FallbackTimezone != nil {
		fallback = *r.FallbackTimezone
	}
	if err := checkTimezone("fallback_timezone", fallback); err != nil {
		return err
	}
	local.fallback, _ = time.LoadLocation(fallback)
	ifPassed := "skip"
	if r.IfPassed != nil {
		ifPassed = *r.IfPassed
	}
	switch ifPassed {
	case "skip":
	case "send_now":
		local.sendNow = true
	default:
		return invalid("if_passed", "if_passed %q is not skip or send_now", ifPassed)
	}
	if r.TTLSeconds != nil {
		if *r.TTLSeconds < 1 || *r.TTLSeconds > maxTTLSeconds {
			return invalid("ttl_seconds", "ttl_seconds must be from 1 to %d", maxTTLSeconds)
		}
		local.lifetime = time.Duration(*r.TTLSeconds) * time.Second
	}
	// Every zone's wave and its lifetime must fall within the instants
	// Herald stores, whoever turns out to be in the audience.
	if first, last := jobs.LocalWindow(local.wall, local.lifetime); !jobs.InstantInRange(first) || !jobs.InstantInRange(last) {
		earliest := jobs.EarliestInstant.Add(first.Sub(local.wall).Abs())
		latest := jobs.LatestInstant.Add(-last.Sub(local.wall)).Truncate(time.Minute)
		return invalid("deliver_at_local", "deliver_at_local must be from %s to %s, so that every zone's wave and its lifetime lie in years 1970 to 9999 UTC",
			earliest.Format(wallLayouts[0]), latest.Format(wallLayouts[0]))
	}
	local.json, err = json.Marshal(map[string]any{
		"deliver_at_local": *r.DeliverAtLocal, "fallback_timezone": fallback, "if_passed": ifPassed,
		"ttl_seconds": int(local.lifetime / time.Second),
	})
	r.local = local
	return err
}

type audienceRequest struct {
	Type string   `json:"type"`
	ID   string   `json:"id,omitempty"`
	IDs  []string `json:"ids,omitempty"`
}

// parseInstant reads an RFC 3339 timestamp that must say its offset (or Z):
// a wall time without one names no instant.
func parseInstant(field, s string) (time.Time, error) {
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return time.Time{}, invalid(field, "%s must be an RFC 3339 timestamp with an offset or Z, such as 2026-09-04T09:00:00+05:30", field)
	}
	return t, nil
}

// parseBoundedInstant is parseInstant for an instant Herald stores as it
// is given: it must also lie in years 1970 to 9999 UTC.
func parseBoundedInstant(field, s string) (time.Time, error) {
	t, err := parseInstant(field, s)
	if err != nil {
		return t, err
	}
	return t, checkInstant(field, t)
}

// checkInstant refuses an instant outside the years Herald stores
// (jobs.InstantInRange). An offset can carry a timestamp written in year
// 9999 into year 10000, so the bound is on the instant, not the text.
func checkInstant(field string, t time.Time) error {
	if !jobs.InstantInRange(t) {
		return invalid(field, "%s is %s, outside the years 1970 to 9999 UTC that Herald stores and shows", field, t.UTC().Format(time.RFC3339))
	}
	return nil
}

// instants applies the defaults of dispatch_at (now) and expires_at (an
// hour after dispatch_at) and checks the result as it will be stored: both
// in years 1970 to 9999, expires_at after dispatch_at but at most
// maxLifetime after it, and not yet passed. A local-time message's instants
// come from its waves, bounded by validateLocal.
func (r *messageRequest) instants(now time.Time) (dispatchAt, expiresAt time.Time, err error) {
	if r.local != nil {
		return now, now.Add(r.local.lifetime), nil
	}
	dispatchAt = now
	if r.dispatchAt != nil {
		dispatchAt = *r.dispatchAt
	}
	if err := checkInstant("dispatch_at", dispatchAt); err != nil {
		return dispatchAt, expiresAt, err
	}
	if r.expiresAt == nil {
		expiresAt = dispatchAt.Add(defaultLifetime)
		if !jobs.InstantInRange(expiresAt) {
			return dispatchAt, expiresAt, invalid("expires_at", "expires_at defaults to an hour after dispatch_at, %s, which is past year 9999: give an expires_at by 9999-12-31T23:59:59Z", expiresAt.UTC().Format(time.RFC3339))
		}
	} else {
		expiresAt = *r.expiresAt
		if err := checkInstant("expires_at", expiresAt); err != nil {
			return dispatchAt, expiresAt, err
		}
	}
	switch {
	case !expiresAt.After(dispatchAt):
		return dispatchAt, expiresAt, invalid("expires_at", "expires_at must be after dispatch_at")
	case expiresAt.Sub(dispatchAt) > maxLifetime:
		return dispatchAt, expiresAt, invalid("expires_at", "expires_at must be at most 28 days (%d seconds) after dispatch_at, the longest the push providers keep a push", int(maxLifetime/time.Second))
	case !expiresAt.After(now):
		return dispatchAt, expiresAt, invalid("expires_at", "the message would expire at %s, which has passed", expiresAt.UTC().Format(time.RFC3339))
	}
	return dispatchAt, expiresAt, nil
}

func (r *messageRequest) validate() error {
	if err := r.validateLocal(); err != nil {
		return err
	}
	if r.DispatchAt != nil {
		t, err := parseInstant("dispatch_at", *r.DispatchAt)
		if err != nil {
			return err
		}
		r.dispatchAt = &t
	}
	if r.ExpiresAt != nil {
		t, err := parseInstant("expires_at", *r.ExpiresAt)
		if err != nil {
			return err
		}
		r.expiresAt = &t
	}
	switch r.Priority {
	case "":
		r.Priority = jobs.PriorityBulk
	case jobs.PriorityUrgent, jobs.PriorityBulk:
	default:
		return invalid("priority", "priority %q is not urgent or bulk", r.Priority)
	}
	if err := r.Audience.validate(); err != nil {
		return err
	}
	return validatePayload(r.Payload)
}

func (a *audienceRequest) validate() error {
	if a == nil {
		return invalid("audience", `audience is required: {"type":"segment","id":...} or {"type":"users","ids":[...]}`)
	}
	switch a.Type {
	case "segment":
		if len(a.IDs) > 0 {
			return invalid("audience.ids", "a segment audience takes id, not ids")
		}
		return checkID("audience.id", a.ID)
	case "users":
		if a.ID != "" {
			return invalid("audience.id", "a users audience takes ids, not id")
		}
		if len(a.IDs) == 0 || len(a.IDs) > maxAudienceUsers {
			return invalid("audience.ids", "audience.ids must hold 1 to %d user ids, not %d", maxAudienceUsers, len(a.IDs))
		}
		for i, id := range a.IDs {
			if err := checkID(fmt.Sprintf("audience.ids[%d]", i), id); err != nil {
				return err
			}
		}
		return nil
	case "":
		return invalid("audience.type", "audience.type is required: segment or users")
	default:
		return invalid("audience.type", "audience.type %q is not segment or users", a.Type)
	}
}

func validatePayload(p *push.Content) error {
	if p == nil {
		return invalid("payload", "payload is required")
	}
	if p.Title == "" && p.Body == "" && len(p.Data) == 0 {
		return invalid("payload", "payload needs a title, a body or data")
	}
	for k := range p.Data {
		switch {
		case k == "":
			return invalid("payload.data", "payload.data keys must not be empty")
		case k == push.MessageIDKey || k == "aps":
			return invalid("payload.data."+k, "payload.data key %q is reserved", k)
		}
	}
	if err := validateLocalizations(p); err != nil {
		return err
	}
	var sizeErr *push.SizeError
	if err := push.CheckSizes(*p); errors.As(err, &sizeErr) {
		field := "payload"
		if sizeErr.Locale != "" {
			field = "payload.localizations." + sizeErr.Locale
		}
		return &Error{Status: http.StatusRequestEntityTooLarge, Code: "payload_too_large", Field: field,
			Message: sizeErr.Error()}
	} else if err != nil {
		return invalid("payload", "payload cannot be encoded: %v", err)
	}
	return nil
}

// maxLocalizations bounds a payload's localizations: more languages than
// any app ships, few enough that encoding every one stays cheap.
const maxLocalizations = 100

// validateLocalizations checks a payload's localizations and puts their
// keys in canonical case, so that users' locales find them.
func validateLocalizations(p *push.Content) error {
	if len(p.Localizations) > maxLocalizations {
		return invalid("payload.localizations", "payload.localizations may hold at most %d languages, not %d", maxLocalizations, len(p.Localizations))
	}
	canonical := make(map[string]push.Text, len(p.Localizations))
	for _, key := range slices.Sorted(maps.Keys(p.Localizations)) {
		field := "payload.localizations." + key
		tag, err := push.CanonicalLocale(key)
		if err != nil {
			return invalid(field, "%s: %v", field, err)
		}
		if _, dup := canonical[tag]; dup {
			return invalid(field, "%s: payload.localizations names %s twice (tags are case-insensitive)", field, tag)
		}
		text := p.Localizations[key]
		if text == (push.Text{}) {
			return invalid(field, "%s needs a title, a subtitle or a body", field)
		}
		canonical[tag] = text
	}
	if len(canonical) > 0 {
		p.Localizations = canonical
	}
	return nil
}

// messageResponse is the body of a 202 and the head of a status response.
type messageResponse struct {
	MessageID      string    `json:"message_id"`
	State          string    `json:"state"`
	DispatchAt     time.Time `json:"dispatch_at"`
	ExpiresAt      time.Time `json:"expires_at"`
	Priority       string    `json:"priority"`
	RecipientCount int32     `json:"recipient_count"`
	DeviceCount    int32     `json:"device_count"`
	ChunkCount     int32     `json:"chunk_count"`
}

func newMessageResponse(m db.Message) messageResponse {
	return messageResponse{
		MessageID: push.FormatMessageID(m.ID), State: m.State,
		DispatchAt: m.DispatchAt.UTC(), ExpiresAt: m.ExpiresAt.UTC(), Priority: m.Priority,
		RecipientCount: m.RecipientCount, DeviceCount: m.DeviceCount, ChunkCount: m.ChunkCount,
	}
}

// createMessage schedules a message: validation, then one transaction that
// claims the idempotency key, expands the audience, and stores the message,
// its payload, its ledger and its chunk jobs.
func (s *Server) createMessage(c echo.Context) error {
	key, err := storedHeader(c, "Idempotency-Key", maxIdempotencyKey)
	if err != nil {
		return err
	}
	var req messageRequest
	if err := decode(c, messageBodyLimit, &req); err != nil {
		return err
	}
	audienceJSON, err := json.Marshal(req.Audience)
	if err != nil {
		return fmt.Errorf("encode audience: %w", err)
	}
	// The request's identity for idempotency: its canonical encoding, so
	// that the same request sent with other spacing or key order matches.
	canonical, err := json.Marshal(req)
	if err != nil {
		return fmt.Errorf("encode request: %w", err)
	}
	hash := sha256.Sum256(canonical)

	ctx := c.Request().Context()
	scope := callerScope(ctx)
	var body []byte
	err = db.InTx(ctx, s.pool, func(tx pgx.Tx) error {
		q := db.On(tx)
		if key != "" {
			if _, err := q.ClaimIdempotencyKey(ctx, db.ClaimIdempotencyKeyParams{Scope: scope, Key: key, RequestHash: hash[:]}); err != nil {
				if !errors.Is(err, db.ErrNotFound) {
					return fmt.Errorf("claim idempotency key: %w", err)
				}
				// Taken, by a request that has committed: replay or refuse.
				prior, err := q.GetIdempotencyKey(ctx, db.GetIdempotencyKeyParams{Scope: scope, Key: key})
				if err != nil {
					return fmt.Errorf("read idempotency key: %w", err)
				}
				if string(prior.RequestHash) != string(hash[:]) {
					return &Error{Status: http.StatusConflict, Code: "idempotency_key_reused",
						Message: "this Idempotency-Key was used with a different request body"}
				}
				body = prior.Response
				return nil
			}
		}
		now, err := q.DatabaseNow(ctx)
		if err != nil {
			return fmt.Errorf("read clock: %w", err)
		}
		dispatchAt, expiresAt, err := req.instants(now)
		if err != nil {
			return err
		}
		var local *jobs.LocalTime
		if l := req.local; l != nil {
			local = &jobs.LocalTime{Wall: l.wall, Fallback: l.fallback, SendNow: l.sendNow, Now: now, Lifetime: l.lifetime, JSON: l.json}
		}
		msg, err := s.enqueuer.Create(ctx, tx, jobs.MessageSpec{
			Priority:     req.Priority,
			DispatchAt:   dispatchAt,
			ExpiresAt:    expiresAt,
			Audience:     jobs.Audience{SegmentID: req.Audience.ID, UserIDs: req.Audience.IDs},
			AudienceJSON: audienceJSON,
			Content:      *req.Payload,
			LocalTime:    local,
		})
		if errors.Is(err, jobs.ErrUnknownSegment) {
			return invalid("audience.id", "segment %q does not exist", req.Audience.ID)
		}
		if err != nil {
			return fmt.Errorf("schedule message: %w", err)
		}
		if body, err = json.Marshal(newMessageResponse(msg)); err != nil {
			return fmt.Errorf("encode response: %w", err)
		}
		if key != "" {
			if err := q.CompleteIdempotencyKey(ctx, db.CompleteIdempotencyKeyParams{
				Scope: scope, Key: key, MessageID: &msg.ID, Response: body,
			}); err != nil {
				return fmt.Errorf("record idempotency key: %w", err)
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	var head struct {
		MessageID string `json:"message_id"`
	}
	if err := json.Unmarshal(body, &head); err != nil {
		return fmt.Errorf("read response: %w", err)
	}
	c.Response().Header().Set(echo.HeaderLocation, "/v1/messages/"+head.MessageID)
	return c.JSONBlob(http.StatusAccepted, body)
}

type deliveryCounts struct {
	Total     int32 `json:"total"`
	Accepted  int32 `json:"accepted"`
	Failed    int32 `json:"failed"`
	Expired   int32 `json:"expired"`
	Cancelled int32 `json:"cancelled"`
	Pending   int32 `json:"pending"`
}

func countsOf(m db.Message) deliveryCounts {
	return deliveryCounts{
		Total: m.DeviceCount, Accepted: m.AcceptedCount, Failed: m.FailedCount,
		Expired: m.ExpiredCount, Cancelled: m.CancelledCount, Pending: m.PendingCount,
	}
}

type skewSummary struct {
	P50 float64 `json:"p50"`
	P95 float64 `json:"p95"`
	P99 float64 `json:"p99"`
	Max float64 `json:"max"`
}

// wave is the deliveries of a local-time message due at one instant, and
// how far they have got.
type wave struct {
	DispatchAt time.Time `json:"dispatch_at"`
	// ExpiresAt is the wave's own expiry: its dispatch_at plus the
	// message's ttl_seconds.
	ExpiresAt time.Time `json:"expires_at"`
	Devices   int32     `json:"devices"`
	Accepted  int32     `json:"accepted"`
	Failed    int32     `json:"failed"`
	Expired   int32     `json:"expired"`
	Cancelled int32     `json:"cancelled"`
	Pending   int32     `json:"pending"`
}

type messageStatus struct {
	messageResponse
	ScheduleID *string        `json:"schedule_id"`
	CreatedAt  time.Time      `json:"created_at"`
	StartedAt  *time.Time     `json:"started_at"`
	SettledAt  *time.Time     `json:"settled_at"`
	Deliveries deliveryCounts `json:"deliveries"`
	SkewMs     *skewSummary   `json:"skew_ms"`
	Waves      []wave         `json:"waves,omitempty"`
}

func newMessageStatus(m db.Message) messageStatus {
	st := messageStatus{
		messageResponse: newMessageResponse(m),
		CreatedAt:       m.CreatedAt.UTC(),
		StartedAt:       utcPtr(m.StartedAt),
		SettledAt:       utcPtr(m.SettledAt),
		Deliveries:      countsOf(m),
	}
	if m.ScheduleID != nil {
		id := formatScheduleID(*m.ScheduleID)
		st.ScheduleID = &id
	}
	if m.SkewMaxMs != nil {
		st.SkewMs = &skewSummary{P50: *m.SkewP50Ms, P95: *m.SkewP95Ms, P99: *m.SkewP99Ms, Max: *m.SkewMaxMs}
	}
	return st
}

// getMessage reads one message row; only while a message is dispatching and
// has accepted deliveries are its skew percentiles computed from the ledger
// (once settled they are stored on the row).
func (s *Server) getMessage(c echo.Context) error {
	ctx := c.Request().Context()
	q := db.On(s.pool)
	m, err := readMessage(c, q)
	if err != nil {
		return err
	}
	id := m.ID
	st := newMessageStatus(m)
	if st.SkewMs == nil && m.AcceptedCount > 0 {
		sk, err := q.MessageSkew(ctx, id)
		if err != nil {
			return fmt.Errorf("read skew: %w", err)
		}
		if sk.Accepted > 0 {
			st.SkewMs = &skewSummary{P50: round1(sk.P50), P95: round1(sk.P95), P99: round1(sk.P99), Max: round1(sk.Max)}
		}
	}
	if m.LocalTime != nil {
		var spec struct {
			TTLSeconds int64 `json:"ttl_seconds"`
		}
		if err := json.Unmarshal(m.LocalTime, &spec); err != nil {
			return fmt.Errorf("decode local time: %w", err)
		}
		lifetime := time.Duration(spec.TTLSeconds) * time.Second
		rows, err := q.MessageWaves(ctx, id)
		if err != nil {
			return fmt.Errorf("read waves: %w", err)
		}
		for _, r := range rows {
			st.Waves = append(st.Waves, wave{
				DispatchAt: r.DueAt.UTC(), ExpiresAt: r.DueAt.Add(lifetime).UTC(), Devices: r.Devices,
				Accepted: r.Accepted, Failed: r.Failed, Expired: r.Expired, Cancelled: r.Cancelled, Pending: r.Pending,
			})
		}
	}
	return c.JSON(http.StatusOK, st)
}

// readMessage reads the message that the path's message_id names: 404 when
// the id is malformed or unknown.
func readMessage(c echo.Context, q *db.Queries) (db.Message, error) {
	raw := c.Param("message_id")
	id, ok := push.ParseMessageID(raw)
	if !ok {
		return db.Message{}, notFound("message", raw)
	}
	m, err := q.GetMessage(c.Request().Context(), id)
	if err != nil {
		if errors.Is(err, db.ErrNotFound) {
			return db.Message{}, notFound("message", raw)
		}
		return db.Message{}, fmt.Errorf("read message: %w", err)
	}
	return m, nil
}

// cancelMessage cancels a message before its first chunk starts: every
// pending delivery becomes cancelled and its chunk jobs are cancelled in the
// same transaction. Once a chunk has started the answer is 409 with the
// counts so far; the state guard in CancelMessage makes the race with the
// first chunk resolve one way.
func (s *Server) cancelMessage(c echo.Context) error {
	ctx := c.Request().Context()
	raw := c.Param("message_id")
	id, ok := push.ParseMessageID(raw)
	if !ok {
		return notFound("message", raw)
	}
	err := db.InTx(ctx, s.pool, func(tx pgx.Tx) error {
		cancelled, err := s.enqueuer.Cancel(ctx, tx, id)
		if err != nil || cancelled {
			return err
		}
		m, err := db.On(tx).GetMessage(ctx, id)
		if err != nil {
			if errors.Is(err, db.ErrNotFound) {
				return notFound("message", raw)
			}
			return fmt.Errorf("read message: %w", err)
		}
		if m.State == jobs.StateCancelled {
			return nil // Cancelling twice is not an error.
		}
		return &Error{Status: http.StatusConflict, Code: "already_dispatching",
			Message: fmt.Sprintf("message %s is %s; deliveries may have been made", raw, m.State),
			Extra:   map[string]any{"state": m.State, "deliveries": countsOf(m)}}
	})
	if err != nil {
		return err
	}
	return c.NoContent(http.StatusNoContent)
}

var deliveryStatuses = map[string]bool{"pending": true, "accepted": true, "failed": true, "expired": true, "cancelled": true}

type deliveryItem struct {
	UserID      string     `json:"user_id"`
	DeviceID    string     `json:"device_id"`
	Channel     string     `json:"channel"`
	Status      string     `json:"status"`
	Reason      *string    `json:"reason"`
	AttemptedAt *time.Time `json:"attempted_at"`
	AcceptedAt  *time.Time `json:"accepted_at"`
	SkewMs      *float64   `json:"skew_ms"`
}

type deliveryPage struct {
	Items      []deliveryItem `json:"items"`
	NextCursor *string        `json:"next_cursor"`
}

// listDeliveries pages through a message's ledger in device order. Keyset
// pagination: a page starts after the last device of the previous one, so
// pages never repeat or skip a row, whatever changes in between.
func (s *Server) listDeliveries(c echo.Context) error {
	ctx := c.Request().Context()
	raw := c.Param("message_id")
	id, ok := push.ParseMessageID(raw)
	if !ok {
		return notFound("message", raw)
	}
	status := c.QueryParam("status")
	if status != "" && !deliveryStatuses[status] {
		return invalid("status", "status %q is not one of pending, accepted, failed, expired, cancelled", status)
	}
	pg, err := readPage(c, "deliveries:"+raw+":"+status)
	if err != nil {
		return err
	}
	q := db.On(s.pool)
	if _, err := q.GetMessage(ctx, id); err != nil {
		if errors.Is(err, db.ErrNotFound) {
			return notFound("message", raw)
		}
		return fmt.Errorf("read message: %w", err)
	}
	params := db.ListDeliveriesParams{MessageID: id, AfterDeviceID: pg.afterOr(0), PageSize: pg.fetch()}
	if status != "" {
		params.Status = &status
	}
	rows, err := q.ListDeliveries(ctx, params)
	if err != nil {
		return fmt.Errorf("list deliveries: %w", err)
	}
	rows, next := paginate(pg, rows, func(r db.ListDeliveriesRow) int64 { return r.DeviceID })
	page := deliveryPage{Items: make([]deliveryItem, 0, len(rows)), NextCursor: next}
	for _, r := range rows {
		item := deliveryItem{
			UserID: r.UserID, DeviceID: formatDeviceID(r.DeviceID), Channel: r.Channel, Status: r.Status,
			Reason: r.Reason, AttemptedAt: utcPtr(r.AttemptedAt), AcceptedAt: utcPtr(r.AcceptedAt),
		}
		if r.AcceptedAt != nil {
			skew := round1(float64(r.AcceptedAt.Sub(r.DueAt).Microseconds()) / 1000)
			item.SkewMs = &skew
		}
		page.Items = append(page.Items, item)
	}
	return c.JSON(http.StatusOK, page)
}

var messageStates = map[string]bool{
	jobs.StateScheduled: true, jobs.StateDispatching: true, jobs.StateDispatched: true,
	jobs.StateCancelled: true, jobs.StateExpired: true,
}

type messagePage struct {
	// Items are messageStatuses, each encoded on its own (Server.listed).
	Items      []json.RawMessage `json:"items"`
	NextCursor *string           `json:"next_cursor"`
}

// listMessages pages through messages, newest first.
func (s *Server) listMessages(c echo.Context) error {
	ctx := c.Request().Context()
	state := c.QueryParam("state")
	if state != "" && !messageStates[state] {
		return invalid("state", "state %q is not one of scheduled, dispatching, dispatched, cancelled, expired", state)
	}
	scheduleParam := c.QueryParam("schedule_id")
	pg, err := readPage(c, "messages:"+state+":"+scheduleParam)
	if err != nil {
		return err
	}
	params := db.ListMessagesParams{BeforeID: pg.afterOr(math.MaxInt64), PageSize: pg.fetch()}
	if state != "" {
		params.State = &state
	}
	if scheduleParam != "" {
		sid, ok := parseID(schedulePrefix, scheduleParam)
		if !ok {
			return invalid("schedule_id", "schedule_id %q is not a schedule id", scheduleParam)
		}
		params.ScheduleID = &sid
	}
	rows, err := db.On(s.pool).ListMessages(ctx, params)
	if err != nil {
		return fmt.Errorf("list messages: %w", err)
	}
	rows, next := paginate(pg, rows, func(m db.Message) int64 { return m.ID })
	page := messagePage{Items: make([]json.RawMessage, 0, len(rows)), NextCursor: next}
	for _, m := range rows {
		if item, ok := s.listed(c, "message_id", push.FormatMessageID(m.ID), newMessageStatus(m), nil); ok {
			page.Items = append(page.Items, item)
		}
	}
	return c.JSON(http.StatusOK, page)
}

// round1 rounds milliseconds to a tenth, the precision skew is reported in.
func round1(f float64) float64 { return math.Round(f*10) / 10 }
