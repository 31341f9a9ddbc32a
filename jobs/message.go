package jobs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/heraldpush/herald/db"
	"github.com/heraldpush/herald/jobs/apps"
	"github.com/heraldpush/herald/jobs/preferences"
	"github.com/heraldpush/herald/jobs/push"
)

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
	// Category is the message's category (jobs/preferences); empty means
	// "default". QuietHours is what a delivery due in its user's quiet
	// hours gets: preferences.QuietHold (empty) or QuietSkip. Both are left
	// out of the canonical encoding when empty, so that an idempotency key
	// used before they existed still matches its message.
	Category   string `json:",omitempty"`
	QuietHours string `json:",omitempty"`
	// IdempotencyKey, when set, makes scheduling the same message again
	// with the same key a no-op that answers the first one's receipt, and
	// a different message with it ErrIdempotencyKeyReused.
	IdempotencyKey string `json:"-"`
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
	}.counted(m)
}

// counted is r with the audience's counts of m, the message it names: a
// message sent now has them whole only once its rest is written.
func (r Receipt) counted(m db.Message) Receipt {
	r.RecipientCount, r.DeviceCount, r.ChunkCount = m.RecipientCount, m.DeviceCount, m.ChunkCount
	return r
}

// Schedule checks m and schedules it in tx, idempotently within scope (the
// key space of one caller): the one way a message is made on request, by
// the API and by Scheduler.Schedule alike. A key that was used before with
// the same message answers that message's receipt and schedules nothing.
func (e *Enqueuer) Schedule(ctx context.Context, tx pgx.Tx, m Message, scope string) (Receipt, error) {
	receipt, _, err := e.schedule(ctx, tx, m, scope, false)
	return receipt, err
}

// schedule is Schedule; with split, a message due now may be written in
// two transactions (rest.go), and is then returned with its rest, for the
// caller to commit tx and write it.
func (e *Enqueuer) schedule(ctx context.Context, tx pgx.Tx, m Message, scope string, split bool) (Receipt, *restJob, error) {
	if err := m.check(); err != nil {
		return Receipt{}, nil, err
	}
	q := db.On(tx)
	if m.IdempotencyKey != "" {
		// The message's identity for idempotency is its canonical
		// encoding, its instants in UTC.
		canon := m
		canon.DispatchAt, canon.ExpiresAt = m.DispatchAt.UTC(), m.ExpiresAt.UTC()
		prior, err := ClaimIdempotencyKey(ctx, q, scope, m.IdempotencyKey, canon)
		if err != nil {
			return Receipt{}, nil, err
		}
		if prior != nil {
			var r Receipt
			if err := json.Unmarshal(prior, &r); err != nil {
				return Receipt{}, nil, fmt.Errorf("read idempotency key's receipt: %w", err)
			}
			if id, ok := push.ParseMessageID(r.MessageID); ok {
				// The first request may not have written its message's
				// rest yet: the receipt counts the whole audience.
				msg, err := e.writeRest(ctx, tx, id)
				if err != nil && !errors.Is(err, db.ErrNotFound) {
					return Receipt{}, nil, err
				}
				if err == nil {
					r = r.counted(msg)
				}
			}
			return r, nil, nil
		}
	}
	if len(m.Audience.Apps) > 0 {
		var bad *apps.InvalidError
		if _, err := apps.Resolve(ctx, tx, "audience.apps", m.Audience.Apps); errors.As(err, &bad) {
			return Receipt{}, nil, &InvalidError{Field: bad.Field, Message: bad.Problem, Err: err}
		} else if err != nil {
			return Receipt{}, nil, fmt.Errorf("read apps: %w", err)
		}
	}
	now, err := q.DatabaseNow(ctx)
	if err != nil {
		return Receipt{}, nil, fmt.Errorf("read clock: %w", err)
	}
	spec, err := m.spec(now)
	if err != nil {
		return Receipt{}, nil, err
	}
	msg, rest, err := e.create(ctx, tx, spec, split && !spec.DispatchAt.After(now.Add(sendNowWithin)))
	if errors.Is(err, ErrUnknownSegment) {
		return Receipt{}, nil, &InvalidError{Field: "audience.id", Message: fmt.Sprintf("segment %q does not exist", m.Audience.SegmentID), Err: err}
	}
	if err != nil {
		return Receipt{}, nil, fmt.Errorf("schedule message: %w", err)
	}
	receipt := NewReceipt(msg)
	if m.IdempotencyKey != "" {
		body, err := json.Marshal(receipt)
		if err != nil {
			return Receipt{}, nil, fmt.Errorf("encode receipt: %w", err)
		}
		if err := q.CompleteIdempotencyKey(ctx, db.CompleteIdempotencyKeyParams{
			Scope: scope, Key: m.IdempotencyKey, MessageID: &msg.ID, Response: body,
		}); err != nil {
			return Receipt{}, nil, fmt.Errorf("record idempotency key: %w", err)
		}
	}
	return receipt, rest, nil
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
	if m.Category != "" {
		if err := preferences.CheckCategory(m.Category); err != nil {
			return invalid("category", "category %q %s", m.Category, err)
		}
	}
	if m.QuietHours != "" {
		if err := preferences.CheckQuietMode(m.QuietHours); err != nil {
			return invalid("quiet_hours", "quiet_hours %q %s", m.QuietHours, err)
		}
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

// spec resolves m's defaults and instants against now, the database's
// clock, and checks them as they will be stored.
func (m Message) spec(now time.Time) (MessageSpec, error) {
	audience, err := json.Marshal(m.Audience)
	if err != nil {
		return MessageSpec{}, fmt.Errorf("encode audience: %w", err)
	}
	spec := MessageSpec{Priority: m.Priority, Audience: m.Audience, AudienceJSON: audience, Content: m.Payload,
		Category: m.Category, QuietHours: m.QuietHours}
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
