package db

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// ChunkWrite is one write of a chunk's results: the devices to evict, what
// the worker saw of the chunk, the deliveries, and, on the chunk's last
// write, whether to settle the message.
type ChunkWrite struct {
	// Evict, when it holds ids, evicts the devices whose tokens are dead.
	Evict   EvictDevicesParams
	Chunk   RecordChunkParams
	Results RecordResultsParams
	// Settle asks to settle the message if nothing of it is pending after
	// this write; SettleMessage's own guard decides.
	Settle bool
}

// ChunkWritten is what a ChunkWrite did.
type ChunkWritten struct {
	RecordResultsRow
	// Settled is the message's new state when this write settled it, ""
	// otherwise.
	Settled string
}

// WriteChunk runs w as one pipelined batch: every statement goes to the
// server in one round trip and runs in one implicit transaction, committed
// without waiting for the disk.
//
// Every chunk of a message moves the message row's counters, so that row is
// the one lock all of a message's chunks share. Sent as separate statements,
// the transaction would hold it across client round trips (the chunk's
// timings, the commit), and on a busy machine chunks queued behind each
// other for seconds. Pipelined, the lock is held from the counters' update
// to the commit, both on the server: the counters move last, then the
// settle check. Like InTx, a deadlock or serialization failure is retried.
func WriteChunk(ctx context.Context, pool *pgxpool.Pool, w ChunkWrite) (ChunkWritten, error) {
	var out ChunkWritten
	err := retryConflicts(func() error {
		var err error
		out, err = writeChunkOnce(ctx, pool, w)
		return err
	})
	return out, err
}

func writeChunkOnce(ctx context.Context, pool *pgxpool.Pool, w ChunkWrite) (ChunkWritten, error) {
	var out ChunkWritten
	b := &pgx.Batch{}
	b.Queue(commitWithoutWaitingForDisk)
	if len(w.Evict.Ids) > 0 {
		b.Queue(evictDevices, w.Evict.SentAfter, w.Evict.Ids, w.Evict.Reasons)
	}
	c := w.Chunk
	b.Queue(recordChunk, c.StartedAt, c.FirstAcceptedAt, c.LastAcceptedAt, c.FinishedAt, c.MessageID, c.Chunk)
	r := w.Results
	b.Queue(recordResults, r.MessageID, r.DeviceIds, r.Statuses, r.Reasons, r.AttemptedUs, r.AcceptedUs).
		QueryRow(func(row pgx.Row) error {
			return row.Scan(&out.PendingCount, &out.Accepted, &out.Failed, &out.Expired)
		})
	if w.Settle {
		b.Queue(settleMessage, r.MessageID).QueryRow(func(row pgx.Row) error {
			if err := row.Scan(&out.Settled); err != nil && !errors.Is(err, pgx.ErrNoRows) {
				return err
			}
			return nil
		})
	}
	if err := pool.SendBatch(ctx, b).Close(); err != nil {
		return ChunkWritten{}, fmt.Errorf("write chunk %d of message %d: %w", c.Chunk, c.MessageID, err)
	}
	return out, nil
}
