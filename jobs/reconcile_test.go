package jobs

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"

	"github.com/heraldpush/herald/db"
)

// TestReconcilerSettlesWhatNoChunkWill: a message whose chunk job was
// discarded stays dispatching with deliveries pending; once past its expiry
// by the grace the reconciler expires them and settles it, and until then
// its chunk is counted stranded. Messages still alive, or whose chunk will
// still run, are left alone.
func TestReconcilerSettlesWhatNoChunkWill(t *testing.T) {
	t.Parallel()
	b := setupFanOut(t)
	ctx := context.Background()
	now := b.clock.Now()
	users := b.devices("apns-1", "apns-2", "apns-3", "apns-4", "fcm-1", "fcm-2", "fcm-3")

	// Expired ten minutes ago; one device was reached before its chunk
	// was discarded.
	stuck := b.message(users[:2], now.Add(-time.Hour), 50*time.Minute)
	require.NoError(t, b.q.StartMessage(ctx, stuck.msg.ID))
	var reached db.RecordResultsParams
	reached.Add(stuck.args.delivery(&stuck.targets[0]), "accepted", "", now.Add(-time.Hour).UnixMicro(), now.Add(-time.Hour).UnixMicro())
	_, err := b.q.RecordResults(ctx, reached)
	require.NoError(t, err)
	// Expired ten minutes ago, never started, its chunk cancelled.
	never := b.message(users[2:4], now.Add(-time.Hour), 50*time.Minute)
	// Alive for another hour, its chunk discarded: stranded, not settled.
	alive := b.message(users[4:6], now.Add(-time.Minute), 2*time.Hour)
	// Expired within the grace: a chunk attempt might still be finishing.
	recent := b.message(users[6:], now.Add(-time.Hour), 58*time.Minute)
	for _, c := range []struct {
		chunk chunkJob
		state string
	}{{stuck, "discarded"}, {never, "cancelled"}, {alive, "discarded"}, {recent, "discarded"}} {
		_, err := b.db.Pool.Exec(ctx, `UPDATE river_job SET state = $2, finalized_at = now() WHERE id = $1`, c.chunk.job.ID, c.state)
		require.NoError(t, err)
	}

	stranded, err := db.StrandedChunks(ctx, b.db.Pool)
	require.NoError(t, err)
	require.EqualValues(t, 4, stranded)

	m := NewMetrics(prometheus.NewRegistry())
	r, err := NewReconciler(&ReconcilerConfig{Pool: b.db.Pool, Logger: discard, Metrics: m, Grace: 5 * time.Minute})
	require.NoError(t, err)
	done, err := r.Run(ctx)
	require.NoError(t, err)
	require.Equal(t, Reconciled{Messages: 2, Deliveries: 3}, done)
	require.EqualValues(t, 2, counterValue(t, m.reconciledMessages))
	// The devices are user-a to user-g in token order: the two settled
	// messages' four devices are APNs ones.
	require.EqualValues(t, 3, counterValue(t, m.reconciledExpired.WithLabelValues(ChannelAPNs)))
	// Both missed the SLO: a delivery of each expired unsent, though one
	// of the first message's was reached at once.
	require.EqualValues(t, 2, counterValue(t, m.overSLO.WithLabelValues(PriorityBulk)))
	require.Equal(t, sloGrades{count: 2, withinSLO: 0}, gradesOf(t, m, PriorityBulk))

	got := b.settled(stuck.msg.ID)
	require.Equal(t, StateDispatched, got.State)
	require.EqualValues(t, 1, got.AcceptedCount)
	require.EqualValues(t, 1, got.ExpiredCount)
	require.EqualValues(t, 0, got.PendingCount)
	got = b.settled(never.msg.ID)
	require.Equal(t, StateExpired, got.State)
	require.EqualValues(t, 2, got.ExpiredCount)
	for _, c := range []chunkJob{alive, recent} {
		got, err := b.q.GetMessage(ctx, c.msg.ID)
		require.NoError(t, err)
		require.Equal(t, StateScheduled, got.State)
		require.EqualValues(t, len(c.targets), got.PendingCount)
	}

	stranded, err = db.StrandedChunks(ctx, b.db.Pool)
	require.NoError(t, err)
	require.EqualValues(t, 2, stranded, "the live messages' chunks are still stranded")

	// Nothing more to do on a second pass.
	done, err = r.Run(ctx)
	require.NoError(t, err)
	require.Equal(t, Reconciled{}, done)
}

// counterValue reads a counter's value.
func counterValue(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	require.NoError(t, c.Write(&m))
	return m.GetCounter().GetValue()
}
