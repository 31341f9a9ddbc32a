package jobs

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"math"
	"time"

	"github.com/riverqueue/river"

	"github.com/heraldpush/herald/db"
	"github.com/heraldpush/herald/jobs/preferences"
	"github.com/heraldpush/herald/jobs/push"
)

// FanOutKind is the River kind of a chunk job whose ledger rows were
// written pending when its message was scheduled (by a release before the
// snapshots, or while one was alive: Enqueuer). SnapshotKind is the kind of
// one scheduled with a snapshot of its devices (migration 0022), which a
// release without snapshots does not know: River hands it back to be
// retried, so such a worker never runs it and never finds it empty.
// RunsKind is the kind of one scheduled with a snapshot whose acceptances
// are written as runs (migration 0028), which a release without runs does
// not know either: its worker would read a run's devices as pending.
const (
	FanOutKind   = "fan_out"
	SnapshotKind = "fan_out_snapshot"
	RunsKind     = "fan_out_runs"
)

// chunkKinds are the kinds of chunk jobs.
var chunkKinds = []string{FanOutKind, SnapshotKind, RunsKind}

// FanOutArgs is one chunk of a message: a range of the message's part of
// the ledger, cut when the message was scheduled (db.ExpandAudience), and
// when to send it. The devices are not in the job: its worker reads the
// range's pending deliveries, with their devices' tokens, in the round trip
// that begins the chunk. So a job holds no token (River keeps finished jobs
// for days, and shows them to operators), and scheduling writes no copy of
// the audience. The payload travels by reference; it is the same for every
// chunk.
type FanOutArgs struct {
	MessageID  int64     `json:"message_id" river:"unique"`
	Chunk      int       `json:"chunk" river:"unique"`
	PayloadID  int64     `json:"payload_id"`
	Priority   string    `json:"priority"`
	DispatchAt time.Time `json:"dispatch_at"`
	ExpiresAt  time.Time `json:"expires_at"`
	// FirstDevice and LastDevice bound the chunk's device ids. Zero in a
	// job enqueued before chunks were ranges: its message's whole ledger is
	// read for its chunk number.
	FirstDevice int64 `json:"first_device,omitempty"`
	LastDevice  int64 `json:"last_device,omitempty"`
	// Devices is how many devices the chunk's snapshot holds (its read
	// walks the key over a dense range: db.Chunk). Zero in a job enqueued
	// before it was written.
	Devices int32 `json:"devices,omitempty"`
	// Snapshot says the chunk's devices are its snapshot's (its job's kind
	// is SnapshotKind or RunsKind); not in the args.
	Snapshot bool `json:"-"`
	// Runs says the chunk writes its acceptances as runs (its job's kind
	// is RunsKind); not in the args.
	Runs bool `json:"-"`
}

// SnapshotArgs is a chunk job scheduled with a snapshot of its devices:
// FanOutArgs under a kind of its own (SnapshotKind).
type SnapshotArgs struct {
	FanOutArgs
}

// Kind implements river.JobArgs.
func (SnapshotArgs) Kind() string { return SnapshotKind }

// RunsArgs is a chunk job scheduled with a snapshot of its devices that
// writes its acceptances as runs: FanOutArgs under a kind of its own
// (RunsKind).
type RunsArgs struct {
	FanOutArgs
}

// Kind implements river.JobArgs.
func (RunsArgs) Kind() string { return RunsKind }

// ChunkArgs decodes the args of a chunk job of kind.
func ChunkArgs(kind string, raw []byte) (FanOutArgs, error) {
	var a FanOutArgs
	if err := json.Unmarshal(raw, &a); err != nil {
		return FanOutArgs{}, fmt.Errorf("decode a chunk's args: %w", err)
	}
	a.Snapshot = kind == SnapshotKind || kind == RunsKind
	a.Runs = kind == RunsKind
	return a, nil
}

// ledgerRange is the part of the ledger a's chunk reads.
func (a FanOutArgs) ledgerRange() db.Chunk {
	p := db.ChunkPendingParams{MessageID: a.MessageID, FirstDevice: a.FirstDevice, LastDevice: a.LastDevice, Chunk: int32(a.Chunk)}
	if p.LastDevice == 0 {
		p.LastDevice = math.MaxInt64
	}
	return db.Chunk{ChunkPendingParams: p, Snapshot: a.Snapshot, Devices: a.Devices}
}

// delivery is what t's ledger row holds besides its result.
func (a FanOutArgs) delivery(t *Target) db.DeliveryKey {
	return db.DeliveryKey{MessageID: a.MessageID, DeviceID: t.DeviceID, UserID: t.UserID, Channel: t.Channel,
		Chunk: int32(a.Chunk), DueUs: a.due(t).UnixMicro(), First: !t.Written}
}

// due is when t's delivery is due: its chunk's instant, or the end of the
// quiet hours that held it.
func (a FanOutArgs) due(t *Target) time.Time {
	if !t.DueAt.IsZero() {
		return t.DueAt
	}
	return a.DispatchAt
}

// jobArgs is the job that carries a's chunk: of its kind.
func (a FanOutArgs) jobArgs() river.JobArgs {
	switch {
	case a.Runs:
		return RunsArgs{a}
	case a.Snapshot:
		return SnapshotArgs{a}
	}
	return a
}

// running is a chunk attempt under way: its job's args and the targets it
// read when it began, the deliveries still pending then.
type running struct {
	FanOutArgs
	Targets []Target
	// Rule is what its deliveries are decided by (jobs/preferences).
	Rule preferences.Rule
	// Execution names this attempt among its chunk's when the chunk writes
	// its acceptances as runs (db.ChunkWrite.Executions); 0 for a chunk
	// that does not (executionOf).
	Execution int64
}

// executionOf names the attempt of job whose Work runs now, as
// running.Execution: a hash of the job and its attempt, not zero. River
// counts an attempt each time it hands a job to a worker (a retry after a
// failure, a chunk taken over from a process gone) but not when the job
// snoozed, so a chunk that woke (a breaker's cooldown over, a throttle run
// out, its users' quiet hours ended) is the same execution, which read
// after its earlier writes were in: its runs meet none of its own. Two
// attempts that may overlap (a process gone and the one that took its
// chunk) are two.
func executionOf(jobID int64, attempt int) int64 {
	h := fnv.New64a()
	var b [16]byte
	binary.BigEndian.PutUint64(b[:8], uint64(jobID))
	binary.BigEndian.PutUint64(b[8:], uint64(attempt))
	h.Write(b[:])
	return int64(h.Sum64()&math.MaxInt64) | 1
}

// Kind implements river.JobArgs.
func (FanOutArgs) Kind() string { return FanOutKind }

// InsertOpts puts the chunk on its priority's lane and makes (message,
// chunk) unique, so a chunk is never enqueued twice.
func (a FanOutArgs) InsertOpts() river.InsertOpts {
	return river.InsertOpts{
		Queue:      laneQueue(a.Priority),
		UniqueOpts: river.UniqueOpts{ByArgs: true},
	}
}

// expired is the ledger write that expires the chunk's pending deliveries,
// and what the metrics count once it has committed.
func (a FanOutArgs) expired(pending []db.ChunkPendingRow) (db.RecordResultsParams, []settledDelivery) {
	var p db.RecordResultsParams
	counted := make([]settledDelivery, 0, len(pending))
	for _, r := range pending {
		t := targetOf(r)
		if r.Gone != "" {
			// Its device is no longer its user's: cancelled, as it would
			// have been had the chunk begun in time.
			counted = append(counted, settledDelivery{channel: r.Channel, status: "cancelled", reason: push.Reason(r.Gone)})
			p.Add(a.delivery(&t), "cancelled", r.Gone, 0, 0)
			continue
		}
		counted = append(counted, settledDelivery{channel: r.Channel, status: "expired"})
		p.Add(a.delivery(&t), "expired", "", 0, 0)
	}
	return p, counted
}
