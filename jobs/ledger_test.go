package jobs

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/heraldpush/herald/db"
	"github.com/heraldpush/herald/db/dbtest"
	"github.com/heraldpush/herald/jobs/push"
)

// TestLedgerBoundsWhatIsUnwritten: past MaxUnwritten places, a request
// waits until a written answer frees one, so that what a crash can lose
// stays bounded however slow the writes are.
func TestLedgerBoundsWhatIsUnwritten(t *testing.T) {
	t.Parallel()
	l := &ledger{chunks: map[chunkKey]*chunkRecord{}}
	for range MaxUnwritten {
		require.True(t, l.reserve(context.Background(), false))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	require.False(t, l.reserve(ctx, false), "a place past MaxUnwritten waits for one to be freed")
	got := make(chan bool, 1)
	go func() { got <- l.reserve(context.Background(), false) }()
	l.release(1)
	require.True(t, <-got, "a freed place goes to the request waiting for it")

	// A lead (a message's first devices) does not wait behind a full
	// writer; it takes a place past the bound, which it gives back.
	require.True(t, l.reserve(context.Background(), true), "a lead takes a place at once")
	require.Equal(t, MaxUnwritten+1, l.owed)
	l.release(2)
	require.True(t, l.reserve(context.Background(), false), "a place freed below the bound goes to the others again")
}

// TestLedgerRewritesRunsOnce: a chunk whose writer lost touch with the
// database writes every answer it has again at its close (ledger.lost),
// since a write whose commit went unacknowledged may or may not be in. A
// chunk that writes its acceptances as runs (migration 0028) must then
// write them as results that may exist: written as runs a second time,
// its devices would be in two runs, and counted twice.
func TestLedgerRewritesRunsOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tdb := dbtest.New(t)
	q := db.On(tdb.Pool)
	id, c := begunChunk(t, tdb, 4)
	devices := len(c.Targets)
	l := newLedger(tdb.Pool, discard, NewClock(tdb.Pool, discard), nil, time.Minute)
	results := make([]push.Result, devices)
	r := l.open(c, time.Now(), results)
	for i := range results {
		results[i] = push.Result{Accepted: true, At: time.Now()}
	}
	idx := make([]int, devices)
	for i := range idx {
		idx[i] = i
	}
	l.add(r, false, idx...)
	require.Eventually(t, func() bool {
		var runs int
		require.NoError(t, tdb.Pool.QueryRow(ctx, "SELECT count(*) FROM accepted_runs WHERE message_id = $1", id).Scan(&runs))
		return runs == 1
	}, 10*time.Second, 5*time.Millisecond, "the answers were written as a run")
	// A later write failed unacknowledged: the close writes them all again.
	l.lost()
	require.NoError(t, l.close(ctx, r, false))
	msg, err := q.GetMessage(ctx, id)
	require.NoError(t, err)
	require.Equal(t, []int32{0, int32(devices)}, []int32{msg.PendingCount, msg.AcceptedCount}, "each device counted once")
	require.Equal(t, "dispatched", msg.State)
	var listed int
	require.NoError(t, tdb.Pool.QueryRow(ctx, "SELECT count(*) FROM ledger WHERE message_id = $1", id).Scan(&listed))
	require.Equal(t, devices, listed, "each device once")
}

// TestLedgerWritesThroughOneConnection: while it runs, the writer writes
// through one connection it holds, so that its statements are planned on
// that one alone, not on whichever connection of the pool each write found
// idle.
func TestLedgerWritesThroughOneConnection(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tdb := dbtest.New(t)
	id, c := begunChunk(t, tdb, 6)
	pool, err := db.Open(ctx, tdb.URL, db.PoolConfig{MaxConns: 4})
	require.NoError(t, err)
	defer pool.Close()
	l := newLedger(pool, discard, NewClock(tdb.Pool, discard), nil, time.Minute)
	results := make([]push.Result, len(c.Targets))
	r := l.open(c, time.Now(), results)
	acquired := pool.Stat().AcquireCount()
	for i := range results {
		// One answer a write.
		results[i] = push.Result{Accepted: true, At: time.Now()}
		l.add(r, false, i)
		require.Eventually(t, func() bool {
			var n int
			require.NoError(t, tdb.Pool.QueryRow(ctx, "SELECT coalesce(sum(cardinality(devices)), 0) FROM accepted_runs WHERE message_id = $1",
				id).Scan(&n))
			return n == i+1
		}, 10*time.Second, 5*time.Millisecond, "answer %d written", i)
	}
	require.NoError(t, l.close(ctx, r, false))
	require.Equal(t, int64(1), pool.Stat().AcquireCount()-acquired, "%d writes", len(results)+1)
}

// begunChunk schedules a bulk message to n users of a device each, due
// now, and begins its first chunk as a worker does.
func begunChunk(t *testing.T, tdb *dbtest.DB, n int) (id int64, c *running) {
	t.Helper()
	ctx := context.Background()
	users := registerUsers(t, db.On(tdb.Pool), "rw", n)
	client, err := NewRiverClient(tdb.Pool, RiverConfig{Logger: discard})
	require.NoError(t, err)
	id = scheduleAt(t, tdb.Pool, NewEnqueuer(client, 0), PriorityBulk, users, time.Now().Add(-time.Second))
	var args []byte
	var kind string
	require.NoError(t, tdb.Pool.QueryRow(ctx, `
		SELECT j.kind, j.args FROM river_job j JOIN message_chunks c ON c.job_id = j.id
		WHERE c.message_id = $1 AND c.chunk = 0`, id).Scan(&kind, &args))
	require.Equal(t, RunsKind, kind)
	a, err := ChunkArgs(kind, args)
	require.NoError(t, err)
	begun, err := db.BeginChunk(ctx, tdb.Pool, a.ledgerRange(), 0)
	require.NoError(t, err)
	c = &running{FanOutArgs: a, Targets: make([]Target, len(begun.Pending)), Execution: executionOf(1, 1)}
	for i, r := range begun.Pending {
		c.Targets[i] = targetOf(r)
	}
	require.Len(t, c.Targets, n)
	return id, c
}
