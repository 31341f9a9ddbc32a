package jobs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/heraldpush/herald/db"
	"github.com/heraldpush/herald/jobs/push"
)

// The rules of a message, the same for POST /v1/messages and for
// Scheduler.Schedule.
const (
	// MaxAudienceUsers caps an explicit list of users.
	MaxAudienceUsers = 10_000
	// DefaultLifetime is a message's lifetime when no expiry is given.
	DefaultLifetime = time.Hour
	// MaxLifetime is the longest a message may live: APNs, FCM and Web
	// Push services keep a push for at most four weeks, so a later expiry
	// would promise what none of them keeps.
	MaxLifetime = 28 * 24 * time.Hour
	// MaxIdempotencyKey is the longest idempotency key, in bytes.
	MaxIdempotencyKey = 255
	// maxIDLen bounds caller-chosen ids (users, segments).
	maxIDLen = 128
)

// InvalidError is a message that breaks a rule. Field names the one field to
// blame as POST /v1/messages' body names it (priority, audience.ids[3],
// payload.title, expires_at...), which Message's fields mirror.
type InvalidError struct {
	Field, Message string
	// Err is the cause, when there is one: ErrUnknownSegment, or a
	// *push.SizeError for a payload too large for the providers.
	Err error
}

func (e *InvalidError) Error() string { return e.Field + ": " + e.Message }
func (e *InvalidError) Unwrap() error { return e.Err }

func invalid(field, format string, args ...any) *InvalidError {
	return &InvalidError{Field: field, Message: fmt.Sprintf(format, args...)}
}

// Message is a message to schedule: Scheduler.Schedule takes it from Go
// code, and POST /v1/messages makes one of its body. Zero values take the
// defaults the API documents.
type Message struct {
	// Priority is PriorityUrgent or PriorityBulk; empty means bulk.
	Priority string
	// Audience is a segment or users by id, not both.
	Audience Audience
	// Payload needs a title, a body or data.
	Payload push.Content
	// DispatchAt is when to send; zero means now, by the database's clock.
	DispatchAt time.Time
	// ExpiresAt is when undelivered pushes are given up; zero means an
	// hour after DispatchAt, and at most MaxLifetime after it.
	ExpiresAt time.Time
	// Local, instead of DispatchAt and ExpiresAt, sends to each recipient
	// at a wall time in their own zone.
	Local *LocalDelivery
	// IdempotencyKey, when set, makes scheduling the same message again
	// with the same key a no-op that answers the first one's receipt, and
	// a different message with it ErrIdempotencyKeyReused.
	IdempotencyKey string `json:"-"`
}

// LocalDelivery is delivery at a wall time in each recipient's own zone
// (deliver_at_local in the API).
type LocalDelivery struct {
	// Wall is the date and wall time; its location is ignored.
	Wall time.Time
	// FallbackTimezone is the IANA zone of recipients without one; empty
	// means UTC.
	FallbackTimezone string
	// SendIfPassed sends at once to recipients whose wall time has passed
	// (if_passed send_now); otherwise their deliveries end expired.
	SendIfPassed bool
	// TTL is each wave's lifetime, whole seconds from one to MaxLifetime;
	// zero means DefaultLifetime.
	TTL time.Duration
}

// Audience is who a message is for: a segment, or users by id.
type Audience struct {
	SegmentID string
	UserIDs   []string
}

// MarshalJSON writes an audience as the API takes it, which is how a
// message shows it.
func (a Audience) MarshalJSON() ([]byte, error) {
	if a.SegmentID != "" {
		return json.Marshal(map[string]string{"type": "segment", "id": a.SegmentID})
	}
	return json.Marshal(map[string]any{"type": "users", "ids": a.UserIDs})
}

// Receipt is what scheduling a message answers (and the body of the API's
// 202): its id, state, instants and size.
type Receipt struct {
	MessageID      string    `json:"message_id"`
	State          string    `json:"state"`
	DispatchAt     time.Time `json:"dispatch_at"`
	ExpiresAt      time.Time `json:"expires_at"`
	Priority       string    `json:"priority"`
	RecipientCount int32     `json:"recipient_count"`
	DeviceCount    int32     `json:"device_count"`
	ChunkCount     int32     `json:"chunk_count"`
}

// NewReceipt is a stored message's receipt.
func NewReceipt(m db.Message) Receipt {
	return Receipt{
		MessageID: push.FormatMessageID(m.ID), State: m.State,
		DispatchAt: m.DispatchAt.UTC(), ExpiresAt: m.ExpiresAt.UTC(), Priority: m.Priority,
		RecipientCount: m.RecipientCount, DeviceCount: m.DeviceCount, ChunkCount: m.ChunkCount,
	}
}

// Schedule checks m and schedules it in tx, idempotently within scope (the
// key space of one caller): the one way a message is made on request, by
// the API and by Scheduler.Schedule alike. A key that was used before with
// the same message answers that message's receipt and schedules nothing.
func (e *Enqueuer) Schedule(ctx context.Context, tx pgx.Tx, m Message, scope string) (Receipt, error) {
	if err := m.check(); err != nil {
		return Receipt{}, err
	}
	q := db.On(tx)
	if m.IdempotencyKey != "" {
		// The message's identity for idempotency is its canonical
		// encoding, its instants in UTC.
		canon := m
		canon.DispatchAt, canon.ExpiresAt = m.DispatchAt.UTC(), m.ExpiresAt.UTC()
		prior, err := ClaimIdempotencyKey(ctx, q, scope, m.IdempotencyKey, canon)
		if err != nil {
			return Receipt{}, err
		}
		if prior != nil {
			var r Receipt
			if err := json.Unmarshal(prior, &r); err != nil {
				return Receipt{}, fmt.Errorf("read idempotency key's receipt: %w", err)
			}
			return r, nil
		}
	}
	now, err := q.DatabaseNow(ctx)
	if err != nil {
		return Receipt{}, fmt.Errorf("read clock: %w", err)
	}
	spec, err := m.spec(now)
	if err != nil {
		return Receipt{}, err
	}
	msg, err := e.Create(ctx, tx, spec)
	if errors.Is(err, ErrUnknownSegment) {
		return Receipt{}, &InvalidError{Field: "audience.id", Message: fmt.Sprintf("segment %q does not exist", m.Audience.SegmentID), Err: err}
	}
	if err != nil {
		return Receipt{}, fmt.Errorf("schedule message: %w", err)
	}
	receipt := NewReceipt(msg)
	if m.IdempotencyKey != "" {
		body, err := json.Marshal(receipt)
		if err != nil {
			return Receipt{}, fmt.Errorf("encode receipt: %w", err)
		}
		if err := q.CompleteIdempotencyKey(ctx, db.CompleteIdempotencyKeyParams{
			Scope: scope, Key: m.IdempotencyKey, MessageID: &msg.ID, Response: body,
		}); err != nil {
			return Receipt{}, fmt.Errorf("record idempotency key: %w", err)
		}
	}
	return receipt, nil
}

// check applies the rules that need no clock, filling in the priority's
// default.
func (m *Message) check() error {
	switch m.Priority {
	case "":
		m.Priority = PriorityBulk
	case PriorityUrgent, PriorityBulk:
	default:
		return invalid("priority", "priority %q is not urgent or bulk", m.Priority)
	}
	if err := CheckAudience(m.Audience); err != nil {
		return err
	}
	if err := CheckPayload(&m.Payload); err != nil {
		return err
	}
	if len(m.IdempotencyKey) > MaxIdempotencyKey {
		return invalid("idempotency_key", "the idempotency key is longer than %d bytes", MaxIdempotencyKey)
	}
	if err := CheckText("idempotency_key", m.IdempotencyKey); err != nil {
		return err
	}
	if m.Local == nil {
		// The range alone, which the canonical encoding needs; the rest
		// needs the clock (instants).
		if !m.DispatchAt.IsZero() {
			if err := CheckInstant("dispatch_at", m.DispatchAt); err != nil {
				return err
			}
		}
		if !m.ExpiresAt.IsZero() {
			return CheckInstant("expires_at", m.ExpiresAt)
		}
		return nil
	}
	if !m.DispatchAt.IsZero() {
		return invalid("deliver_at_local", "give dispatch_at or deliver_at_local, not both")
	}
	if !m.ExpiresAt.IsZero() {
		return invalid("expires_at", "a local-time message has a lifetime per wave: give ttl_seconds instead of expires_at")
	}
	return m.Local.check()
}

// CheckAudience checks an audience: a segment's id, or 1 to
// MaxAudienceUsers user ids.
func CheckAudience(a Audience) error {
	if a.SegmentID != "" {
		if len(a.UserIDs) > 0 {
			return invalid("audience", "an audience is a segment or users, not both")
		}
		return CheckID("audience.id", a.SegmentID)
	}
	if len(a.UserIDs) == 0 || len(a.UserIDs) > MaxAudienceUsers {
		return invalid("audience.ids", "audience.ids must hold 1 to %d user ids, not %d", MaxAudienceUsers, len(a.UserIDs))
	}
	for i, id := range a.UserIDs {
		if err := CheckID(fmt.Sprintf("audience.ids[%d]", i), id); err != nil {
			return err
		}
	}
	return nil
}

// maxTTLSeconds is the longest ttl_seconds.
const maxTTLSeconds = int(MaxLifetime / time.Second)

func (l *LocalDelivery) check() error {
	if l.FallbackTimezone == "" {
		l.FallbackTimezone = "UTC"
	}
	if err := CheckTimezone("fallback_timezone", l.FallbackTimezone); err != nil {
		return err
	}
	if l.TTL == 0 {
		l.TTL = DefaultLifetime
	}
	if l.TTL < time.Second || l.TTL > MaxLifetime || l.TTL%time.Second != 0 {
		return invalid("ttl_seconds", "ttl_seconds must be from 1 to %d", maxTTLSeconds)
	}
	l.Wall = time.Date(l.Wall.Year(), l.Wall.Month(), l.Wall.Day(), l.Wall.Hour(), l.Wall.Minute(), l.Wall.Second(), 0, time.UTC)
	// Every zone's wave and its lifetime must fall within the instants
	// Herald stores, whoever turns out to be in the audience.
	if first, last := LocalWindow(l.Wall, l.TTL); !InstantInRange(first) || !InstantInRange(last) {
		earliest := EarliestInstant.Add(first.Sub(l.Wall).Abs())
		latest := LatestInstant.Add(-last.Sub(l.Wall)).Truncate(time.Minute)
		return invalid("deliver_at_local", "deliver_at_local must be from %s to %s, so that every zone's wave and its lifetime lie in years 1970 to 9999 UTC",
			earliest.Format(WallLayout), latest.Format(WallLayout))
	}
	return nil
}

// WallLayout is how a wall time is written (deliver_at_local); seconds may
// follow.
const WallLayout = "2006-01-02T15:04"

// spec resolves m's defaults and instants against now, the database's
// clock, and checks them as they will be stored.
func (m Message) spec(now time.Time) (MessageSpec, error) {
	audience, err := json.Marshal(m.Audience)
	if err != nil {
		return MessageSpec{}, fmt.Errorf("encode audience: %w", err)
	}
	spec := MessageSpec{Priority: m.Priority, Audience: m.Audience, AudienceJSON: audience, Content: m.Payload}
	if l := m.Local; l != nil {
		wall := l.Wall.Format(WallLayout)
		if l.Wall.Second() != 0 {
			wall = l.Wall.Format(WallLayout + ":05")
		}
		ifPassed := "skip"
		if l.SendIfPassed {
			ifPassed = "send_now"
		}
		local, err := json.Marshal(map[string]any{
			"deliver_at_local": wall, "fallback_timezone": l.FallbackTimezone, "if_passed": ifPassed,
			"ttl_seconds": int(l.TTL / time.Second),
		})
		if err != nil {
			return MessageSpec{}, fmt.Errorf("encode local time: %w", err)
		}
		fallback, _ := time.LoadLocation(l.FallbackTimezone)
		spec.DispatchAt, spec.ExpiresAt = now, now.Add(l.TTL)
		spec.LocalTime = &LocalTime{Wall: l.Wall, Fallback: fallback, SendNow: l.SendIfPassed, Now: now, Lifetime: l.TTL, JSON: local}
		return spec, nil
	}
	spec.DispatchAt, spec.ExpiresAt, err = m.instants(now)
	return spec, err
}

// instants applies the defaults of DispatchAt (now) and ExpiresAt (an hour
// after DispatchAt) and checks the result as it will be stored: both in
// years 1970 to 9999, ExpiresAt after DispatchAt but at most MaxLifetime
// after it, and not yet passed.
func (m Message) instants(now time.Time) (dispatchAt, expiresAt time.Time, err error) {
	dispatchAt = now
	if !m.DispatchAt.IsZero() {
		dispatchAt = m.DispatchAt
	}
	if err := CheckInstant("dispatch_at", dispatchAt); err != nil {
		return dispatchAt, expiresAt, err
	}
	if m.ExpiresAt.IsZero() {
		expiresAt = dispatchAt.Add(DefaultLifetime)
		if !InstantInRange(expiresAt) {
			return dispatchAt, expiresAt, invalid("expires_at", "expires_at defaults to an hour after dispatch_at, %s, which is past year 9999: give an expires_at by 9999-12-31T23:59:59Z", expiresAt.UTC().Format(time.RFC3339))
		}
	} else {
		expiresAt = m.ExpiresAt
		if err := CheckInstant("expires_at", expiresAt); err != nil {
			return dispatchAt, expiresAt, err
		}
	}
	switch {
	case !expiresAt.After(dispatchAt):
		return dispatchAt, expiresAt, invalid("expires_at", "expires_at must be after dispatch_at")
	case expiresAt.Sub(dispatchAt) > MaxLifetime:
		return dispatchAt, expiresAt, invalid("expires_at", "expires_at must be at most 28 days (%d seconds) after dispatch_at, the longest the push providers keep a push", maxTTLSeconds)
	case !expiresAt.After(now):
		return dispatchAt, expiresAt, invalid("expires_at", "the message would expire at %s, which has passed", expiresAt.UTC().Format(time.RFC3339))
	}
	return dispatchAt, expiresAt, nil
}

// CheckInstant refuses an instant outside the years Herald stores
// (InstantInRange). An offset can carry a timestamp written in year 9999
// into year 10000, so the bound is on the instant, not the text.
func CheckInstant(field string, t time.Time) error {
	if !InstantInRange(t) {
		return invalid(field, "%s is %s, outside the years 1970 to 9999 UTC that Herald stores and shows", field, t.UTC().Format(time.RFC3339))
	}
	return nil
}

// CheckPayload checks a message's content: something to show or deliver,
// no reserved data key, and a size every provider takes.
func CheckPayload(p *push.Content) error {
	if err := checkPayloadFields(p); err != nil {
		return err
	}
	if err := checkLocalizations(p); err != nil {
		return err
	}
	// Over HTTP the body was checked whole; a Go caller's strings are
	// checked here, each by its field.
	for field, v := range payloadTexts(p) {
		if err := CheckText("payload."+field, v); err != nil {
			return err
		}
	}
	for k, v := range p.Data {
		if err := CheckText("payload.data", k); err != nil {
			return err
		}
		if err := CheckText("payload.data."+k, v); err != nil {
			return err
		}
	}
	var sizeErr *push.SizeError
	if err := push.CheckSizes(*p); errors.As(err, &sizeErr) {
		field := "payload"
		if sizeErr.Locale != "" {
			field = "payload.localizations." + sizeErr.Locale
		}
		return &InvalidError{Field: field, Message: sizeErr.Error(), Err: sizeErr}
	} else if err != nil {
		return invalid("payload", "payload cannot be encoded: %v", err)
	}
	return nil
}

// CheckText refuses a string PostgreSQL cannot store: one that is not UTF-8,
// or holds the NUL character.
func CheckText(field, s string) error {
	if !utf8.ValidString(s) || strings.ContainsRune(s, 0) {
		return invalid(field, "%s must be UTF-8 without the NUL character", field)
	}
	return nil
}

// CheckID validates a caller-chosen id (a user's, a segment's): 1 to 128
// characters from a set that is safe in a URL path without escaping.
func CheckID(field, id string) error {
	if id == "" {
		return invalid(field, "%s is required", field)
	}
	if len(id) > maxIDLen {
		return invalid(field, "%s is longer than %d characters", field, maxIDLen)
	}
	for _, r := range id {
		ok := r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' ||
			strings.ContainsRune("_-.:@+=", r)
		if !ok {
			return invalid(field, "%s may hold only letters, digits and _-.:@+= (found %q)", field, r)
		}
	}
	return nil
}

// CheckTimezone validates an IANA zone name. The binary embeds the zone
// database, so the answer does not depend on the host.
func CheckTimezone(field, name string) error {
	// LoadLocation reads "" as UTC and "Local" as the host's zone; neither is
	// a zone a caller can mean.
	if name == "" || name == "Local" {
		return invalid(field, "%s must be an IANA time zone name such as Europe/Berlin", field)
	}
	if _, err := time.LoadLocation(name); err != nil {
		return invalid(field, "%s %q is not a known IANA time zone", field, name)
	}
	return nil
}
