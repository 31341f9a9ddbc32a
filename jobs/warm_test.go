package jobs

import (
	"context"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/heraldpush/herald/db"
	"github.com/heraldpush/herald/db/dbtest"
)

// TestWarmReadiesTheFirstChunksOfAnInstant schedules two messages for one
// instant and warms their lane as the Waker does ahead of it: both
// messages are then encoded in the worker's cache, so that their chunks
// read no payload at the instant, and the chunks warmed are every
// message's first before any second, as many as the lane begins at once.
// (That the warm-up leaves PostgreSQL nothing to read below its buffers is
// db's TestWarmChunkLeavesTheBeginNothingToRead.)
func TestWarmReadiesTheFirstChunksOfAnInstant(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tdb := dbtest.New(t)
	q := db.On(tdb.Pool)
	users := registerUsers(t, q, "wm", 2*firstChunkSize+20)
	client, err := NewRiverClient(tdb.Pool, RiverConfig{Logger: discard})
	require.NoError(t, err)
	enq := NewEnqueuer(client, firstChunkSize)
	now, err := q.DatabaseNow(ctx)
	require.NoError(t, err)
	at := now.Add(time.Minute).Truncate(time.Millisecond)
	first := scheduleAt(t, tdb.Pool, enq, PriorityBulk, users, at)
	second := scheduleAt(t, tdb.Pool, enq, PriorityBulk, users, at)
	_, err = db.PromoteDueJobs(ctx, tdb.Pool, []string{QueueBulk}, 2*time.Minute, 100)
	require.NoError(t, err)

	due, err := db.DueJobArgs(ctx, tdb.Pool, chunkKinds, QueueBulk, at, at, 3)
	require.NoError(t, err)
	var warmed []FanOutArgs
	for _, job := range due {
		a, err := ChunkArgs(job.Kind, job.Args)
		require.NoError(t, err)
		warmed = append(warmed, a)
	}
	require.Len(t, warmed, 3)
	require.ElementsMatch(t, []int64{first, second}, []int64{warmed[0].MessageID, warmed[1].MessageID}, "every message's first chunk comes first")
	require.Equal(t, []int{0, 0, 1}, []int{warmed[0].Chunk, warmed[1].Chunk, warmed[2].Chunk})

	w := NewFanOutWorker(FanOutConfig{Pool: tdb.Pool, Logger: discard, Clock: NewClock(tdb.Pool, discard),
		Lanes: []Lane{{Queue: QueueBulk, Workers: 3}}})
	for _, a := range warmed {
		_, cached := w.messages.lookup(a)
		require.False(t, cached)
	}
	require.NoError(t, w.Warm(ctx, QueueBulk, at))
	for _, a := range warmed {
		_, cached := w.messages.lookup(a)
		require.True(t, cached, "message %d is encoded ahead of its instant", a.MessageID)
	}
	// A chunk that began moments ago (snoozed until this instant) was
	// read then: it is not warmed again, unless that was longer ago.
	for _, ago := range []time.Duration{time.Second, 2 * db.WarmedBy} {
		_, err = tdb.Pool.Exec(ctx, `UPDATE river_job SET attempted_at = now() - $2::interval WHERE args->>'message_id' = $1::text AND (args->>'chunk')::int = 0`,
			strconv.FormatInt(first, 10), ago)
		require.NoError(t, err)
		due, err = db.DueJobArgs(ctx, tdb.Pool, chunkKinds, QueueBulk, at, at, 3)
		require.NoError(t, err)
		var again []int64
		for _, job := range due {
			a, err := ChunkArgs(job.Kind, job.Args)
			require.NoError(t, err)
			if a.Chunk == 0 {
				again = append(again, a.MessageID)
			}
		}
		if ago < db.WarmedBy {
			require.Equal(t, []int64{second}, again, "a first chunk that began %s ago is warm", ago)
		} else {
			require.ElementsMatch(t, []int64{first, second}, again, "a first chunk that began %s ago is cold again", ago)
		}
	}
	// An instant with nothing due, and a lane this worker does not serve,
	// are no work.
	require.NoError(t, w.Warm(ctx, QueueBulk, at.Add(time.Second)))
	require.NoError(t, w.Warm(ctx, QueueUrgent, at))
}

// TestWakerWarmsEachInstantBeforeIt checks that the Waker asks for each
// instant's warm-up once, before the instant, with a context that ends at
// it.
func TestWakerWarmsEachInstantBeforeIt(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	tdb := dbtest.New(t)
	q := db.On(tdb.Pool)
	users := registerUsers(t, q, "ww", 2)
	client, err := NewRiverClient(tdb.Pool, RiverConfig{Logger: discard})
	require.NoError(t, err)
	clock := NewClock(tdb.Pool, discard)
	require.NoError(t, clock.Measure(ctx))

	type call struct {
		queue    string
		at, when time.Time
		deadline time.Time
	}
	var mu sync.Mutex
	var calls []call
	waker, err := NewWaker(&WakerConfig{
		Pool: tdb.Pool, Clock: clock, Logger: discard, Every: 100 * time.Millisecond,
		Lanes: map[string]func(context.Context) error{QueueBulk: RiverNotify(tdb.Pool, QueueBulk)},
		Warm: func(ctx context.Context, queue string, at time.Time) error {
			deadline, _ := ctx.Deadline()
			mu.Lock()
			defer mu.Unlock()
			calls = append(calls, call{queue, at, clock.Now(), deadline})
			return nil
		},
	})
	require.NoError(t, err)
	now, err := q.DatabaseNow(ctx)
	require.NoError(t, err)
	at := now.Add(1500 * time.Millisecond)
	scheduleAt(t, tdb.Pool, NewEnqueuer(client, 0), PriorityBulk, users, at)
	_, err = db.PromoteDueJobs(ctx, tdb.Pool, []string{QueueBulk}, time.Minute, 100)
	require.NoError(t, err)
	go waker.Run(ctx)

	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(calls) > 0
	}, 10*time.Second, 20*time.Millisecond)
	// Several more looks ahead see the same instant.
	time.Sleep(500 * time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, calls, 1, "one warm-up per instant")
	c := calls[0]
	require.Equal(t, QueueBulk, c.queue)
	require.True(t, c.at.Equal(at), "warmed %s, due %s", c.at, at)
	require.True(t, c.when.Before(at), "warmed at %s, due %s", c.when, at)
	require.WithinDuration(t, at.Add(-clock.Offset()), c.deadline, time.Millisecond, "the warm-up ends at the instant")
}

// TestWarmOpensTheConnectionsOfAnInstant: the warm-up reads the instant's
// chunks side by side, so that the lane's pool has open, primed connections
// for the chunks that begin together (a pool opens connections only as
// they are wanted, and one opened at the instant is a backend started when
// the machine is busiest), leaving warmSpare of them to the rest.
func TestWarmOpensTheConnectionsOfAnInstant(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tdb := dbtest.New(t)
	q := db.On(tdb.Pool)
	users := registerUsers(t, q, "wc", 30)
	client, err := NewRiverClient(tdb.Pool, RiverConfig{Logger: discard})
	require.NoError(t, err)
	enq := NewEnqueuer(client, firstChunkSize)
	now, err := q.DatabaseNow(ctx)
	require.NoError(t, err)
	at := now.Add(time.Minute).Truncate(time.Millisecond)
	for range 12 {
		scheduleAt(t, tdb.Pool, enq, PriorityBulk, users, at)
	}
	_, err = db.PromoteDueJobs(ctx, tdb.Pool, []string{QueueBulk}, 2*time.Minute, 100)
	require.NoError(t, err)

	cfg := tdb.Pool.Config()
	cfg.MaxConns, cfg.MinConns = 8, 0
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	defer pool.Close()
	w := NewFanOutWorker(FanOutConfig{Pool: pool, Logger: discard, Clock: NewClock(pool, discard),
		Lanes: []Lane{{Queue: QueueBulk, Workers: 12}}})
	require.NoError(t, w.Warm(ctx, QueueBulk, at))
	// Twelve first chunks begin together: six reads start together, each
	// on a connection of its own unless one came back first (one read
	// takes less than opening a connection).
	opened := pool.Stat().TotalConns()
	require.GreaterOrEqual(t, opened, int32(4), "the warm-up opened the connections its twelve chunks begin on")
	require.LessOrEqual(t, opened, int32(8-warmSpare), "and left warmSpare to the rest")
	// One message's chunks begin its first and a quarter of the pool's
	// connections' worth of others: the warm-up opens no more.
	one := []FanOutArgs{{Chunk: 0}, {Chunk: 1}, {Chunk: 2}, {Chunk: 3}, {Chunk: 4}}
	require.Equal(t, 20/4+1, warmConns(20, newBeginGate(20/4, firstsWait).othersAtOnce(), one))
	require.Equal(t, 20-warmSpare, warmConns(20, 20/4, slices.Repeat([]FanOutArgs{{Chunk: 0}}, 30)))
}
