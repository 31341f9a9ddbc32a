package jobs

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"
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

// TestReconcilerRunsAgainAChunkCompletedWithoutItsClose: a failover to a
// standby that never received a chunk's close, while River's completer
// wrote the chunk's completion on the promoted standby, leaves the chunk
// job completed, its message dispatching and its deliveries pending with
// no attempt to send them. That is the state made here, as the new primary
// holds it: the message begun, the close missing, the job completed. Once
// the completion is older than a chunk attempt, the reconciler makes the
// job available again with the reason among its errors, and the chunk's
// next attempt sends and settles the message. A chunk completed more
// recently is left to the attempt that may still close it, and one whose
// close was written is left alone.
func TestReconcilerRunsAgainAChunkCompletedWithoutItsClose(t *testing.T) {
	t.Parallel()
	b := setupFanOut(t)
	ctx := context.Background()
	now := b.clock.Now()
	users := b.devices("apns-1", "apns-2", "fcm-1", "fcm-2", "fcm-3", "fcm-4")
	sender := &recordingSender{}
	w := b.worker(map[string]Sender{ChannelAPNs: sender, ChannelFCM: sender}, FanOutConfig{})

	lost := b.message(users[:2], now.Add(-10*time.Minute), time.Hour)
	// The same, on its last attempt: River would start no other.
	last := b.message(users[2:3], now.Add(-10*time.Minute), time.Hour)
	recent := b.message(users[3:4], now.Add(-10*time.Minute), time.Hour)
	closed := b.message(users[4:], now.Add(-10*time.Minute), time.Hour)
	require.Equal(t, river.EventKindJobCompleted, b.workCommitted(w, closed.job.ID).EventKind)
	require.Equal(t, StateDispatched, b.settled(closed.msg.ID).State)
	for _, c := range []struct {
		chunk     chunkJob
		completed string
		attempt   string
	}{{lost, "2 minutes", "1"}, {last, "2 minutes", "max_attempts"}, {recent, "10 seconds", "1"}} {
		require.NoError(t, b.q.StartMessage(ctx, c.chunk.msg.ID))
		_, err := b.db.Pool.Exec(ctx, `UPDATE river_job SET state = 'completed', attempt = `+c.attempt+`,
			attempted_at = now() - interval '3 minutes', attempted_by = '{herald-1-bulk}', finalized_at = now() - $2::interval
			WHERE id = $1`, c.chunk.job.ID, c.completed)
		require.NoError(t, err)
	}

	m := NewMetrics(prometheus.NewRegistry())
	r, err := NewReconciler(&ReconcilerConfig{Pool: b.db.Pool, Logger: discard, Metrics: m, AttemptSpan: time.Minute})
	require.NoError(t, err)
	done, err := r.Run(ctx)
	require.NoError(t, err)
	require.Equal(t, Reconciled{Chunks: 2}, done)
	require.EqualValues(t, 2, counterValue(t, m.reconciledChunks))
	for _, c := range []chunkJob{lost, last} {
		job, err := b.client.JobGet(ctx, c.job.ID)
		require.NoError(t, err)
		require.Equal(t, rivertype.JobStateAvailable, job.State)
		require.Nil(t, job.FinalizedAt)
		require.Less(t, job.Attempt, job.MaxAttempts, "no attempt left to run it")
		require.NotEmpty(t, job.Errors)
		require.Contains(t, job.Errors[len(job.Errors)-1].Error, "lacks its close")
	}
	for _, c := range []chunkJob{recent, closed} {
		job, err := b.client.JobGet(ctx, c.job.ID)
		require.NoError(t, err)
		require.Equal(t, rivertype.JobStateCompleted, job.State)
	}

	// The next attempt sends what is pending and settles the message.
	require.Equal(t, river.EventKindJobCompleted, b.workCommitted(w, lost.job.ID).EventKind)
	got := b.settled(lost.msg.ID)
	require.Equal(t, StateDispatched, got.State)
	require.EqualValues(t, 2, got.AcceptedCount)
	// Closed now, it is not run a third time.
	_, err = b.db.Pool.Exec(ctx, `UPDATE river_job SET finalized_at = now() - interval '2 minutes' WHERE id = $1`, lost.job.ID)
	require.NoError(t, err)
	done, err = r.Run(ctx)
	require.NoError(t, err)
	require.Equal(t, Reconciled{}, done)
}
