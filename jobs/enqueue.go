package jobs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"

	"github.com/heraldpush/herald/db"
	"github.com/heraldpush/herald/jobs/push"
)

// ErrUnknownSegment is returned when an audience names a segment that does
// not exist.
var ErrUnknownSegment = errors.New("unknown segment")

// MessageSpec is a message to schedule, validated by the caller.
type MessageSpec struct {
	Priority   string
	DispatchAt time.Time
	ExpiresAt  time.Time
	Audience   Audience
	// AudienceJSON is the audience as the caller gave it, kept for display.
	AudienceJSON []byte
	Content      push.Content
	// PayloadID reuses a stored payload (a schedule's, for each of its
	// runs) instead of storing Content again.
	PayloadID int64
	// LocalTime, when set, sends to each recipient at a wall time in their
	// own zone instead of at DispatchAt; DispatchAt is then filled in from
	// the earliest wave and ExpiresAt from the latest wave's expiry.
	LocalTime *LocalTime
	// ScheduleID and ScheduleRunAt tie a message to the schedule run that
	// made it.
	ScheduleID    *int64
	ScheduleRunAt *time.Time
}

// LocalTime is per-recipient local-time delivery: each device is due when
// its user's clocks show Wall.
type LocalTime struct {
	// Wall is the wall time, as a time in UTC (its zone is ignored).
	Wall time.Time
	// Fallback is the zone of users without one.
	Fallback *time.Location
	// SendNow sends at Now to users whose Wall has passed; otherwise
	// (if_passed skip) their deliveries end expired.
	SendNow bool
	// Now is the database's time when the message was made.
	Now time.Time
	// Lifetime is each wave's time to live.
	Lifetime time.Duration
	// JSON is the request's local-time part, kept on the message.
	JSON []byte
}

// jobClient is the part of the River client that enqueues and cancels
// jobs in a caller's transaction.
type jobClient interface {
	InsertManyTx(ctx context.Context, tx pgx.Tx, params []river.InsertManyParams) ([]*rivertype.JobInsertResult, error)
	JobCancelTx(ctx context.Context, tx pgx.Tx, jobID int64) (*rivertype.JobRow, error)
}

// Enqueuer schedules messages and cancels them before they start:
// everything that can be done before the dispatch second is done here,
// inside the caller's transaction.
type Enqueuer struct {
	client    jobClient
	chunkSize int
}

// NewEnqueuer returns an Enqueuer that inserts and cancels chunk jobs with
// client (the River client) and cuts chunks of chunkSize devices
// (DefaultChunkSize when zero).
func NewEnqueuer(client jobClient, chunkSize int) *Enqueuer {
	if chunkSize <= 0 {
		chunkSize = DefaultChunkSize
	}
	return &Enqueuer{client: client, chunkSize: chunkSize}
}

// target is a resolved device with the instant it is due.
type target struct {
	Target
	userID   string
	timezone string
	locale   string
	dueAt    time.Time
}

// Create resolves m's audience to active devices, stores the payload once,
// the message, one pending ledger row per device (COPY), and one chunk job
// per chunk (scheduled at its due time), all in tx. Nothing is visible until
// the caller commits, and nothing is kept if it rolls back.
func (e *Enqueuer) Create(ctx context.Context, tx pgx.Tx, m MessageSpec) (db.Message, error) {
	q := db.On(tx)
	all, err := resolve(ctx, q, m.Audience, m.DispatchAt)
	if err != nil {
		return db.Message{}, err
	}
	if err := localize(ctx, q, m, all); err != nil {
		return db.Message{}, err
	}
	targets, passed := all, []target(nil)
	// Each chunk lives as long after its due instant as the message does
	// after dispatch_at, or a local-time wave's lifetime.
	lifetime := m.ExpiresAt.Sub(m.DispatchAt)
	var localJSON []byte
	if lt := m.LocalTime; lt != nil {
		targets, passed, err = lt.place(all)
		if err != nil {
			return db.Message{}, err
		}
		lifetime = lt.Lifetime
		// The message lasts until its last wave expires: an expires_at of
		// the first wave's would say it was over while later waves were
		// still to be sent.
		m.DispatchAt = lt.firstWave(targets, passed)
		m.ExpiresAt = lt.lastWave(targets, passed).Add(lifetime)
		localJSON = lt.JSON
	}
	payloadID, err := storePayload(ctx, q, m)
	if err != nil {
		return db.Message{}, err
	}

	chunks := cut(targets, e.chunkSize)
	params := db.InsertMessageParams{
		State:          StateScheduled,
		Priority:       m.Priority,
		DispatchAt:     m.DispatchAt,
		ExpiresAt:      m.ExpiresAt,
		PayloadID:      payloadID,
		Audience:       m.AudienceJSON,
		LocalTime:      localJSON,
		RecipientCount: int32(countUsers(all)),
		DeviceCount:    int32(len(all)),
		ChunkCount:     int32(len(chunks)),
		PendingCount:   int32(len(targets)),
		ExpiredCount:   int32(len(passed)),
		ScheduleID:     m.ScheduleID,
		ScheduleRunAt:  m.ScheduleRunAt,
	}
	if len(targets) == 0 {
		// Nothing to send: the message is settled the moment it exists,
		// expired if every recipient's time had passed.
		now, err := q.DatabaseNow(ctx)
		if err != nil {
			return db.Message{}, fmt.Errorf("read clock: %w", err)
		}
		params.State, params.SettledAt = StateDispatched, &now
		if len(passed) > 0 {
			params.State = StateExpired
		}
	}
	msg, err := q.InsertMessage(ctx, params)
	if err != nil {
		return db.Message{}, fmt.Errorf("store message: %w", err)
	}
	ledger := make([]db.InsertDeliveriesParams, 0, len(all))
	for _, t := range passed {
		ledger = append(ledger, db.InsertDeliveriesParams{
			MessageID: msg.ID, DeviceID: t.DeviceID, UserID: t.userID,
			Channel: t.Channel, Chunk: -1, DueAt: t.dueAt, Status: "expired",
		})
	}
	if len(targets) == 0 {
		if _, err := q.InsertDeliveries(ctx, ledger); err != nil {
			return db.Message{}, fmt.Errorf("write ledger: %w", err)
		}
		return msg, nil
	}

	jobs := make([]river.InsertManyParams, len(chunks))
	for i, c := range chunks {
		args := FanOutArgs{
			MessageID:  msg.ID,
			Chunk:      i,
			PayloadID:  payloadID,
			Priority:   m.Priority,
			DispatchAt: c.dueAt,
			ExpiresAt:  c.dueAt.Add(lifetime),
			Targets:    make([]Target, len(c.targets)),
		}
		for j, t := range c.targets {
			args.Targets[j] = t.Target
			ledger = append(ledger, db.InsertDeliveriesParams{
				MessageID: msg.ID, DeviceID: t.DeviceID, UserID: t.userID,
				Channel: t.Channel, Chunk: int32(i), DueAt: t.dueAt, Status: "pending",
			})
		}
		jobs[i] = river.InsertManyParams{Args: args, InsertOpts: &river.InsertOpts{ScheduledAt: c.dueAt}}
	}
	if _, err := q.InsertDeliveries(ctx, ledger); err != nil {
		return db.Message{}, fmt.Errorf("write ledger: %w", err)
	}
	results, err := e.client.InsertManyTx(ctx, tx, jobs)
	if err != nil {
		return db.Message{}, fmt.Errorf("enqueue chunks: %w", err)
	}
	chunkParams := db.InsertMessageChunksParams{
		MessageID:    msg.ID,
		Chunks:       make([]int32, len(chunks)),
		JobIds:       make([]int64, len(chunks)),
		DueAts:       make([]time.Time, len(chunks)),
		DeviceCounts: make([]int32, len(chunks)),
	}
	for i, c := range chunks {
		chunkParams.Chunks[i] = int32(i)
		chunkParams.JobIds[i] = results[i].Job.ID
		chunkParams.DueAts[i] = c.dueAt
		chunkParams.DeviceCounts[i] = int32(len(c.targets))
	}
	if err := q.InsertMessageChunks(ctx, chunkParams); err != nil {
		return db.Message{}, fmt.Errorf("record chunks: %w", err)
	}
	return msg, nil
}

// Cancel cancels message id in tx if no chunk of it has started: its
// pending deliveries and its chunk jobs are cancelled with it. It reports
// false, changing nothing, when the message is not (or no longer)
// scheduled; CancelMessage's state guard makes the race with the first
// chunk resolve one way.
func (e *Enqueuer) Cancel(ctx context.Context, tx pgx.Tx, id int64) (bool, error) {
	q := db.On(tx)
	if _, err := q.CancelMessage(ctx, id); err != nil {
		if errors.Is(err, db.ErrNotFound) {
			return false, nil
		}
		return false, fmt.Errorf("cancel message: %w", err)
	}
	if _, err := q.CancelPendingDeliveries(ctx, id); err != nil {
		return false, fmt.Errorf("cancel deliveries: %w", err)
	}
	jobIDs, err := q.MessageChunkJobs(ctx, id)
	if err != nil {
		return false, fmt.Errorf("find chunk jobs: %w", err)
	}
	for _, jobID := range jobIDs {
		if _, err := e.client.JobCancelTx(ctx, tx, jobID); err != nil {
			return false, fmt.Errorf("cancel chunk job %d: %w", jobID, err)
		}
	}
	return true, nil
}

// CancelUnstartedRuns cancels, in tx, every message a schedule made whose
// first chunk has not started; its runs that are under way finish.
func (e *Enqueuer) CancelUnstartedRuns(ctx context.Context, tx pgx.Tx, scheduleID int64) error {
	ids, err := db.On(tx).UnstartedRuns(ctx, &scheduleID)
	if err != nil {
		return fmt.Errorf("find unstarted runs: %w", err)
	}
	for _, id := range ids {
		if _, err := e.Cancel(ctx, tx, id); err != nil {
			return err
		}
	}
	return nil
}

// storePayload stores m's content, unless m reuses a stored payload.
func storePayload(ctx context.Context, q *db.Queries, m MessageSpec) (int64, error) {
	if m.PayloadID != 0 {
		return m.PayloadID, nil
	}
	content, err := json.Marshal(m.Content)
	if err != nil {
		return 0, fmt.Errorf("encode payload: %w", err)
	}
	id, err := q.InsertPayload(ctx, content)
	if err != nil {
		return 0, fmt.Errorf("store payload: %w", err)
	}
	return id, nil
}

// RecordMissed stores m as a message that expired before it could be made:
// a schedule run whose whole lifetime passed while no Herald was running. It
// is kept so that the run's history tells the truth, and nothing is sent.
func (e *Enqueuer) RecordMissed(ctx context.Context, tx pgx.Tx, m MessageSpec) (db.Message, error) {
	q := db.On(tx)
	payloadID, err := storePayload(ctx, q, m)
	if err != nil {
		return db.Message{}, err
	}
	now, err := q.DatabaseNow(ctx)
	if err != nil {
		return db.Message{}, fmt.Errorf("read clock: %w", err)
	}
	msg, err := q.InsertMessage(ctx, db.InsertMessageParams{
		State: StateExpired, Priority: m.Priority, DispatchAt: m.DispatchAt, ExpiresAt: m.ExpiresAt,
		PayloadID: payloadID, Audience: m.AudienceJSON, ScheduleID: m.ScheduleID, ScheduleRunAt: m.ScheduleRunAt,
		SettledAt: &now,
	})
	if err != nil {
		return db.Message{}, fmt.Errorf("store missed run: %w", err)
	}
	return msg, nil
}

// place gives each target its due instant, its user's zone's Wall, and
// splits off those whose time has passed (unless SendNow, which makes them
// due now).
func (lt *LocalTime) place(all []target) (due, passed []target, err error) {
	zones := map[string]*time.Location{}
	wall := time.Date(lt.Wall.Year(), lt.Wall.Month(), lt.Wall.Day(), lt.Wall.Hour(), lt.Wall.Minute(), lt.Wall.Second(), 0, time.UTC)
	for _, t := range all {
		loc := lt.Fallback
		if t.timezone != "" {
			if loc = zones[t.timezone]; loc == nil {
				if loc, err = time.LoadLocation(t.timezone); err != nil {
					return nil, nil, fmt.Errorf("user %s's zone %q: %w", t.userID, t.timezone, err)
				}
				zones[t.timezone] = loc
			}
		}
		t.dueAt = instantOf(wall, loc)
		if t.dueAt.Before(lt.Now) {
			if !lt.SendNow {
				passed = append(passed, t)
				continue
			}
			t.dueAt = lt.Now
		}
		due = append(due, t)
	}
	return due, passed, nil
}

// firstWave is the earliest due instant, which the message shows as its
// dispatch_at; the earliest passed one when nothing is left to send.
func (lt *LocalTime) firstWave(due, passed []target) time.Time {
	var first time.Time
	for _, set := range [][]target{due, passed} {
		for _, t := range set {
			if first.IsZero() || t.dueAt.Before(first) {
				first = t.dueAt
			}
		}
		if !first.IsZero() {
			return first
		}
	}
	return lt.Now
}

// lastWave is the latest due instant; the latest passed one when nothing is
// left to send.
func (lt *LocalTime) lastWave(due, passed []target) time.Time {
	var last time.Time
	for _, set := range [][]target{due, passed} {
		for _, t := range set {
			if t.dueAt.After(last) {
				last = t.dueAt
			}
		}
		if !last.IsZero() {
			return last
		}
	}
	return lt.Now
}

// resolve expands an audience to its active devices, each due at dispatchAt.
func resolve(ctx context.Context, q *db.Queries, a Audience, dispatchAt time.Time) ([]target, error) {
	// A device erased meanwhile is either cancelled with this message's
	// ledger committed, or not read at all (db.EraseDevices).
	if err := q.LockDirectoryShared(ctx); err != nil {
		return nil, fmt.Errorf("lock directory: %w", err)
	}
	var out []target
	add := func(id int64, userID, channel, token string, p256dh, auth *string, environment string, timezone, locale *string) {
		t := target{Target: Target{Target: push.Target{DeviceID: id, Token: token, Sandbox: environment == "sandbox"}, Channel: channel}, userID: userID, dueAt: dispatchAt}
		if timezone != nil {
			t.timezone = *timezone
		}
		if locale != nil {
			t.locale = *locale
		}
		if p256dh != nil && auth != nil {
			t.P256dh, t.Auth = *p256dh, *auth
		}
		out = append(out, t)
	}
	if a.SegmentID != "" {
		exists, err := q.SegmentExists(ctx, a.SegmentID)
		if err != nil {
			return nil, fmt.Errorf("find segment: %w", err)
		}
		if !exists {
			return nil, ErrUnknownSegment
		}
		rows, err := q.AudienceOfSegment(ctx, a.SegmentID)
		if err != nil {
			return nil, fmt.Errorf("expand segment: %w", err)
		}
		out = make([]target, 0, len(rows))
		for _, r := range rows {
			add(r.ID, r.UserID, r.Channel, r.Token, r.P256dh, r.Auth, r.Environment, r.Timezone, r.Locale)
		}
		return out, nil
	}
	rows, err := q.AudienceOfUsers(ctx, a.UserIDs)
	if err != nil {
		return nil, fmt.Errorf("expand users: %w", err)
	}
	out = make([]target, 0, len(rows))
	for _, r := range rows {
		add(r.ID, r.UserID, r.Channel, r.Token, r.P256dh, r.Auth, r.Environment, r.Timezone, r.Locale)
	}
	return out, nil
}

// localize fixes each target's localization: the one its user's locale
// picks among the message's (push.PickLocalization). A schedule's run
// reuses a stored payload, whose localizations are read from it.
func localize(ctx context.Context, q *db.Queries, m MessageSpec, targets []target) error {
	localizations := m.Content.Localizations
	if m.PayloadID != 0 {
		raw, err := q.GetPayload(ctx, m.PayloadID)
		if err != nil {
			return fmt.Errorf("read payload: %w", err)
		}
		var stored struct {
			Localizations map[string]push.Text `json:"localizations"`
		}
		if err := json.Unmarshal(raw, &stored); err != nil {
			return fmt.Errorf("decode payload %d: %w", m.PayloadID, err)
		}
		localizations = stored.Localizations
	}
	if len(localizations) == 0 {
		return nil
	}
	for i := range targets {
		targets[i].Locale = push.PickLocalization(targets[i].locale, localizations)
	}
	return nil
}

// chunk is a run of targets due at the same instant.
type chunk struct {
	dueAt   time.Time
	targets []target
}

// cut splits targets into chunks of at most size, never mixing due times, so
// that each chunk job has one scheduled_at. Targets arrive grouped by user;
// a user's devices stay together where the size allows.
func cut(targets []target, size int) []chunk {
	var chunks []chunk
	byDue := map[time.Time]int{} // due time -> index of its open chunk
	for _, t := range targets {
		i, ok := byDue[t.dueAt]
		if !ok || len(chunks[i].targets) == size {
			chunks = append(chunks, chunk{dueAt: t.dueAt, targets: make([]target, 0, min(size, len(targets)))})
			i = len(chunks) - 1
			byDue[t.dueAt] = i
		}
		chunks[i].targets = append(chunks[i].targets, t)
	}
	return chunks
}

func countUsers(targets []target) int {
	seen := make(map[string]struct{}, len(targets)/2)
	for _, t := range targets {
		seen[t.userID] = struct{}{}
	}
	return len(seen)
}
