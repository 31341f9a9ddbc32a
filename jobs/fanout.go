package jobs

import (
	"time"

	"github.com/riverqueue/river"
)

// FanOutKind is the River kind of a chunk job.
const FanOutKind = "fan_out"

// FanOutArgs is one chunk of a message: everything its worker needs to send,
// resolved when the message was scheduled, so that the dispatch second does
// no lookups. The payload travels by reference; it is the same for every
// chunk.
type FanOutArgs struct {
	MessageID  int64     `json:"message_id" river:"unique"`
	Chunk      int       `json:"chunk" river:"unique"`
	PayloadID  int64     `json:"payload_id"`
	Priority   string    `json:"priority"`
	DispatchAt time.Time `json:"dispatch_at"`
	ExpiresAt  time.Time `json:"expires_at"`
	Targets    []Target  `json:"targets"`
}

// Target is one device of a chunk.
type Target struct {
	DeviceID int64  `json:"device_id"`
	Channel  string `json:"channel"`
	// Token is the APNs or FCM token, or the Web Push endpoint.
	Token  string `json:"token"`
	P256dh string `json:"p256dh,omitempty"`
	Auth   string `json:"auth,omitempty"`
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
