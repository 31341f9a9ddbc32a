package db

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/sync/errgroup"
)

// WarmedBy is how long a chunk's attempt leaves it warm: a chunk that began
// within it (one snoozed until the end of its users' quiet hours or its
// devices' throttles, moments later) was read then, so its pages are in
// PostgreSQL's buffers, its message encoded and its provider connections
// open, and DueJobArgs leaves it out. Warming it again read each chunk
// held by quiet hours twice more at the hours' end.
const WarmedBy = time.Minute

// DueJob is a job DueJobArgs found: its kind and its args.
type DueJob struct {
	Kind string
	Args []byte
}

// DueJobArgs are River's available jobs of the kinds on queue that
// fall due from from to at (both included; a Waker wakes the instants of a
// lane a few milliseconds apart as one, at the latest), but those that
// began within the last minute (WarmedBy), at most limit of them: every
// message's first
// chunk, then every message's second, and so on (a message's first chunk
// goes first at its instant, beginGate). It reads River's fetch index, as
// UpcomingDue does.
func DueJobArgs(ctx context.Context, q DBTX, kinds []string, queue string, from, at time.Time, limit int) ([]DueJob, error) {
	rows, err := q.Query(ctx, `
		SELECT kind, args FROM (
			SELECT kind, args, row_number() OVER (
				PARTITION BY args->'message_id' ORDER BY (args->>'chunk')::integer) AS n
			FROM river_job
			WHERE state = 'available' AND queue = $2 AND scheduled_at BETWEEN $5 AND $3 AND kind = ANY ($1::text[])
			  AND (attempted_at IS NULL OR attempted_at < now() - $6::interval)
		) due
		ORDER BY n, args->'message_id'
		LIMIT $4`, kinds, queue, at, limit, from, WarmedBy)
	if err != nil {
		return nil, fmt.Errorf("due jobs at %s: %w", at.Format(time.RFC3339Nano), err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowToStructByPos[DueJob])
	if err != nil {
		return nil, fmt.Errorf("due jobs at %s: %w", at.Format(time.RFC3339Nano), err)
	}
	return out, nil
}

// WarmChunk reads what BeginChunk will read for c, the same way
// (queueChunkRead, on the generic plan), and keeps none of it: the pages of
// the chunk's part of the ledger, of its devices and of their indexes are
// in PostgreSQL's buffers when the chunk begins, and the connection has
// the statements of the chunk's life parsed and planned (queuePrimes). It
// returns the chunk's pending deliveries, so that the caller can open the
// provider connections they will be sent on, and when payloadID is not
// zero the payload too, so that it can encode the message ahead as well.
// It changes nothing.
func WarmChunk(ctx context.Context, pool *pgxpool.Pool, c Chunk, payloadID int64) (payload []byte, pending []ChunkPendingRow, err error) {
	var out ChunkStart
	err = inBatch(ctx, pool, func(b *pgx.Batch) {
		out = ChunkStart{}
		b.Queue(useGenericPlans)
		b.Queue(messageState, c.MessageID)
		queueChunkRead(b, c, payloadID, &out)
		queuePrimes(b)
	})
	if err != nil {
		return nil, nil, fmt.Errorf("warm chunk %d of message %d: %w", c.Chunk, c.MessageID, err)
	}
	return out.Payload, out.Pending, nil
}

// queuePrimes queues, as no-ops, the statements of a chunk's life after
// the warm-up (its beginning, its cap's claim, its provider quota's
// claims, its ledger writes), on their generic plans, so that the
// connection has each of them parsed and planned before the instant. The
// connections of a pool take turns: at the first instant after a start,
// or after the pool replaced its connections (hourly), each statement was
// parsed and planned at the instant on each connection it first ran on,
// some eighty statements a message, each a fraction of a millisecond of
// PostgreSQL's CPU when it is busiest. Every one changes nothing: no
// message has the id 0, no quota the key "", the arrays are empty and no
// user is claimed.
func queuePrimes(b *pgx.Batch) {
	b.Queue(useGenericPlans)
	b.Queue(startMessage, int64(0))
	b.Queue(messageState, int64(0))
	b.Queue(chunkRules, int64(0))
	b.Queue(chunkSnapshotPending, int64(0), int64(0), int64(0), int32(0))
	b.Queue(commitWithoutWaitingForDisk)
	b.Queue(claimFrequencyCaps, "", int64(0), int32(0), int32(0), []string{})
	b.Queue(claimQuotaSQL, "", 0.0, 0.0, 0, 0.0)
	b.Queue(lockMessages, []int64{})
	var r RecordResultsParams
	b.Queue(insertFirstResults, r.MessageIds, r.DeviceIds, r.UserIds, r.Channels, r.Chunks,
		r.DueUs, r.Statuses, r.Reasons, r.AttemptedUs, r.AcceptedUs, r.NotBeforeUs)
	b.Queue(recordResults, r.MessageIds, r.DeviceIds, r.UserIds, r.Channels,
		r.Chunks, r.DueUs, r.Statuses, r.Reasons, r.AttemptedUs,
		r.AcceptedUs, r.NotBeforeUs, r.First, r.WantFailed, r.WantWithheld,
		r.CountedMessageIds, r.CountedStatuses, r.CountedBuckets, r.CountedWithheld, r.CountedN)
	b.Queue(recordChunk, (*time.Time)(nil), (*time.Time)(nil), (*time.Time)(nil), (*time.Time)(nil), int32(0), int64(0), int32(0))
	b.Queue(settleMessage, int64(0))
}

// PrimeIdle primes every idle connection of pool as WarmChunk primes those
// it reads on (queuePrimes), all at once: the chunks and the ledger writer
// take whichever connection is free at the instant, one the warm-up read no
// chunk on as well. On a connection primed already, it costs a round trip
// of no-ops.
func PrimeIdle(ctx context.Context, pool *pgxpool.Pool) error {
	var g errgroup.Group
	for _, c := range pool.AcquireAllIdle(ctx) {
		g.Go(func() error {
			defer c.Release()
			b := &pgx.Batch{}
			queuePrimes(b)
			if err := c.SendBatch(ctx, b).Close(); err != nil {
				return fmt.Errorf("prime a connection for the instant: %w", err)
			}
			return nil
		})
	}
	return g.Wait()
}
