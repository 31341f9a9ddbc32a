package db

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
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
// in PostgreSQL's buffers when the chunk begins, and the connection has the
// statements prepared (the message's state read too, which BeginChunk
// reads after it marks the message dispatching). It returns the chunk's
// pending deliveries, so that the caller can open the provider connections
// they will be sent on, and when payloadID is not zero the payload too, so
// that it can encode the message ahead as well. It changes nothing.
func WarmChunk(ctx context.Context, pool *pgxpool.Pool, c Chunk, payloadID int64) (payload []byte, pending []ChunkPendingRow, err error) {
	var out ChunkStart
	err = inBatch(ctx, pool, func(b *pgx.Batch) {
		out = ChunkStart{}
		b.Queue(useLedgerPlans)
		b.Queue(messageState, c.MessageID)
		queueChunkRead(b, c, payloadID, &out)
	})
	if err != nil {
		return nil, nil, fmt.Errorf("warm chunk %d of message %d: %w", c.Chunk, c.MessageID, err)
	}
	return out.Payload, out.Pending, nil
}
