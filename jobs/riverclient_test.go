package jobs

import (
	"context"
	"testing"
	"time"

	"github.com/riverqueue/river"
	"github.com/stretchr/testify/require"

	"github.com/heraldpush/herald/db/dbtest"
)

// TestUrgentClientLeadsWithTheMaterializer starts a worker's urgent River
// client alone, so that it wins River's leader election: the leader must
// enqueue the schedule materializer, whichever client it is. When only the
// main client had it, an urgent client that led meant no schedule run was
// ever made (seen as TestScheduleEveryMinute failing one run in ten).
func TestUrgentClientLeadsWithTheMaterializer(t *testing.T) {
	t.Parallel()
	tdb := dbtest.New(t)
	workers := river.NewWorkers()
	materializer, err := NewMaterializer(&MaterializerConfig{Pool: tdb.Pool, Logger: discard})
	require.NoError(t, err)
	_, err = Register(workers, FanOutConfig{Pool: tdb.Pool, Logger: discard}, materializer, newRetainer(t, RetainerConfig{Pool: tdb.Pool, Logger: discard}))
	require.NoError(t, err)
	clients, err := NewRiverClients(tdb.Pool, RiverConfig{
		Logger: discard, Workers: workers, Lanes: []Lane{{Queue: QueueUrgent, Pool: tdb.Pool}},
		MaterializeEvery: 100 * time.Millisecond,
	})
	require.NoError(t, err)
	urgent := clients.byQueue[QueueUrgent]
	require.NotSame(t, clients.Main, urgent, "a lane with a pool of its own has a client of its own")
	ctx := context.Background()
	require.NoError(t, urgent.Start(ctx))
	t.Cleanup(func() {
		stopCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		require.NoError(t, urgent.Stop(stopCtx))
	})
	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, tdb.Pool.QueryRow(ctx, `SELECT count(*) FROM river_job WHERE kind = $1`, MaterializeKind).Scan(&n))
		return n > 0
	}, 20*time.Second, 50*time.Millisecond, "the urgent client led, and enqueued no materializer")
}
