package jobs

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"
	"github.com/stretchr/testify/require"

	"github.com/heraldpush/herald/db"
	"github.com/heraldpush/herald/db/dbtest"
)

// TestLivenessLetsGoAndTakesItBack: a worker whose lock's session ends no
// longer claims to be alive, FenceAfter after its last good ping, while
// another session holds its key, and claims it again, under the same key,
// once it can take the lock back. (FenceAfter is long here so that a busy
// machine's slow connect cannot fence it before the test looks.)
func TestLivenessLetsGoAndTakesItBack(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	tdb := dbtest.New(t)
	l, err := NewLiveness(&LivenessConfig{ConnConfig: tdb.Pool.Config().ConnConfig, Logger: discard, Ping: 20 * time.Millisecond, FenceAfter: 2 * time.Second})
	require.NoError(t, err)
	conn, err := l.Acquire(ctx)
	require.NoError(t, err)
	require.True(t, l.Held())

	// Its session ends (the database restarted, a proxy cut it) and, before
	// it notices, another session takes the key.
	_, err = tdb.Pool.Exec(ctx, `SELECT pg_terminate_backend($1)`, conn.PgConn().PID())
	require.NoError(t, err)
	other, err := pgx.ConnectConfig(ctx, tdb.Pool.Config().ConnConfig)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		ok, err := db.TryLivenessLock(ctx, other, l.key)
		return err == nil && ok
	}, 10*time.Second, 10*time.Millisecond)

	done := make(chan struct{})
	go func() { defer close(done); l.Run(ctx, conn) }()
	require.Eventually(t, func() bool { return !l.Held() }, 10*time.Second, 5*time.Millisecond,
		"the lost lock is still claimed")
	require.NoError(t, other.Close(ctx))
	require.Eventually(t, l.Held, 10*time.Second, 5*time.Millisecond, "the lock was never taken back")
	cancel()
	<-done
	require.False(t, l.Held(), "a stopped Liveness claims nothing")
}

// TestTakeoverWaitsForTheGrace: a running chunk whose worker's lock is
// free is made available once the lock has been seen free for the grace,
// not before, and only once.
func TestTakeoverWaitsForTheGrace(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tdb := dbtest.New(t)
	client, res := runningChunk(t, tdb, "herald-5-bulk")

	var woken []string
	takeover, err := NewTakeover(&TakeoverConfig{Pool: tdb.Pool, Logger: discard, Grace: 2 * time.Second,
		Wake: func(_ context.Context, queue string) { woken = append(woken, queue) }})
	require.NoError(t, err)
	state := func() rivertype.JobState {
		job, err := client.JobGet(ctx, res.Job.ID)
		require.NoError(t, err)
		return job.State
	}
	seen := map[db.AbandonedChunk]time.Time{}
	start := time.Now()
	for _, after := range []time.Duration{0, time.Second, 1999 * time.Millisecond} {
		require.NoError(t, takeover.pass(ctx, seen, start.Add(after)))
		require.Equal(t, rivertype.JobStateRunning, state(), "taken %s after its worker was first seen gone", after)
	}
	require.NoError(t, takeover.pass(ctx, seen, start.Add(2*time.Second)))
	require.Equal(t, rivertype.JobStateAvailable, state())
	require.Equal(t, []string{QueueBulk}, woken)
	require.Empty(t, seen)
	require.NoError(t, takeover.pass(ctx, seen, start.Add(5*time.Second)))
	require.Equal(t, []string{QueueBulk}, woken, "an available chunk is nobody's to take")
}

// TestTakeoverEndsASilentWorker: a worker whose liveness session stays
// open but says nothing (a frozen process, a host cut off: no FIN reaches
// PostgreSQL) keeps its lock until Takeover finds it silent for the lease
// and ends its session; then its running chunk is taken like a dead
// worker's, and not before.
func TestTakeoverEndsASilentWorker(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tdb := dbtest.New(t)
	client, res := runningChunk(t, tdb, "herald-6-bulk")
	frozen, err := pgx.ConnectConfig(ctx, tdb.Pool.Config().ConnConfig)
	require.NoError(t, err)
	defer frozen.Close(ctx)
	ok, err := db.TryLivenessLock(ctx, frozen, 6)
	require.NoError(t, err)
	require.True(t, ok)

	const lease = 1500 * time.Millisecond
	takeover, err := NewTakeover(&TakeoverConfig{Pool: tdb.Pool, Logger: discard, Grace: time.Millisecond, Lease: lease})
	require.NoError(t, err)
	state := func() rivertype.JobState {
		job, err := client.JobGet(ctx, res.Job.ID)
		require.NoError(t, err)
		return job.State
	}
	seen := map[db.AbandonedChunk]time.Time{}
	tookLock := time.Now()
	require.NoError(t, takeover.pass(ctx, seen, time.Now()))
	require.Equal(t, rivertype.JobStateRunning, state(), "a worker silent for less than the lease keeps its chunk")
	require.Empty(t, seen)
	require.NoError(t, frozen.Ping(ctx), "its session is still open")

	time.Sleep(lease - time.Since(tookLock) + 100*time.Millisecond)
	require.Eventually(t, func() bool {
		require.NoError(t, takeover.pass(ctx, seen, time.Now()))
		return state() == rivertype.JobStateAvailable
	}, 10*time.Second, 20*time.Millisecond, "the silent worker's chunk was never taken")
	require.Error(t, frozen.Ping(ctx), "the silent worker's session was ended")
	_, err = NewTakeover(&TakeoverConfig{Pool: tdb.Pool, Logger: discard, Lease: DefaultLivenessFence})
	require.ErrorContains(t, err, "Lease", "a lease within the workers' fence would end a session whose worker may still send")
}

// runningChunk inserts a chunk job and leaves it as River's fetch leaves a
// job it runs, under the River client named clientID (a worker's, named
// after its liveness key).
func runningChunk(t *testing.T, tdb *dbtest.DB, clientID string) (*river.Client[pgx.Tx], *rivertype.JobInsertResult) {
	t.Helper()
	ctx := context.Background()
	client, err := NewRiverClient(tdb.Pool, RiverConfig{Logger: discard})
	require.NoError(t, err)
	res, err := client.Insert(ctx, FanOutArgs{MessageID: 1, Priority: PriorityBulk, DispatchAt: time.Now(), ExpiresAt: time.Now().Add(time.Hour)}, nil)
	require.NoError(t, err)
	_, err = tdb.Pool.Exec(ctx, `UPDATE river_job SET state = 'running', attempt = 1, attempted_at = now(), attempted_by = ARRAY[$2::text] WHERE id = $1`, res.Job.ID, clientID)
	require.NoError(t, err)
	return client, res
}
