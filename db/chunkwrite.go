package db

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// ChunkWrite is one write of a message's results, from one or more of its
// chunks: the devices to evict, what the workers saw of those chunks, the
// deliveries, and, on a chunk's last write, whether to settle the message.
type ChunkWrite struct {
	// Evict, when it holds ids, evicts the devices whose tokens are dead.
	Evict   EvictDevicesParams
	Chunks  []RecordChunkParams
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

// WriteChunks runs the writes of several messages as one pipelined batch:
// every statement goes to the server in one round trip and runs in one
// implicit transaction, committed without waiting for the disk. A process's
// ledger writer commits the answers of all its running chunks at once.
//
// Every chunk of a message moves the message row's counters, so that row is
// the one lock all of a message's chunks share. Sent as separate statements,
// the transaction would hold it across client round trips (the chunk's
// timings, the commit), and on a busy machine chunks queued behind each
// other for seconds. Pipelined, the lock is held from the counters' update
// to the commit, both on the server: the counters move last, then the
// settle check. The messages' rows are locked in the order of their ids,
// whatever the order of ws, so that two processes' writes never wait for
// each other in a cycle. Its statements run on their generic plans
// (UseGenericPlans). out[i] is what ws[i] did.
func WriteChunks(ctx context.Context, pool *pgxpool.Pool, ws []ChunkWrite) ([]ChunkWritten, error) {
	order := make([]int, len(ws))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(i, j int) int { return cmp.Compare(ws[i].Results.MessageID, ws[j].Results.MessageID) })
	out := make([]ChunkWritten, len(ws))
	err := inBatch(ctx, pool, func(b *pgx.Batch) {
		clear(out)
		b.Queue(commitWithoutWaitingForDisk)
		b.Queue(useGenericPlans)
		for _, i := range order {
			queueChunkWrite(b, ws[i], &out[i])
		}
	})
	if err != nil {
		if len(ws) == 1 {
			return nil, fmt.Errorf("write results of message %d: %w", ws[0].Results.MessageID, err)
		}
		return nil, fmt.Errorf("write results of %d messages: %w", len(ws), err)
	}
	return out, nil
}

// queueChunkWrite queues the statements of one message's write.
func queueChunkWrite(b *pgx.Batch, w ChunkWrite, out *ChunkWritten) {
	r := w.Results
	if len(w.Evict.Ids) > 0 {
		b.Queue(evictDevices, w.Evict.SentAfter, w.Evict.Ids, w.Evict.Reasons)
	}
	for _, c := range w.Chunks {
		b.Queue(recordChunk, c.StartedAt, c.FirstAcceptedAt, c.LastAcceptedAt, c.FinishedAt, c.MessageID, c.Chunk)
	}
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
}

// inBatch sends the statements build queues as one pipelined batch: one
// round trip, one implicit transaction. Like InTx, it runs it again when
// PostgreSQL aborts it as a deadlock victim or a serialization failure;
// build is called for every run and must reset what its callbacks fill.
func inBatch(ctx context.Context, pool *pgxpool.Pool, build func(b *pgx.Batch)) error {
	return retryConflicts(func() error {
		b := &pgx.Batch{}
		build(b)
		return pool.SendBatch(ctx, b).Close()
	})
}

// ChunkStart is what a chunk needs before it sends.
type ChunkStart struct {
	// State is the message's state once this chunk has tried to start it:
	// dispatching when the chunk may send.
	State string
	// Pending are the chunk's devices whose deliveries are still pending.
	Pending []ChunkPendingRow
	// Payload is the message's content, when it was asked for.
	Payload []byte
}

// BeginChunk starts a chunk in one round trip, pipelined like WriteChunks:
// it marks the message dispatching if it is still scheduled (only the
// first chunk changes the row), reads the state that resulted, the chunk's
// pending deliveries with their devices' tokens (ChunkPending, on the
// generic plan: UseGenericPlans) and, when payloadID is not zero, the
// payload. Before, these were four round trips at the instant every chunk
// of a message starts, when the database is busiest.
func BeginChunk(ctx context.Context, pool *pgxpool.Pool, c ChunkPendingParams, payloadID int64) (ChunkStart, error) {
	var out ChunkStart
	err := inBatch(ctx, pool, func(b *pgx.Batch) {
		out = ChunkStart{}
		b.Queue(useGenericPlans)
		b.Queue(startMessage, c.MessageID)
		b.Queue(messageState, c.MessageID).QueryRow(func(row pgx.Row) error { return row.Scan(&out.State) })
		b.Queue(chunkPending, c.MessageID, c.FirstDevice, c.LastDevice, c.Chunk).Query(func(rows pgx.Rows) error {
			for rows.Next() {
				var r ChunkPendingRow
				if err := rows.Scan(&r.DeviceID, &r.Attempt, &r.Channel, &r.Locale, &r.Token, &r.P256dh, &r.Auth, &r.Environment); err != nil {
					return err
				}
				out.Pending = append(out.Pending, r)
			}
			return rows.Err()
		})
		if payloadID != 0 {
			b.Queue(getPayload, payloadID).QueryRow(func(row pgx.Row) error { return row.Scan(&out.Payload) })
		}
	})
	if err != nil {
		return ChunkStart{}, fmt.Errorf("begin chunk %d of message %d: %w", c.Chunk, c.MessageID, err)
	}
	return out, nil
}
