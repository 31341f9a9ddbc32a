package db

import (
	"context"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"
)

// ReceiptWrite is one receipt as a group commit writes it: the delivery a token
// named, the event, and the device's clock reading (zero when it sent none).
type ReceiptWrite struct {
	MessageID, DeviceID int64
	Event               string
	DeviceAtUs          int64
}

// ReceiptWritten is what WriteReceipts did with one receipt.
type ReceiptWritten struct {
	// Found: the delivery is in the ledger and its device in the directory.
	// A receipt not found was not kept: its device was erased, or its
	// message's ledger is past the retention.
	Found bool
	// Inserted: the receipt is the first of its kind for its delivery, and
	// was counted; found and not inserted is a replay.
	Inserted bool
	// SkewMs is an inserted delivered receipt's skew: when Herald received
	// it less the delivery's due instant.
	SkewMs float64
}

// WriteReceipts records receipts in one pipelined batch, one round trip and
// one transaction, committed as every transaction is (a receipt answered as
// recorded is on disk): the directory lock, shared, so that an erasure
// (EraseDevices) either deletes the receipts written before it or makes
// those after it find their device gone; the messages' rows, locked in the
// order of their ids as the ledger writer locks them, so that no two writes
// wait for each other in a cycle; then every receipt and every message's
// counters in one statement (RecordReceipts). rs must name each
// (message, device, event) once; out[i] is what became of rs[i].
//
// Every write of a message's receipts moves its row, so a message that
// many devices answer at once is written once a batch, not once a receipt:
// the caller gathers the receipts of concurrent requests into one call.
func WriteReceipts(ctx context.Context, pool Batcher, rs []ReceiptWrite) ([]ReceiptWritten, error) {
	p := RecordReceiptsParams{
		MessageIds: make([]int64, len(rs)), DeviceIds: make([]int64, len(rs)),
		Events: make([]string, len(rs)), DeviceAtUs: make([]int64, len(rs)),
	}
	index := make(map[ReceiptWrite]int, len(rs))
	for i, r := range rs {
		p.MessageIds[i], p.DeviceIds[i], p.Events[i], p.DeviceAtUs[i] = r.MessageID, r.DeviceID, r.Event, r.DeviceAtUs
		index[ReceiptWrite{MessageID: r.MessageID, DeviceID: r.DeviceID, Event: r.Event}] = i
	}
	messages := slices.Clone(p.MessageIds)
	slices.Sort(messages)
	messages = slices.Compact(messages)
	out := make([]ReceiptWritten, len(rs))
	err := inBatch(ctx, pool, func(b *pgx.Batch) {
		clear(out)
		b.Queue(lockDirectoryShared)
		b.Queue(lockMessages, messages)
		b.Queue(recordReceipts, p.MessageIds, p.DeviceIds, p.Events, p.DeviceAtUs).Query(func(rows pgx.Rows) error {
			for rows.Next() {
				var r RecordReceiptsRow
				if err := rows.Scan(&r.MessageID, &r.DeviceID, &r.Event, &r.Inserted, &r.SkewMs); err != nil {
					return err
				}
				i, ok := index[ReceiptWrite{MessageID: r.MessageID, DeviceID: r.DeviceID, Event: r.Event}]
				if !ok {
					return fmt.Errorf("a receipt of message %d and device %d that was not asked for", r.MessageID, r.DeviceID)
				}
				out[i] = ReceiptWritten{Found: true, Inserted: r.Inserted, SkewMs: r.SkewMs}
			}
			return rows.Err()
		})
	})
	if err != nil {
		return nil, fmt.Errorf("write %d receipts: %w", len(rs), err)
	}
	return out, nil
}
