package jobs

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"
	"github.com/stretchr/testify/require"

	"github.com/heraldpush/herald/db"
	"github.com/heraldpush/herald/db/dbtest"
	"github.com/heraldpush/herald/jobs/push"
)

var discard = slog.New(slog.NewTextHandler(io.Discard, nil))

// registerUsers gives users u0..u(n-1) one FCM device each.
func registerUsers(t testing.TB, q *db.Queries, prefix string, n int) []string {
	t.Helper()
	ctx := context.Background()
	users := make([]string, n)
	p := db.RegisterDevicesParams{}
	for i := range users {
		users[i] = fmt.Sprintf("%s%03d", prefix, i)
		p.UserIds = append(p.UserIds, users[i])
		p.Channels = append(p.Channels, "fcm")
		p.Tokens = append(p.Tokens, "tok-"+users[i])
		p.P256dhs = append(p.P256dhs, "")
		p.Auths = append(p.Auths, "")
	}
	require.NoError(t, q.EnsureUsers(ctx, users))
	_, err := q.RegisterDevices(ctx, p)
	require.NoError(t, err)
	return users
}

// startRecorder is a chunk worker that only records when each chunk
// started, by the database's clock (River sets attempted_at with now() in
// its fetch), against the instant it was scheduled for.
type startRecorder struct {
	river.WorkerDefaults[FanOutArgs]
	mu     sync.Mutex
	starts map[int64]time.Duration // message id -> attempted_at - scheduled_at
}

func (r *startRecorder) Work(_ context.Context, job *river.Job[FanOutArgs]) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.starts[job.Args.MessageID] = job.AttemptedAt.Sub(job.ScheduledAt)
	return nil
}

func (r *startRecorder) lag(id int64) (time.Duration, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	d, ok := r.starts[id]
	return d, ok
}

// TestChunksStartOnTime schedules chunks 1 s, 3 s and 8 s ahead and checks
// that none starts before its time and each starts well inside River's own
// 5 s scheduling cadence. It runs once with the default look-ahead (every
// chunk inserted available) and once with a short one (the later chunks
// inserted scheduled and made available by the promoter).
func TestChunksStartOnTime(t *testing.T) {
	t.Parallel()
	for _, lookahead := range []time.Duration{10 * time.Second, 2 * time.Second} {
		t.Run(fmt.Sprintf("lookahead %s", lookahead), func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			tdb := dbtest.New(t)
			q := db.On(tdb.Pool)
			users := registerUsers(t, q, "u", 3)
			rec, client := startRecorderClient(t, ctx, tdb.Pool, RiverConfig{Lookahead: lookahead})
			promoter := &Promoter{Pool: tdb.Pool, Logger: discard, Lookahead: lookahead, Interval: 200 * time.Millisecond}
			go promoter.Run(ctx)

			enq := NewEnqueuer(client, 0)
			now, err := q.DatabaseNow(ctx)
			require.NoError(t, err)
			ids := map[time.Duration]int64{}
			for _, ahead := range []time.Duration{time.Second, 3 * time.Second, 8 * time.Second} {
				ids[ahead] = scheduleAt(t, tdb.Pool, enq, PriorityBulk, users, now.Add(ahead))
			}
			for ahead, id := range ids {
				rec.requireOnTime(t, id, ahead, fmt.Sprintf("the chunk %s ahead", ahead))
			}
		})
	}
}

// startRecorderClient starts a River client with cfg whose chunk worker is
// a startRecorder, until ctx is done.
func startRecorderClient(t *testing.T, ctx context.Context, pool *pgxpool.Pool, cfg RiverConfig) (*startRecorder, *river.Client[pgx.Tx]) {
	t.Helper()
	rec := &startRecorder{starts: map[int64]time.Duration{}}
	cfg.Logger, cfg.Workers = discard, river.NewWorkers()
	river.AddWorker(cfg.Workers, rec)
	client, err := NewRiverClient(pool, cfg)
	require.NoError(t, err)
	require.NoError(t, client.Start(ctx))
	t.Cleanup(func() { _ = client.Stop(context.Background()) })
	return rec, client
}

// scheduleAt creates a message to users due at dispatchAt and returns its id.
func scheduleAt(t *testing.T, pool *pgxpool.Pool, enq *Enqueuer, priority string, users []string, dispatchAt time.Time) int64 {
	t.Helper()
	ctx := context.Background()
	var msg db.Message
	require.NoError(t, db.InTx(ctx, pool, func(tx pgx.Tx) error {
		var err error
		msg, err = enq.Create(ctx, tx, MessageSpec{
			Priority: priority, DispatchAt: dispatchAt, ExpiresAt: dispatchAt.Add(time.Hour),
			Audience: Audience{UserIDs: users}, AudienceJSON: []byte(`{}`),
			Content: push.Content{Title: "t"},
		})
		return err
	}))
	return msg.ID
}

// requireOnTime waits for message id's chunk to start, at most ahead and
// 10 s more, and checks that it started at its time or within 1.5 s after.
func (r *startRecorder) requireOnTime(t *testing.T, id int64, ahead time.Duration, what string) {
	t.Helper()
	var lag time.Duration
	require.Eventually(t, func() bool {
		var ok bool
		lag, ok = r.lag(id)
		return ok
	}, ahead+10*time.Second, 10*time.Millisecond, "%s never started", what)
	t.Logf("%s started %s after its time", what, lag)
	require.GreaterOrEqual(t, lag, time.Duration(0), "%s started before its time", what)
	require.Less(t, lag, 1500*time.Millisecond, "%s started late", what)
}

// TestCancel cancels a scheduled message of two chunks: the message, its
// pending deliveries and its chunk jobs end cancelled in the caller's
// transaction, and cancelling it again changes nothing and says so.
func TestCancel(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tdb := dbtest.New(t)
	q := db.On(tdb.Pool)
	users := registerUsers(t, q, "c", 3)
	client, err := NewRiverClient(tdb.Pool, RiverConfig{Logger: discard})
	require.NoError(t, err)
	enq := NewEnqueuer(client, 2)
	id := scheduleAt(t, tdb.Pool, enq, PriorityBulk, users, time.Now().Add(time.Hour))

	cancel := func() bool {
		var cancelled bool
		require.NoError(t, db.InTx(ctx, tdb.Pool, func(tx pgx.Tx) error {
			cancelled, err = enq.Cancel(ctx, tx, id)
			return err
		}))
		return cancelled
	}
	require.True(t, cancel())
	m, err := q.GetMessage(ctx, id)
	require.NoError(t, err)
	require.Equal(t, StateCancelled, m.State)
	require.EqualValues(t, 3, m.CancelledCount)
	deliveries, err := q.ListDeliveries(ctx, db.ListDeliveriesParams{MessageID: id, PageSize: 10})
	require.NoError(t, err)
	require.Len(t, deliveries, 3)
	for _, d := range deliveries {
		require.Equal(t, "cancelled", d.Status)
	}
	jobIDs, err := q.MessageChunkJobs(ctx, id)
	require.NoError(t, err)
	require.Len(t, jobIDs, 2)
	for _, jobID := range jobIDs {
		job, err := client.JobGet(ctx, jobID)
		require.NoError(t, err)
		require.Equal(t, rivertype.JobStateCancelled, job.State)
	}

	require.False(t, cancel(), "a message cancelled already is not cancelled again")
}

func TestCut(t *testing.T) {
	t.Parallel()
	a, b := time.Unix(100, 0), time.Unix(200, 0)
	var targets []target
	for i := range 7 {
		due := a
		if i%2 == 1 {
			due = b
		}
		targets = append(targets, target{Target: Target{Target: push.Target{DeviceID: int64(i)}}, dueAt: due})
	}
	chunks := cut(targets, 2)
	// Due a: devices 0, 2, 4, 6; due b: 1, 3, 5. Never mixed, at most 2 each.
	var got [][]int64
	for _, c := range chunks {
		var ids []int64
		for _, tg := range c.targets {
			require.True(t, tg.dueAt.Equal(c.dueAt))
			ids = append(ids, tg.DeviceID)
		}
		got = append(got, ids)
	}
	require.Equal(t, [][]int64{{0, 2}, {1, 3}, {4, 6}, {5}}, got)
	require.Empty(t, cut(nil, 500))
}
