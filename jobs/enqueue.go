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
	// Category and QuietHours are the message's category and what quiet
	// hours do to it (jobs/preferences); empty means "default" and hold.
	Category   string
	QuietHours string
}

// jobClient is the part of the River client that enqueues and cancels
// jobs in a caller's transaction.
type jobClient interface {
	InsertManyTx(ctx context.Context, tx pgx.Tx, params []river.InsertManyParams) ([]*rivertype.JobInsertResult, error)
	JobCancelTx(ctx context.Context, tx pgx.Tx, jobID int64) (*rivertype.JobRow, error)
	JobDeleteTx(ctx context.Context, tx pgx.Tx, jobID int64) (*rivertype.JobRow, error)
}

// Enqueuer schedules messages and cancels them before they start:
// everything that can be done before the dispatch second is done here,
// inside the caller's transaction.
type Enqueuer struct {
	client    jobClient
	chunkSize int
	ledger    Ledger
}

// Ledger is how scheduling writes a message's ledger (migration 0022).
type Ledger string

const (
	// LedgerAuto writes a snapshot of each chunk's devices, and the
	// chunks' acceptances as runs (migration 0028) and every other
	// delivery's ledger row once, with its result; but a row for every
	// result while a worker of a release without runs is alive (one
	// without FeatureRuns), and pending rows while one of a release
	// without snapshots is (without FeatureSnapshots): neither could send
	// such a chunk.
	LedgerAuto Ledger = "auto"
	// LedgerSnapshots writes snapshots, and a row for every result, as
	// releases before the runs did.
	LedgerSnapshots Ledger = "snapshots"
	// LedgerRows always writes a pending ledger row for every device when
	// the message is scheduled, as releases before the snapshots did.
	LedgerRows Ledger = "rows"
)

// ParseLedger reads a Ledger from its name ("" is LedgerAuto).
func ParseLedger(s string) (Ledger, error) {
	switch Ledger(s) {
	case "", LedgerAuto:
		return LedgerAuto, nil
	case LedgerSnapshots, LedgerRows:
		return Ledger(s), nil
	}
	return "", fmt.Errorf("ledger %q: want auto, snapshots or rows", s)
}

// FeatureSnapshots and FeatureRuns are what a process of this release
// reports it can do (db.UpsertProcessFeatures): run chunks scheduled with
// snapshots, and chunks that write their acceptances as runs.
const (
	FeatureSnapshots = "ledger_once"
	FeatureRuns      = "ledger_runs"
)

// features is every feature a process of this release reports.
var features = []string{FeatureSnapshots, FeatureRuns}

// WithLedger makes e write its messages' ledgers as l says, and returns e.
func (e *Enqueuer) WithLedger(l Ledger) *Enqueuer {
	e.ledger = l
	return e
}

// snapshots reports whether a message scheduled now in tx is written with
// snapshots: unless e writes rows, or a worker of an earlier release is
// alive. The processes' reports are a few rows, read every time: a report
// is at most a status interval old, and a process reports before it takes
// any chunk.
func (e *Enqueuer) snapshots(ctx context.Context, tx pgx.Tx) (bool, error) {
	if e.ledger == LedgerRows {
		return false, nil
	}
	return e.allCan(ctx, tx, FeatureSnapshots)
}

// runs reports whether the chunks of a message written with snapshots, in
// tx, write their acceptances as runs: unless e writes a row a result, or
// a worker of a release without runs is alive.
func (e *Enqueuer) runs(ctx context.Context, tx pgx.Tx, snapshot bool) (bool, error) {
	if !snapshot || e.ledger == LedgerSnapshots || e.ledger == LedgerRows {
		return false, nil
	}
	return e.allCan(ctx, tx, FeatureRuns)
}

// allCan reports whether every live process reports feature.
func (e *Enqueuer) allCan(ctx context.Context, tx pgx.Tx, feature string) (bool, error) {
	older, err := db.On(tx).ProcessesWithoutFeature(ctx, feature)
	if err != nil {
		return false, fmt.Errorf("read the processes' releases: %w", err)
	}
	return len(older) == 0, nil
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

// jobBatch is how many chunk jobs are enqueued in one statement: enough to
// make a message of a million devices (2,000 chunks) two round trips, few
// enough that no batch holds much.
const jobBatch = 1000

// Create stores the payload once, the message, and expands its audience in
// tx: one ledger row per active device (pending in its chunk, or expired
// for a local-time recipient whose time had passed) written by the
// database from the directory (db.ExpandAudience), then one small chunk job
// per chunk, scheduled at its due time. The audience never passes through
// this process, so scheduling a million devices takes no more memory than
// ten. Nothing is visible until the caller commits, and nothing is kept if
// it rolls back.
func (e *Enqueuer) Create(ctx context.Context, tx pgx.Tx, m MessageSpec) (db.Message, error) {
	msg, _, err := e.create(ctx, tx, m, false)
	return msg, err
}

// create is Create; with head, a message without local time has its first
// chunk written alone, and when its audience has more devices it is
// returned with its backstop job, for the caller to commit tx and write
// the rest (rest.go).
func (e *Enqueuer) create(ctx context.Context, tx pgx.Tx, m MessageSpec, head bool) (db.Message, *restJob, error) {
	q := db.On(tx)
	// A device erased meanwhile is either cancelled with this message's
	// ledger committed, or not read at all (db.EraseDevices).
	if err := q.LockDirectoryShared(ctx); err != nil {
		return db.Message{}, nil, fmt.Errorf("lock directory: %w", err)
	}
	audience := db.Audience(m.Audience)
	if audience.SegmentID != "" {
		exists, err := q.SegmentExists(ctx, audience.SegmentID)
		if err != nil {
			return db.Message{}, nil, fmt.Errorf("find segment: %w", err)
		}
		if !exists {
			return db.Message{}, nil, ErrUnknownSegment
		}
	}
	plan := db.Expansion{ChunkSize: e.chunkSize, FirstChunkSize: firstChunkSize, DispatchAt: m.DispatchAt}
	var err error
	if plan.Snapshot, err = e.snapshots(ctx, tx); err != nil {
		return db.Message{}, nil, err
	}
	runs, err := e.runs(ctx, tx, plan.Snapshot)
	if err != nil {
		return db.Message{}, nil, err
	}
	if head && m.LocalTime == nil {
		plan.Head = firstChunkSize
	}
	// Each chunk lives as long after its due instant as the message does
	// after dispatch_at, or a local-time wave's lifetime.
	lifetime := m.ExpiresAt.Sub(m.DispatchAt)
	var localJSON []byte
	if err := planExpansion(ctx, tx, m, audience, &plan); err != nil {
		return db.Message{}, nil, err
	}
	if lt := m.LocalTime; lt != nil {
		lifetime = lt.Lifetime
		// The message lasts until its last wave expires: an expires_at of
		// the first wave's would say it was over while later waves were
		// still to be sent.
		m.DispatchAt, m.ExpiresAt = lt.firstWave(plan), lt.lastWave(plan).Add(lifetime)
		localJSON = lt.JSON
	}
	payloadID, err := storePayload(ctx, q, m)
	if err != nil {
		return db.Message{}, nil, err
	}
	msg, err := q.InsertMessage(ctx, db.InsertMessageParams{
		State: StateScheduled, Priority: m.Priority, DispatchAt: m.DispatchAt, ExpiresAt: m.ExpiresAt,
		PayloadID: payloadID, Audience: m.AudienceJSON, LocalTime: localJSON,
		ScheduleID: m.ScheduleID, ScheduleRunAt: m.ScheduleRunAt, Category: m.Category, QuietHours: m.QuietHours,
	})
	if err != nil {
		return db.Message{}, nil, fmt.Errorf("store message: %w", err)
	}
	plan.MessageID = msg.ID
	expanded, err := db.ExpandAudience(ctx, tx, audience, plan)
	if err != nil {
		return db.Message{}, nil, err
	}
	counts := db.SetMessageAudienceParams{ID: msg.ID, State: StateScheduled, RecipientCount: expanded.Recipients}
	var rest *restJob
	if expanded.More {
		// The rest is written after tx commits, or by the backstop job
		// should that never happen.
		counts.RestAfter = &expanded.Chunks[len(expanded.Chunks)-1].LastDevice
		backstop, err := e.client.InsertManyTx(ctx, tx, []river.InsertManyParams{{
			Args: RestArgs{MessageID: msg.ID}, InsertOpts: &river.InsertOpts{ScheduledAt: time.Now().Add(restBackstop)},
		}})
		if err != nil {
			return db.Message{}, nil, fmt.Errorf("enqueue the rest's backstop: %w", err)
		}
		rest = &restJob{messageID: msg.ID, backstopID: backstop[0].Job.ID}
	}
	var chunks []db.ExpandedChunk
	for _, c := range expanded.Chunks {
		counts.DeviceCount += c.Devices
		if c.Chunk < 0 {
			counts.ExpiredCount += c.Devices
			continue
		}
		counts.PendingCount += c.Devices
		chunks = append(chunks, c)
	}
	counts.ChunkCount = int32(len(chunks))
	if len(chunks) == 0 {
		// Nothing to send: the message is settled the moment it exists,
		// expired if every recipient's time had passed.
		now, err := q.DatabaseNow(ctx)
		if err != nil {
			return db.Message{}, nil, fmt.Errorf("read clock: %w", err)
		}
		counts.State, counts.SettledAt = StateDispatched, &now
		if counts.ExpiredCount > 0 {
			counts.State = StateExpired
		}
	}
	for start := 0; start < len(chunks); start += jobBatch {
		if err := e.enqueue(ctx, tx, msg, payloadID, lifetime, plan.Snapshot, runs, chunks[start:min(start+jobBatch, len(chunks))]); err != nil {
			return db.Message{}, nil, err
		}
	}
	if msg, err = q.SetMessageAudience(ctx, counts); err != nil {
		return db.Message{}, nil, fmt.Errorf("count the audience: %w", err)
	}
	return msg, rest, nil
}

// sendNowWithin is how soon a message must be due to be written in two
// transactions: one due later has its ledger written before it is due.
const sendNowWithin = time.Second

// restBackstop is when the backstop job writes a rest that the request
// did not (it died between its two transactions).
const restBackstop = 5 * time.Second

// RestKind is the River kind of the backstop job.
const RestKind = "message_rest"

// RestArgs is the backstop job of a message written in two transactions:
// it writes the rest of its audience if its request did not.
type RestArgs struct {
	MessageID int64 `json:"message_id"`
}

// Kind implements river.JobArgs.
func (RestArgs) Kind() string { return RestKind }

// restJob is a message whose rest is to be written, and its backstop job.
type restJob struct {
	messageID, backstopID int64
}

// writeRest writes the rest of message id's audience into the ledger in
// tx, if it is still to be written, and returns the message. It takes the
// message's rest lock (held until tx ends), so that of two writers the
// second finds the rest written. It locks the message's row only at its
// end, to add the rest to its counts: its first chunk's ledger writes
// never wait for the rest's.
func (e *Enqueuer) writeRest(ctx context.Context, tx pgx.Tx, id int64) (db.Message, error) {
	q := db.On(tx)
	msg, err := q.GetMessage(ctx, id)
	if err != nil || msg.RestAfter == nil {
		return msg, err
	}
	// Still to be written: under the lock, another writer has written it
	// or none is writing it.
	if err := q.LockMessageRest(ctx, id); err != nil {
		return db.Message{}, fmt.Errorf("wait for the rest of message %d: %w", id, err)
	}
	if msg, err = q.GetMessage(ctx, id); err != nil || msg.RestAfter == nil {
		return msg, err
	}
	// As in Create: a device erased meanwhile was erased before this
	// reads the directory, or is cancelled with what this commits.
	if err := q.LockDirectoryShared(ctx); err != nil {
		return db.Message{}, fmt.Errorf("lock directory: %w", err)
	}
	audience, err := storedAudience(msg.Audience)
	if err != nil {
		return db.Message{}, fmt.Errorf("message %d: %w", id, err)
	}
	plan := db.Expansion{MessageID: id, ChunkSize: e.chunkSize, DispatchAt: msg.DispatchAt, After: *msg.RestAfter}
	// The rest is written as its first chunk was.
	if plan.Snapshot, err = q.HasSnapshot(ctx, id); err != nil {
		return db.Message{}, fmt.Errorf("read how message %d was written: %w", id, err)
	}
	// Its chunks write runs if every live process can now: each chunk's
	// kind says for itself.
	runs, err := e.runs(ctx, tx, plan.Snapshot)
	if err != nil {
		return db.Message{}, err
	}
	if err := planExpansion(ctx, tx, MessageSpec{PayloadID: msg.PayloadID}, audience, &plan); err != nil {
		return db.Message{}, err
	}
	expanded, err := db.ExpandAudience(ctx, tx, audience, plan)
	if err != nil {
		return db.Message{}, err
	}
	finish := db.FinishMessageRestParams{ID: id, RecipientCount: msg.RecipientCount, Chunks: int32(len(expanded.Chunks))}
	for _, c := range expanded.Chunks {
		finish.Devices += c.Devices
	}
	if len(expanded.Chunks) > 0 {
		finish.RecipientCount = expanded.Recipients
	}
	lifetime := msg.ExpiresAt.Sub(msg.DispatchAt)
	for start := 0; start < len(expanded.Chunks); start += jobBatch {
		if err := e.enqueue(ctx, tx, msg, msg.PayloadID, lifetime, plan.Snapshot, runs, expanded.Chunks[start:min(start+jobBatch, len(expanded.Chunks))]); err != nil {
			return db.Message{}, err
		}
	}
	pending, err := q.FinishMessageRest(ctx, finish)
	if err != nil {
		return db.Message{}, fmt.Errorf("count the rest: %w", err)
	}
	if pending == 0 {
		// The rest was empty and the first chunk has settled: no chunk is
		// left to settle the message. (The settle is not in this
		// process's SLO metrics: it is the rare race of a rest whose every
		// device went in the instant it took the first chunk to settle.)
		if _, err := q.SettleMessage(ctx, id); err != nil && !errors.Is(err, db.ErrNotFound) {
			return db.Message{}, fmt.Errorf("settle message: %w", err)
		}
	}
	return q.GetMessage(ctx, id)
}

// enqueue inserts the jobs of chunks and records which job carries each:
// of SnapshotKind when the chunks were written with snapshots, of RunsKind
// when they also write their acceptances as runs.
func (e *Enqueuer) enqueue(ctx context.Context, tx pgx.Tx, msg db.Message, payloadID int64, lifetime time.Duration, snapshot, runs bool, chunks []db.ExpandedChunk) error {
	jobs := make([]river.InsertManyParams, len(chunks))
	for i, c := range chunks {
		a := FanOutArgs{
			MessageID: msg.ID, Chunk: int(c.Chunk), PayloadID: payloadID, Priority: msg.Priority,
			DispatchAt: c.DueAt, ExpiresAt: c.DueAt.Add(lifetime),
			FirstDevice: c.FirstDevice, LastDevice: c.LastDevice, Devices: c.Devices, Snapshot: snapshot, Runs: runs,
		}
		jobs[i] = river.InsertManyParams{
			Args:       a.jobArgs(),
			InsertOpts: &river.InsertOpts{ScheduledAt: c.DueAt, Priority: chunkPriority(c.Chunk)},
		}
	}
	results, err := e.client.InsertManyTx(ctx, tx, jobs)
	if err != nil {
		return fmt.Errorf("enqueue chunks: %w", err)
	}
	p := db.InsertMessageChunksParams{
		MessageID:    msg.ID,
		Chunks:       make([]int32, len(chunks)),
		JobIds:       make([]int64, len(chunks)),
		DueAts:       make([]time.Time, len(chunks)),
		DeviceCounts: make([]int32, len(chunks)),
	}
	for i, c := range chunks {
		p.Chunks[i], p.JobIds[i], p.DueAts[i], p.DeviceCounts[i] = c.Chunk, results[i].Job.ID, c.DueAt, c.Devices
	}
	if err := db.On(tx).InsertMessageChunks(ctx, p); err != nil {
		return fmt.Errorf("record chunks: %w", err)
	}
	return nil
}

// chunkPriority is the River priority of a message's chunk: its first
// chunk comes before the rest, its first ten before the rest of those, and
// so on. Chunks due at the same instant are taken in the order of their
// priority, then of their insertion; so when many messages are due at one
// second, every message's first devices are sent before any message's
// hundredth chunk, instead of the first message sent whole before the
// second begins.
func chunkPriority(chunk int32) int {
	switch {
	case chunk == 0:
		return 1
	case chunk < 10:
		return 2
	case chunk < 100:
		return 3
	}
	return 4
}

// planExpansion fills in what the expansion needs beyond the message: a local-time
// message's waves, and the localization each locale gets. Both come from
// the audience's distinct zones and locales, read only when the message
// has local time or localizations.
func planExpansion(ctx context.Context, tx pgx.Tx, m MessageSpec, audience db.Audience, plan *db.Expansion) error {
	localizations, err := localizationsOf(ctx, db.On(tx), m)
	if err != nil {
		return err
	}
	if m.LocalTime == nil && len(localizations) == 0 {
		return nil
	}
	keys, err := db.ReadAudienceKeys(ctx, tx, audience)
	if err != nil {
		return err
	}
	if len(localizations) > 0 {
		for _, locale := range keys.Locales {
			if key := push.PickLocalization(locale, localizations); key != "" {
				plan.Locales, plan.Keys = append(plan.Locales, locale), append(plan.Keys, key)
			}
		}
	}
	if lt := m.LocalTime; lt != nil {
		return lt.place(keys.Zones, plan)
	}
	return nil
}

// Cancel cancels message id in tx if no chunk of it has started: its
// pending deliveries and its chunk jobs are cancelled with it. It reports
// false, changing nothing, when the message is not (or no longer)
// scheduled; CancelMessage's state guard makes the race with the first
// chunk resolve one way.
func (e *Enqueuer) Cancel(ctx context.Context, tx pgx.Tx, id int64) (bool, error) {
	q := db.On(tx)
	// A message sent now whose rest is being written: the cancel waits
	// for it, or writes it, and cancels the whole audience.
	if _, err := e.writeRest(ctx, tx, id); err != nil {
		if errors.Is(err, db.ErrNotFound) {
			return false, nil
		}
		return false, err
	}
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
		SettledAt: &now, Category: m.Category, QuietHours: m.QuietHours,
	})
	if err != nil {
		return db.Message{}, fmt.Errorf("store missed run: %w", err)
	}
	return msg, nil
}

// localizationsOf are m's localizations: its content's, or for a
// schedule's run, which reuses a stored payload, the stored payload's.
func localizationsOf(ctx context.Context, q *db.Queries, m MessageSpec) (map[string]push.Text, error) {
	if m.PayloadID == 0 {
		return m.Content.Localizations, nil
	}
	raw, err := q.GetPayload(ctx, m.PayloadID)
	if err != nil {
		return nil, fmt.Errorf("read payload: %w", err)
	}
	var stored struct {
		Localizations map[string]push.Text `json:"localizations"`
	}
	if err := json.Unmarshal(raw, &stored); err != nil {
		return nil, fmt.Errorf("decode payload %d: %w", m.PayloadID, err)
	}
	return stored.Localizations, nil
}
