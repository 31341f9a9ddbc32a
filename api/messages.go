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
	"strconv"
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

// messageBodyLimit fits 10,000 user ids of the longest kind and a payload.
const messageBodyLimit = 4 << 20

// messageRequest is POST /v1/messages' body. It checks its own shape and
// reads its instants; the rules of a message itself are jobs.Message's, the
// same for Go callers (jobs.Scheduler).
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

	// Category is the message's kind, which users opt out of and which
	// may be critical or capped (docs/preferences.md); QuietHours what a
	// delivery due in its user's quiet hours does: hold or skip. Empty:
	// "default" and "hold".
	Category   string `json:"category,omitempty"`
	QuietHours string `json:"quiet_hours,omitempty"`

	msg jobs.Message
}

// validate checks the body's shape and reads it as the message it asks for;
// that message's rules are checked when it is scheduled.
func (r *messageRequest) validate() (err error) {
	r.msg, err = r.message()
	return err
}

// wallLayouts are the forms deliver_at_local takes: a date and a wall time,
// without offset.
var wallLayouts = []string{jobs.WallLayout, jobs.WallLayout + ":05"}

func (r *messageRequest) local() (*jobs.LocalDelivery, error) {
	if r.DeliverAtLocal == nil {
		for field, set := range map[string]bool{"fallback_timezone": r.FallbackTimezone != nil, "if_passed": r.IfPassed != nil, "ttl_seconds": r.TTLSeconds != nil} {
			if set {
				return nil, invalid(field, "%s goes with deliver_at_local", field)
			}
		}
		return nil, nil
	}
	local := &jobs.LocalDelivery{}
	var err error
	for _, layout := range wallLayouts {
		if local.Wall, err = time.Parse(layout, *r.DeliverAtLocal); err == nil {
			break
		}
	}
	if err != nil {
		return nil, invalid("deliver_at_local", "deliver_at_local must be a wall time without offset, such as 2026-09-04T09:00")
	}
	if r.FallbackTimezone != nil {
		if local.FallbackTimezone = *r.FallbackTimezone; local.FallbackTimezone == "" {
			return nil, jobs.CheckTimezone("fallback_timezone", "")
		}
	}
	if r.IfPassed != nil {
		switch *r.IfPassed {
		case "skip":
		case "send_now":
			local.SendIfPassed = true
		default:
			return nil, invalid("if_passed", "if_passed %q is not skip or send_now", *r.IfPassed)
		}
	}
	if r.TTLSeconds != nil {
		if *r.TTLSeconds < 1 || *r.TTLSeconds > maxTTLSeconds {
			return nil, invalid("ttl_seconds", "ttl_seconds must be from 1 to %d", maxTTLSeconds)
		}
		local.TTL = time.Duration(*r.TTLSeconds) * time.Second
	}
	return local, nil
}

type audienceRequest struct {
	Type string   `json:"type"`
	ID   string   `json:"id,omitempty"`
	IDs  []string `json:"ids,omitempty"`
	// Apps, when set, are the apps whose devices the audience holds
	// (docs/apps.md); none: every app's.
	Apps []string `json:"apps,omitempty"`
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
	return t, jobs.CheckInstant(field, t)
}

// message reads the request as the message it asks for.
func (r *messageRequest) message() (jobs.Message, error) {
	m := jobs.Message{Priority: r.Priority}
	m.Category, m.QuietHours = unlessDefault(r.Category, r.QuietHours)
	var err error
	if m.Local, err = r.local(); err != nil {
		return m, err
	}
	if r.DispatchAt != nil {
		if m.DispatchAt, err = parseInstant("dispatch_at", *r.DispatchAt); err != nil {
			return m, err
		}
	}
	if r.ExpiresAt != nil {
		if m.ExpiresAt, err = parseInstant("expires_at", *r.ExpiresAt); err != nil {
			return m, err
		}
	}
	if m.Audience, err = r.Audience.audience(); err != nil {
		return m, err
	}
	if r.Payload == nil {
		return m, invalid("payload", "payload is required")
	}
	m.Payload = *r.Payload
	return m, nil
}

// audience checks the audience's shape: a segment takes id, users take ids.
func (a *audienceRequest) audience() (jobs.Audience, error) {
	if a == nil {
		return jobs.Audience{}, invalid("audience", `audience is required: {"type":"segment","id":...} or {"type":"users","ids":[...]}`)
	}
	switch a.Type {
	case "segment":
		if len(a.IDs) > 0 {
			return jobs.Audience{}, invalid("audience.ids", "a segment audience takes id, not ids")
		}
		if a.ID == "" {
			return jobs.Audience{}, invalid("audience.id", "audience.id is required")
		}
		return jobs.Audience{SegmentID: a.ID, Apps: a.Apps}, nil
	case "users":
		if a.ID != "" {
			return jobs.Audience{}, invalid("audience.id", "a users audience takes ids, not id")
		}
		return jobs.Audience{UserIDs: a.IDs, Apps: a.Apps}, nil
	case "":
		return jobs.Audience{}, invalid("audience.type", "audience.type is required: segment or users")
	default:
		return jobs.Audience{}, invalid("audience.type", "audience.type %q is not segment or users", a.Type)
	}
}

// validate checks an audience's shape and the rules of one.
func (a *audienceRequest) validate() error {
	audience, err := a.audience()
	if err != nil {
		return err
	}
	return jobs.CheckAudience(audience)
}

// validatePayload checks a payload that a request may have left out.
func validatePayload(p *push.Content) error {
	if p == nil {
		return invalid("payload", "payload is required")
	}
	return jobs.CheckPayload(p)
}

// createMessage schedules a message: its shape is checked here, and one
// transaction claims the idempotency key, expands the audience, and stores
// the message, its payload, its ledger and its chunk jobs (jobs.Enqueuer's
// Submit, which checks the message's rules first). A message sent now is
// written in two, its first chunk first, and answered once both are.
func (s *Server) createMessage(c echo.Context) error {
	key, err := storedHeader(c, "Idempotency-Key", jobs.MaxIdempotencyKey)
	if err != nil {
		return err
	}
	var req messageRequest
	if err := decode(c, messageBodyLimit, &req); err != nil {
		return err
	}
	m := req.msg
	m.IdempotencyKey = key
	ctx := c.Request().Context()
	if m.Audience.Apps, err = s.callerApps(ctx, m.Audience.Apps); err != nil {
		return err
	}
	setAuditApp(c, strings.Join(m.Audience.Apps, ","))
	receipt, err := s.enqueuer.Submit(ctx, s.pool, m, callerScope(ctx))
	if err != nil {
		return err
	}
	c.Response().Header().Set(echo.HeaderLocation, "/v1/messages/"+receipt.MessageID)
	return c.JSON(http.StatusAccepted, messageHead{Receipt: receipt,
		Category: cmp.Or(m.Category, preferences.DefaultCategory), QuietHours: cmp.Or(m.QuietHours, preferences.QuietHold)})
}

// messageHead is a message as its 202 shows it: its receipt, and what its
// recipients' preferences make of it.
type messageHead struct {
	jobs.Receipt
	Category   string `json:"category"`
	QuietHours string `json:"quiet_hours"`
}

// callerApps are the apps a message of the caller's is for: named, they
// must be among those its key may act for; unnamed, a key limited to some
// apps sends to those, and any other key to every app (none named).
func (s *Server) callerApps(ctx context.Context, named []string) ([]string, error) {
	who := callerOf(ctx)
	if who.apps == nil {
		return named, nil
	}
	ix, err := apps.ReadIndex(ctx, s.pool)
	if err != nil {
		return nil, err
	}
	if len(named) == 0 {
		for name, id := range ix.ByName {
			if who.mayActFor(id) {
				named = append(named, name)
			}
		}
		slices.Sort(named)
		return named, nil
	}
	for i, name := range named {
		if id, ok := ix.ByName[name]; ok && !who.mayActFor(id) {
			return nil, &Error{Status: http.StatusForbidden, Code: "forbidden", Field: fmt.Sprintf("audience.apps[%d]", i),
				Message: fmt.Sprintf("key %q may not send to app %q", who.key, name)}
		}
	}
	return named, nil
}

// deliveryCounts are a message's deliveries by status, which add up to
// the total, and those withheld for their users' sake (docs/preferences.md):
// OptedOut and Capped among the cancelled, QuietHours among the cancelled
// and the expired, Held among the pending.
type deliveryCounts struct {
	Total      int32 `json:"total"`
	Accepted   int32 `json:"accepted"`
	Failed     int32 `json:"failed"`
	Expired    int32 `json:"expired"`
	Cancelled  int32 `json:"cancelled"`
	Pending    int32 `json:"pending"`
	OptedOut   int32 `json:"opted_out"`
	Capped     int32 `json:"capped"`
	QuietHours int32 `json:"quiet_hours"`
	Held       int32 `json:"held"`
}

// countsOf reads a message row's counters; held is how many of its
// deliveries its users' quiet hours hold now (heldNow).
func countsOf(m db.Message, held int32) deliveryCounts {
	return deliveryCounts{
		Total: m.DeviceCount, Accepted: m.AcceptedCount, Failed: m.FailedCount,
		Expired: m.ExpiredCount, Cancelled: m.CancelledCount, Pending: m.PendingCount,
		OptedOut: m.OptedOutCount, Capped: m.CappedCount, QuietHours: m.QuietHoursCount, Held: held,
	}
}

// heldNow reads, by message id, how many deliveries of messages are held
// by their users' quiet hours now (db.HeldDeliveries). Only a message that
// has started and has deliveries pending can hold any, so only those are
// asked of: the rest cost nothing.
func heldNow(ctx context.Context, q *db.Queries, messages ...db.Message) (map[int64]int32, error) {
	var ids []int64
	for _, m := range messages {
		if m.StartedAt != nil && m.PendingCount > 0 {
			ids = append(ids, m.ID)
		}
	}
	if len(ids) == 0 {
		return nil, nil
	}
	rows, err := q.HeldDeliveries(ctx, ids)
	if err != nil {
		return nil, fmt.Errorf("count held deliveries: %w", err)
	}
	out := make(map[int64]int32, len(rows))
	for _, r := range rows {
		out[r.MessageID] = r.Held
	}
	return out, nil
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
	messageHead
	ScheduleID *string        `json:"schedule_id"`
	CreatedAt  time.Time      `json:"created_at"`
	StartedAt  *time.Time     `json:"started_at"`
	SettledAt  *time.Time     `json:"settled_at"`
	Deliveries deliveryCounts `json:"deliveries"`
	SkewMs     *skewSummary   `json:"skew_ms"`
	// SLOSkewMs is the message's maximum skew as the SLO grades it
	// (SettleMessage), nil until it settles or when nothing was due.
	SLOSkewMs *float64 `json:"slo_skew_ms"`
	Waves     []wave   `json:"waves,omitempty"`
	// Receipts is what the devices said of the message (receipts.go).
	Receipts receiptCounts `json:"receipts"`
	// Payload is what the message sends, as it was stored.
	Payload json.RawMessage `json:"payload"`
	// Apps are the apps the message is for; none: every app.
	Apps []string `json:"apps,omitempty"`
}

// receiptCounts is what a message's receipts say: how many deliveries the
// devices confirmed and opened, how many accepted ones they did not
// confirm, and the confirmed skew, as percentiles and as the histogram's
// buckets, which add across messages.
type receiptCounts struct {
	Confirmed   int32           `json:"confirmed"`
	Opened      int32           `json:"opened"`
	Unconfirmed int32           `json:"unconfirmed"`
	SkewMs      *skewSummary    `json:"skew_ms"`
	Histogram   []skewBucketOut `json:"histogram"`
}

// skewBucketOut is one of a histogram's buckets that holds deliveries:
// bucket k (1 to 194) holds skews up to upper_ms (and from the previous
// bucket's).
type skewBucketOut struct {
	Bucket  int     `json:"bucket"`
	UpperMs float64 `json:"upper_ms"`
	Count   int32   `json:"count"`
}

// newReceiptCounts reads a message row's receipt figures. early is how many
// of its delivered receipts are for deliveries the ledger does not have as
// accepted (db.EarlyUnaccepted): counted as confirmed, but not among the
// accepted ones they confirm.
func newReceiptCounts(m db.Message, early int32) receiptCounts {
	rc := receiptCounts{
		Confirmed: m.ConfirmedCount, Opened: m.OpenedCount,
		Unconfirmed: max(m.AcceptedCount-(m.ConfirmedCount-early), 0),
		SkewMs:      liveSkew(m.ConfirmedHistogram),
		Histogram:   []skewBucketOut{},
	}
	for i, n := range m.ConfirmedHistogram {
		if n != 0 {
			rc.Histogram = append(rc.Histogram, skewBucketOut{Bucket: i + 1, UpperMs: bucketUpper(i + 1), Count: n})
		}
	}
	return rc
}

// earlyReceipts reads db.EarlyUnaccepted for messages, by message id.
func earlyReceipts(ctx context.Context, q *db.Queries, messages ...int64) (map[int64]int32, error) {
	rows, err := q.EarlyUnaccepted(ctx, messages)
	if err != nil {
		return nil, fmt.Errorf("count early receipts: %w", err)
	}
	out := make(map[int64]int32, len(rows))
	for _, r := range rows {
		out[r.MessageID] = r.Receipts
	}
	return out, nil
}

func newMessageStatus(m db.Message, payload json.RawMessage, early, held int32) messageStatus {
	st := messageStatus{
		Payload:     payload,
		messageHead: messageHead{Receipt: jobs.NewReceipt(m), Category: m.Category, QuietHours: m.QuietHours},
		CreatedAt:   m.CreatedAt.UTC(),
		StartedAt:   utcPtr(m.StartedAt),
		SettledAt:   utcPtr(m.SettledAt),
		Deliveries:  countsOf(m, held),
		SLOSkewMs:   m.SloSkewMs,
		Receipts:    newReceiptCounts(m, early),
	}
	if m.ScheduleID != nil {
		id := formatScheduleID(*m.ScheduleID)
		st.ScheduleID = &id
	}
	var audience jobs.Audience
	if json.Unmarshal(m.Audience, &audience) == nil {
		st.Apps = audience.Apps
	}
	if m.SkewMaxMs != nil {
		st.SkewMs = &skewSummary{P50: *m.SkewP50Ms, P95: *m.SkewP95Ms, P99: *m.SkewP99Ms, Max: *m.SkewMaxMs}
	} else {
		st.SkewMs = liveSkew(m.SkewHistogram)
	}
	return st
}

// liveSkew is the skew of a message being sent, from the histogram of its
// accepted deliveries' skews that every result write adds to (migration
// 0010): each figure is the upper end of the 10%-wide bucket it falls in,
// so it is at most 10% (or, under 1 ms, 1 ms) above the exact value, which
// is stored once the message settles. Nil while nothing is accepted.
func liveSkew(histogram []int32) *skewSummary {
	var total int64
	for _, n := range histogram {
		total += int64(n)
	}
	if total == 0 {
		return nil
	}
	upper := bucketUpper
	percentile := func(p float64) float64 {
		rank := max(int64(math.Ceil(p*float64(total))), 1)
		var seen int64
		for i, n := range histogram {
			if seen += int64(n); seen >= rank {
				return upper(i + 1)
			}
		}
		return upper(len(histogram))
	}
	return &skewSummary{P50: percentile(0.5), P95: percentile(0.95), P99: percentile(0.99), Max: percentile(1)}
}

// bucketUpper is the top of a skew histogram's bucket k (1-based): 1 ms for
// bucket 1, then 1.1^(k-1) ms.
func bucketUpper(k int) float64 {
	if k == 1 {
		return 1
	}
	return round1(math.Pow(1.1, float64(k-1)))
}

// getMessage reads one message row, and a local-time message's waves.
func (s *Server) getMessage(c echo.Context) error {
	ctx := c.Request().Context()
	q := db.On(s.pool)
	m, err := readMessage(c, q)
	if err != nil {
		return err
	}
	id := m.ID
	payloads, err := payloadsOf(ctx, q, m.PayloadID)
	if err != nil {
		return err
	}
	early, err := earlyReceipts(ctx, q, id)
	if err != nil {
		return err
	}
	held, err := heldNow(ctx, q, m)
	if err != nil {
		return err
	}
	st := newMessageStatus(m, payloads[m.PayloadID], early[id], held[id])
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
	return fromPath(c, "message_id", "message", messageID, q.GetMessage)
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
		held, err := heldNow(ctx, db.On(tx), m)
		if err != nil {
			return err
		}
		return &Error{Status: http.StatusConflict, Code: "already_dispatching",
			Message: fmt.Sprintf("message %s is %s; deliveries may have been made", raw, m.State),
			Extra:   map[string]any{"state": m.State, "deliveries": countsOf(m, held[id])}}
	})
	if err != nil {
		return err
	}
	return c.NoContent(http.StatusNoContent)
}

var deliveryStatuses = map[string]bool{"pending": true, "accepted": true, "failed": true, "expired": true, "cancelled": true}

// deliveryReasons are the reasons a delivery may be given (openapi.yaml's
// Reason, which a test holds this to), by which its message's listing may
// be filtered.
var deliveryReasons = []push.Reason{
	push.ReasonUnregistered, push.ReasonBadToken, push.ReasonPayloadRejected, push.ReasonRateLimited,
	push.ReasonProviderUnavailable, push.ReasonChannelDisabled, push.ReasonInternal, push.ReasonEndpointForbidden,
	push.ReasonWrongEnvironment, push.ReasonDeviceMoved, push.ReasonDeviceDeleted, push.ReasonDeviceEvicted,
	push.ReasonDeviceReplaced, push.ReasonCredentialsRefused, push.ReasonWrongApp,
	push.ReasonOptedOut, push.ReasonQuietHours, push.ReasonCapped,
}

type deliveryItem struct {
	UserID   string `json:"user_id"`
	DeviceID string `json:"device_id"`
	// App is the device's app; null when the device was deleted since.
	App         *string    `json:"app"`
	Channel     string     `json:"channel"`
	Status      string     `json:"status"`
	Reason      *string    `json:"reason"`
	AttemptedAt *time.Time `json:"attempted_at"`
	AcceptedAt  *time.Time `json:"accepted_at"`
	SkewMs      *float64   `json:"skew_ms"`
	// The delivery's receipts: when Herald received its delivered and
	// opened receipts, the device's clock then, and the confirmed skew.
	ConfirmedAt       *time.Time `json:"confirmed_at"`
	ConfirmedDeviceAt *time.Time `json:"confirmed_device_at"`
	ConfirmedSkewMs   *float64   `json:"confirmed_skew_ms"`
	OpenedAt          *time.Time `json:"opened_at"`
	OpenedDeviceAt    *time.Time `json:"opened_device_at"`
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
	q := db.On(s.pool)
	m, err := readMessage(c, q)
	if err != nil {
		return err
	}
	status := c.QueryParam("status")
	if status != "" && !deliveryStatuses[status] {
		return invalid("status", "status %q is not one of pending, accepted, failed, expired, cancelled", status)
	}
	reason := c.QueryParam("reason")
	if reason != "" && !slices.Contains(deliveryReasons, push.Reason(reason)) {
		return invalid("reason", "reason %q is no delivery's reason", reason)
	}
	confirmed := c.QueryParam("confirmed")
	if confirmed != "" && confirmed != "true" && confirmed != "false" {
		return invalid("confirmed", "confirmed %q is not true or false", confirmed)
	}
	ix, err := apps.ReadIndex(ctx, s.pool)
	if err != nil {
		return err
	}
	names := ix.ByID
	var appID *int32
	if app := c.QueryParam("app"); app != "" {
		id, ok := ix.ByName[app]
		if !ok {
			return invalid("app", "no app is named %q", app)
		}
		appID = &id
	}
	filter := "deliveries:" + c.Param("message_id") + ":" + status
	if reason != "" {
		filter += ":reason=" + reason
	}
	if confirmed != "" {
		filter += ":confirmed=" + confirmed
	}
	if appID != nil {
		filter += ":app=" + strconv.Itoa(int(*appID))
	}
	pg, err := readPage(c, filter)
	if err != nil {
		return err
	}
	params := db.ListDeliveriesParams{MessageID: m.ID, AfterDeviceID: pg.afterOr(0), PageSize: pg.fetch()}
	if status != "" {
		params.Status = &status
	}
	if reason != "" {
		params.Reason = &reason
	}
	if confirmed != "" {
		want := confirmed == "true"
		params.Confirmed = &want
	}
	params.AppID = appID
	rows, err := q.ListAllDeliveries(ctx, params)
	if err != nil {
		return fmt.Errorf("list deliveries: %w", err)
	}
	rows, next := paginate(pg, rows, func(r db.ListDeliveriesRow) int64 { return r.DeviceID })
	page := deliveryPage{Items: make([]deliveryItem, 0, len(rows)), NextCursor: next}
	for _, r := range rows {
		item := deliveryItem{
			UserID: r.UserID, DeviceID: formatDeviceID(r.DeviceID), Channel: r.Channel, Status: r.Status,
			Reason: r.Reason, AttemptedAt: utcPtr(r.AttemptedAt), AcceptedAt: utcPtr(r.AcceptedAt),
			ConfirmedAt: utcPtr(r.ConfirmedAt), ConfirmedDeviceAt: utcPtr(r.ConfirmedDeviceAt),
			OpenedAt: utcPtr(r.OpenedAt), OpenedDeviceAt: utcPtr(r.OpenedDeviceAt),
		}
		if name, ok := names[r.AppID]; ok {
			item.App = &name
		}
		if r.ConfirmedSkewMs != nil {
			skew := round1(*r.ConfirmedSkewMs)
			item.ConfirmedSkewMs = &skew
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
	payloadIDs := make([]int64, len(rows))
	for i, m := range rows {
		payloadIDs[i] = m.PayloadID
	}
	payloads, err := payloadsOf(ctx, db.On(s.pool), payloadIDs...)
	if err != nil {
		return err
	}
	ids := make([]int64, len(rows))
	for i, m := range rows {
		ids[i] = m.ID
	}
	early, err := earlyReceipts(ctx, db.On(s.pool), ids...)
	if err != nil {
		return err
	}
	held, err := heldNow(ctx, db.On(s.pool), rows...)
	if err != nil {
		return err
	}
	page := messagePage{Items: make([]json.RawMessage, 0, len(rows)), NextCursor: next}
	for _, m := range rows {
		if item, ok := s.listed(c, "message_id", push.FormatMessageID(m.ID), newMessageStatus(m, payloads[m.PayloadID], early[m.ID], held[m.ID]), nil); ok {
			page.Items = append(page.Items, item)
		}
	}
	return c.JSON(http.StatusOK, page)
}

// round1 rounds milliseconds to a tenth, the precision skew is reported in.
func round1(f float64) float64 { return math.Round(f*10) / 10 }

// appCounts is one app's part of a message's deliveries.
type appCounts struct {
	// App is the devices' app; null for deliveries whose device was
	// deleted since.
	App        *string        `json:"app"`
	Deliveries deliveryCounts `json:"deliveries"`
}

type appCountsList struct {
	Items []appCounts `json:"items"`
}

// messageApps counts a message's deliveries app by app: its counters as
// GET /v1/messages/{id} gives them, cut by each device's app. Read from
// the ledger, so it costs a read of the message's deliveries.
func (s *Server) messageApps(c echo.Context) error {
	ctx := c.Request().Context()
	q := db.On(s.pool)
	m, err := readMessage(c, q)
	if err != nil {
		return err
	}
	rows, err := q.MessageAppCounts(ctx, m.ID)
	if err != nil {
		return fmt.Errorf("count deliveries by app: %w", err)
	}
	ix, err := apps.ReadIndex(ctx, s.pool)
	if err != nil {
		return err
	}
	names := ix.ByID
	byApp := map[int32]*appCounts{}
	out := appCountsList{Items: []appCounts{}}
	var order []int32
	for _, r := range rows {
		a := byApp[r.AppID]
		if a == nil {
			a = &appCounts{}
			if name, ok := names[r.AppID]; ok {
				a.App = &name
			}
			byApp[r.AppID] = a
			order = append(order, r.AppID)
		}
		n := int32(r.Deliveries)
		a.Deliveries.Total += n
		switch r.Status {
		case "accepted":
			a.Deliveries.Accepted += n
		case "failed":
			a.Deliveries.Failed += n
		case "expired":
			a.Deliveries.Expired += n
		case "cancelled":
			a.Deliveries.Cancelled += n
		default:
			a.Deliveries.Pending += n
		}
		// Withheld as the message's own counters count them: a delivery
		// held pending by quiet hours is held, one that ended with the
		// reason is opted out, capped or quiet hours.
		switch push.Reason(r.Withheld) {
		case push.ReasonOptedOut:
			a.Deliveries.OptedOut += n
		case push.ReasonCapped:
			a.Deliveries.Capped += n
		case push.ReasonQuietHours:
			if r.Status == "pending" {
				a.Deliveries.Held += n
			} else {
				a.Deliveries.QuietHours += n
			}
		}
	}
	for _, id := range order {
		out.Items = append(out.Items, *byApp[id])
	}
	return c.JSON(http.StatusOK, out)
}
