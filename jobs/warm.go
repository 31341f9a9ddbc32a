package jobs

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/sync/errgroup"

	"github.com/heraldpush/herald/db"
)

// Warm readies this process for the chunks of queue that fall due at at,
// before that instant (the Waker calls it when it first sees the instant,
// up to DefaultWakeAhead early): for the chunks the lane will begin first
// (as many as it runs at once, every message's first chunk before any
// second), it reads what their beginning will read, so that PostgreSQL has
// the ledger's and the devices' pages in its buffers, encodes each
// message's pushes into the cache, and opens the provider connections
// their devices will be sent on (instantConns). Nothing before the instant
// read a message's chunks, so at the instant, the moment with the least
// slack, the first read of each chunk's devices could go to disk; and a
// connection not used lately (a push service not sent to for 90 s, the
// APNs sandbox, any a provider closed when it had been idle) would be
// opened by the instant's first push to it, a TLS handshake inside its
// second.
//
// The reads run side by side, on as many of the lane's connections as
// begin together at the instant (warmConns): the pool opens the connections
// the instant's chunks will begin on, and each has the chunk read prepared and
// its backend's caches filled. A pool opens connections only as they are
// wanted, so at an instant with twenty messages due the first chunks found
// nine connections open; the others waited for connections to be made
// (backends started while the machine was at its busiest) and their first
// devices went out up to a second late.
//
// It changes nothing: a chunk begins at its instant as it would have, and
// reads again what it sends, so a device moved or a delivery settled in
// between is seen then. A provider warm-up that fails is logged and left:
// it fails neither the warm-up nor the instant.
func (w *FanOutWorker) Warm(ctx context.Context, queue string, at time.Time) error {
	lane, ok := w.lanes[queue]
	if !ok || lane.Pool == nil {
		return nil
	}
	due, err := db.DueJobArgs(ctx, lane.Pool, chunkKinds, queue, at.Add(-wakeSpan), at, lane.workers())
	if err != nil {
		return err
	}
	chunks := make([]FanOutArgs, len(due))
	for i, job := range due {
		if chunks[i], err = ChunkArgs(job.Kind, job.Args); err != nil {
			return fmt.Errorf("warm: %w", err)
		}
	}
	// The provider connections are opened as each chunk's devices are
	// read, on a context of their own: a failed read stops the reads, not
	// the connections already under way.
	conns := w.instantConns(ctx, lane)
	defer conns.wait()
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(warmConns(int(lane.Pool.Config().MaxConns), w.begins[lane.Pool].othersAtOnce(), chunks))
	for _, a := range chunks {
		g.Go(func() error {
			pending, err := w.warmChunk(gctx, lane.Pool, a)
			conns.add(pending)
			return err
		})
	}
	return g.Wait()
}

// warmSpare is how many of a lane's connections its warm-up leaves to the
// rest of the process (the ledger writer, River's fetches, the API).
const warmSpare = 2

// warmConns is how many connections of a pool of maxConns the warm-up of
// chunks reads on: as many as begin together at the instant, every first
// chunk and as many others as the begin gate lets through at once
// (others), all but warmSpare at most. No more: a connection opened and
// primed for a chunk that will not begin at the instant costs PostgreSQL a
// backend's start and a plan of each statement for nothing (reading one
// message's fifty chunks on eighteen connections took PostgreSQL's CPU over
// the wait before its instant from 14-20 to 30 µs a device, in herald
// bench's runs).
func warmConns(maxConns, others int, chunks []FanOutArgs) int {
	n := others
	for _, a := range chunks {
		if a.Chunk == 0 {
			n++
		}
	}
	return max(1, min(n, maxConns-warmSpare))
}

// warmChunk reads chunk a as its beginning will, encodes its message into
// the cache if it is not there, and returns its pending deliveries.
func (w *FanOutWorker) warmChunk(ctx context.Context, pool *pgxpool.Pool, a FanOutArgs) ([]db.ChunkPendingRow, error) {
	_, cached := w.messages.lookup(a)
	payloadID := a.PayloadID
	if cached {
		payloadID = 0
	}
	payload, pending, err := db.WarmChunk(ctx, pool, a.ledgerRange(), payloadID)
	if err != nil {
		return nil, err
	}
	if !cached && len(pending) > 0 && payload != nil {
		if _, err := w.messages.build(a, payload); err != nil {
			return pending, fmt.Errorf("warm: %w", err)
		}
	}
	return pending, nil
}
