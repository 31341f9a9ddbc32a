package jobs

import (
	"math"
	"time"

	"github.com/riverqueue/river"

	"github.com/heraldpush/herald/db"
	"github.com/heraldpush/herald/jobs/push"
)

// FanOutKind is the River kind of a chunk job.
const FanOutKind = "fan_out"

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
}

// ledgerRange is the part of the ledger a's chunk reads.
func (a FanOutArgs) ledgerRange() db.ChunkPendingParams {
	p := db.ChunkPendingParams{MessageID: a.MessageID, FirstDevice: a.FirstDevice, LastDevice: a.LastDevice, Chunk: int32(a.Chunk)}
	if p.LastDevice == 0 {
		p.LastDevice = math.MaxInt64
	}
	return p
}

// running is a chunk attempt under way: its job's args and the targets it
// read when it began, the deliveries still pending then.
type running struct {
	FanOutArgs
	Targets []Target
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
		if r.Gone != "" {
			// Its device is no longer its user's: cancelled, as it would
			// have been had the chunk begun in time.
			counted = append(counted, settledDelivery{channel: r.Channel, status: "cancelled", reason: push.Reason(r.Gone)})
			p.Add(a.MessageID, r.DeviceID, "cancelled", r.Gone, 0, 0)
			continue
		}
		counted = append(counted, settledDelivery{channel: r.Channel, status: "expired"})
		p.Add(a.MessageID, r.DeviceID, "expired", "", 0, 0)
	}
	return p, counted
}
