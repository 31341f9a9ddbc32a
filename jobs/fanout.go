package jobs

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
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
	Targets    Targets   `json:"targets"`
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

// Targets are a chunk's devices. In the job's args they are packed into one
// string, a line per device with tab-separated fields, rather than an array
// of objects: River indexes args with a GIN index, which would otherwise take
// an entry for every field of every device (125,000 for a 25,000-device
// message) and cost more than the rest of scheduling together. A string
// longer than 125 bytes is one hashed entry. Tokens, endpoints and keys never
// hold tabs or line breaks (the API rejects them).
type Targets []Target

// channelCodes packs a channel into one letter.
var channelCodes = map[string]byte{"apns": 'a', "fcm": 'f', "webpush": 'w'}

func channelOfCode(c byte) (string, bool) {
	switch c {
	case 'a':
		return "apns", true
	case 'f':
		return "fcm", true
	case 'w':
		return "webpush", true
	}
	return "", false
}

// MarshalJSON packs the targets into one JSON string.
func (ts Targets) MarshalJSON() ([]byte, error) {
	var b strings.Builder
	for _, t := range ts {
		code, ok := channelCodes[t.Channel]
		if !ok {
			return nil, fmt.Errorf("target %d: unknown channel %q", t.DeviceID, t.Channel)
		}
		if strings.ContainsAny(t.Token+t.P256dh+t.Auth, "\t\n") {
			return nil, fmt.Errorf("target %d: a field holds a tab or line break", t.DeviceID)
		}
		b.WriteString(strconv.FormatInt(t.DeviceID, 10))
		b.WriteByte('\t')
		b.WriteByte(code)
		b.WriteByte('\t')
		b.WriteString(t.Token)
		if t.P256dh != "" || t.Auth != "" {
			b.WriteByte('\t')
			b.WriteString(t.P256dh)
			b.WriteByte('\t')
			b.WriteString(t.Auth)
		}
		b.WriteByte('\n')
	}
	return json.Marshal(b.String())
}

// UnmarshalJSON unpacks targets packed by MarshalJSON.
func (ts *Targets) UnmarshalJSON(data []byte) error {
	var packed string
	if err := json.Unmarshal(data, &packed); err != nil {
		return fmt.Errorf("targets: %w", err)
	}
	out := make(Targets, 0, strings.Count(packed, "\n"))
	for line := range strings.Lines(packed) {
		fields := strings.Split(strings.TrimSuffix(line, "\n"), "\t")
		if len(fields) != 3 && len(fields) != 5 {
			return fmt.Errorf("targets: malformed line %q", line)
		}
		id, err := strconv.ParseInt(fields[0], 10, 64)
		if err != nil || len(fields[1]) != 1 {
			return fmt.Errorf("targets: malformed line %q", line)
		}
		channel, ok := channelOfCode(fields[1][0])
		if !ok {
			return fmt.Errorf("targets: malformed line %q", line)
		}
		t := Target{DeviceID: id, Channel: channel, Token: fields[2]}
		if len(fields) == 5 {
			t.P256dh, t.Auth = fields[3], fields[4]
		}
		out = append(out, t)
	}
	*ts = out
	return nil
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
