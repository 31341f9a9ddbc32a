package jobs

import (
	"time"

	"github.com/heraldpush/herald/jobs/push"
	"github.com/heraldpush/herald/jobs/receipt"
)

// SignReceipts gives each of targets its receipt token for message
// messageID, made with signer; a nil signer leaves them without one, and
// their pushes carry none. A token is good until window after the
// deliveries' expiry (their chunk's): a push may reach its device until
// then, and be opened days later. Every token of a chunk expires at the
// same second, so that a retried delivery carries the token of its first
// attempt. The tokens are written into one buffer and made strings at
// once: a few allocations for a slice of targets rather than two a device.
// herald bench's blast signs its targets with it too, so that it sends
// what a worker sends.
func SignReceipts(signer *receipt.Signer, messageID int64, expiresAt time.Time, window time.Duration, targets []push.Target) {
	if signer == nil || len(targets) == 0 {
		return
	}
	expires := expiresAt.Add(window)
	buf := make([]byte, 0, len(targets)*receipt.MaxLen)
	ends := make([]int32, len(targets))
	for i := range targets {
		buf = signer.AppendSign(buf, receipt.Delivery{MessageID: messageID, DeviceID: targets[i].DeviceID}, expires)
		ends[i] = int32(len(buf))
	}
	all := string(buf)
	start := int32(0)
	for i := range targets {
		targets[i].Receipt = all[start:ends[i]]
		start = ends[i]
	}
}
