package jobs

import (
	"context"
	"testing"
	"time"

	"github.com/riverqueue/river"
	"github.com/stretchr/testify/require"

	"github.com/heraldpush/herald/db/dbtest"
)

func TestParseLanes(t *testing.T) {
	for in, want := range map[string]Lanes{
		"":              AllLanes,
		" ":             AllLanes,
		"urgent":        {Urgent: true},
		"bulk":          {Bulk: true},
		"bulk, urgent":  AllLanes,
		"urgent,urgent": {Urgent: true},
	} {
		got, err := ParseLanes(in)
		require.NoError(t, err, in)
		require.Equal(t, want, got, in)
		again, err := ParseLanes(got.String())
		require.NoError(t, err)
		require.Equal(t, got, again, "String reads back")
	}
	for _, in := range []string{"fast", "urgent,", "urgent;bulk"} {
		_, err := ParseLanes(in)
		require.Error(t, err, in)
	}
}

// TestUrgentClientLeadsWithTheMaterializer starts a worker's urgent River
// client alone, so that it wins River's leader election: the leader must
// enqueue the schedule materializer, whichever client it is. When only the
// main client had it, an urgent client that led meant no schedule run was
// ever made (seen as TestE2EScheduleEveryMinute failing one run in ten).
func TestUrgentClientLeadsWithTheMaterializer(t *testing.T) {
	t.Parallel()
	tdb := dbtest.New(t)
	workers := river.NewWorkers()
	Register(workers, FanOutConfig{Pool: tdb.Pool, Logger: discard}, &Materializer{Pool: tdb.Pool, Logger: discard}, &Retainer{Pool: tdb.Pool, Logger: discard})
	urgent, err := NewUrgentRiverClient(RiverConfig{
		Logger: discard, Workers: workers, UrgentPool: tdb.Pool, MaterializeEvery: 100 * time.Millisecond,
	})
	require.NoError(t, err)
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
