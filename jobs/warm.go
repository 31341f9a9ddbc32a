package jobs

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/heraldpush/herald/db"
)

// Warm readies this process for the chunks of queue that fall due at at,
// before that instant (the Waker calls it when it first sees the instant,
// up to DefaultWakeAhead early): for the chunks the lane will begin first
// (as many as it runs at once, every message's first chunk before any
// second), it reads what their beginning will read, so that PostgreSQL has
// the ledger's and the devices' pages in its buffers, and encodes each
// message's pushes into the cache. Nothing before the instant read a
// message's chunks, so at the instant, the moment with the least slack,
// the first read of each chunk's devices could go to disk.
//
// It changes nothing: a chunk begins at its instant as it would have, and
// reads again what it sends, so a device moved or a delivery settled in
// between is seen then.
func (w *FanOutWorker) Warm(ctx context.Context, queue string, at time.Time) error {
	lane, ok := w.lanes[queue]
	if !ok || lane.Pool == nil {
		return nil
	}
	raws, err := db.DueJobArgs(ctx, lane.Pool, FanOutKind, queue, at, lane.workers())
	if err != nil {
		return err
	}
	for _, raw := range raws {
		var a FanOutArgs
		if err := json.Unmarshal(raw, &a); err != nil {
			return fmt.Errorf("warm: decode a chunk's args: %w", err)
		}
		_, cached := w.messages.lookup(a)
		payloadID := a.PayloadID
		if cached {
			payloadID = 0
		}
		payload, pending, err := db.WarmChunk(ctx, lane.Pool, a.ledgerRange(), payloadID)
		if err != nil {
			return err
		}
		if !cached && pending > 0 && payload != nil {
			if _, err := w.messages.build(a, payload); err != nil {
				return fmt.Errorf("warm: %w", err)
			}
		}
	}
	return nil
}
