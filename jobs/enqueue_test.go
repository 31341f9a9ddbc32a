package jobs

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"runtime"
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

// chunkSizes are the sizes of a message's chunks in the ledger, in chunk
// order, checking that they are ranges of devices in order.
func chunkSizes(t *testing.T, pool *pgxpool.Pool, id int64) []int {
	t.Helper()
	rows, err := pool.Query(context.Background(), `
		SELECT count(*), min(device_id), max(device_id) FROM ledger
		WHERE message_id = $1 GROUP BY chunk ORDER BY chunk`, id)
	require.NoError(t, err)
	defer rows.Close()
	var sizes []int
	var last int64
	for rows.Next() {
		var n int
		var first, end int64
		require.NoError(t, rows.Scan(&n, &first, &end))
		require.Greater(t, first, last, "chunks are ranges of devices, in order")
		sizes, last = append(sizes, n), end
	}
	require.NoError(t, rows.Err())
	return sizes
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
// that each starts, and none before its time. It runs once with the default look-ahead (every
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
			promoter, err := NewPromoter(&PromoterConfig{Pool: tdb.Pool, Logger: discard, Lookahead: lookahead, Interval: 200 * time.Millisecond})
			require.NoError(t, err)
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
	AddChunkWorkers(cfg.Workers, rec)
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
// 10 s more, and checks that it did not start before its time. How soon
// after its time it starts is a speed, measured by herald bench (the
// dispatch skew), not asserted here: a busy machine would make any bound
// here either flaky or meaningless.
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
	deliveries, err := q.ListAllDeliveries(ctx, db.ListDeliveriesParams{MessageID: id, PageSize: 10})
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

// TestExpansionCutsRangesByWave schedules a local-time message, chunks of
// two, to users in three zones, one of them already past the wall time, and
// checks what each chunk's worker will read: chunks never mix due instants,
// hold at most two devices, are numbered in the order of their instants,
// and between them hold every device still to send exactly once, while the
// passed zone's devices expired at once in no chunk. Their jobs carry the
// chunks' priorities, first chunk first.
func TestExpansionCutsRangesByWave(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tdb := dbtest.New(t)
	q := db.On(tdb.Pool)
	client, err := NewRiverClient(tdb.Pool, RiverConfig{Logger: discard})
	require.NoError(t, err)
	zones := map[string]string{"tokyo": "Asia/Tokyo", "paris": "Europe/Paris", "ny": "America/New_York"}
	var all []string
	for prefix, zone := range zones {
		// Users registered in turns, so that each zone's device ids
		// interleave with the others'.
		users := registerUsers(t, q, prefix, 3)
		for _, u := range users {
			_, err := q.UpsertUser(ctx, db.UpsertUserParams{ID: u, Timezone: &zone})
			require.NoError(t, err)
		}
		all = append(all, users...)
	}
	for _, prefix := range []string{"tokyo", "paris", "ny"} {
		registerUsers(t, q, prefix+"-2nd-", 2)
		for i := range 2 {
			u := fmt.Sprintf("%s-2nd-%03d", prefix, i)
			zone := zones[prefix]
			_, err := q.UpsertUser(ctx, db.UpsertUserParams{ID: u, Timezone: &zone})
			require.NoError(t, err)
			all = append(all, u)
		}
	}
	// 12:00 wall time on a day when it is between 12:00 in Tokyo and in
	// Paris: Tokyo's time has passed, Paris's and New York's have not.
	now := time.Date(2026, 6, 1, 6, 0, 0, 0, time.UTC) // 15:00 Tokyo, 08:00 Paris, 02:00 New York
	var msg db.Message
	require.NoError(t, db.InTx(ctx, tdb.Pool, func(tx pgx.Tx) error {
		msg, err = NewEnqueuer(client, 2).Create(ctx, tx, MessageSpec{
			Priority: PriorityBulk, Audience: Audience{UserIDs: all}, AudienceJSON: []byte(`{}`),
			Content: push.Content{Title: "t"},
			LocalTime: &LocalTime{Wall: time.Date(2026, 6, 1, 12, 0, 0, 0, time.UTC), Fallback: time.UTC,
				Now: now, Lifetime: time.Hour, JSON: []byte(`{}`)},
		})
		return err
	}))
	paris := time.Date(2026, 6, 1, 10, 0, 0, 0, time.UTC)
	newYork := time.Date(2026, 6, 1, 16, 0, 0, 0, time.UTC)
	require.EqualValues(t, 15, msg.DeviceCount)
	require.EqualValues(t, 15, msg.RecipientCount)
	require.EqualValues(t, 5, msg.ExpiredCount, "Tokyo's time had passed")
	require.EqualValues(t, 10, msg.PendingCount)
	require.EqualValues(t, 6, msg.ChunkCount, "two waves of five, in chunks of two")
	require.True(t, msg.DispatchAt.Equal(paris), msg.DispatchAt)
	require.True(t, msg.ExpiresAt.Equal(newYork.Add(time.Hour)), msg.ExpiresAt)

	jobIDs, err := q.MessageChunkJobs(ctx, msg.ID)
	require.NoError(t, err)
	require.Len(t, jobIDs, 6)
	seen := map[int64]int{}
	var lastDue time.Time
	for i, id := range jobIDs {
		job, err := client.JobGet(ctx, id)
		require.NoError(t, err)
		var a FanOutArgs
		a, err = ChunkArgs(job.Kind, job.EncodedArgs)
		require.NoError(t, err)
		require.Equal(t, i, a.Chunk)
		require.Equal(t, chunkPriority(int32(i)), job.Priority)
		require.True(t, job.ScheduledAt.Equal(a.DispatchAt))
		require.True(t, a.DispatchAt.Equal(paris) || a.DispatchAt.Equal(newYork), a.DispatchAt)
		require.False(t, a.DispatchAt.Before(lastDue), "chunks are numbered in the order of their waves")
		lastDue = a.DispatchAt
		targets := chunkTargets(t, q, a)
		require.NotEmpty(t, targets)
		require.LessOrEqual(t, len(targets), 2)
		for _, tg := range targets {
			require.GreaterOrEqual(t, tg.DeviceID, a.FirstDevice)
			require.LessOrEqual(t, tg.DeviceID, a.LastDevice)
			seen[tg.DeviceID]++
		}
	}
	require.Len(t, seen, 10)
	for id, n := range seen {
		require.Equal(t, 1, n, "device %d", id)
	}
	var expired []string
	require.NoError(t, pgxscan(ctx, tdb.Pool, &expired, `SELECT user_id FROM ledger WHERE message_id = $1 AND chunk = -1 AND status = 'expired' ORDER BY user_id`, msg.ID))
	require.Equal(t, []string{"tokyo-2nd-000", "tokyo-2nd-001", "tokyo000", "tokyo001", "tokyo002"}, expired)
}

// pgxscan collects the first column of query's rows into dest.
func pgxscan[T any](ctx context.Context, pool *pgxpool.Pool, dest *[]T, query string, args ...any) error {
	rows, err := pool.Query(ctx, query, args...)
	if err != nil {
		return err
	}
	*dest, err = pgx.CollectRows(rows, pgx.RowTo[T])
	return err
}

// TestSchedulingHoldsNoAudience schedules a message to 100,000 devices
// and counts what the scheduling process allocated meanwhile: less than the
// audience's tokens alone would take (a 100-byte token a device is 10 MB),
// so no Herald process holds an audience, whatever its size; only a job a
// chunk. It runs alone (no t.Parallel), so that the count is this test's.
func TestSchedulingHoldsNoAudience(t *testing.T) {
	ctx := context.Background()
	tdb := dbtest.New(t)
	const devices = 100_000
	_, err := tdb.Pool.Exec(ctx, `
		WITH u AS (INSERT INTO users (id) SELECT 'big' || g FROM generate_series(1, $1 / 2) g)
		INSERT INTO devices (user_id, channel, token)
		SELECT 'big' || (g / 2 + 1), 'fcm', 'big-' || g || ':' || repeat(md5(g::text), 3)
		FROM generate_series(0, $1 - 1) g`, devices)
	require.NoError(t, err)
	_, err = tdb.Pool.Exec(ctx, `INSERT INTO segments (id) VALUES ('big');
		INSERT INTO segment_members (segment_id, user_id) SELECT 'big', id FROM users`)
	require.NoError(t, err)
	client, err := NewRiverClient(tdb.Pool, RiverConfig{Logger: discard})
	require.NoError(t, err)

	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	var msg db.Message
	require.NoError(t, db.InTx(ctx, tdb.Pool, func(tx pgx.Tx) error {
		msg, err = NewEnqueuer(client, 500).Create(ctx, tx, MessageSpec{
			Priority: PriorityBulk, DispatchAt: time.Now().Add(time.Hour), ExpiresAt: time.Now().Add(2 * time.Hour),
			Audience: Audience{SegmentID: "big"}, AudienceJSON: []byte(`{}`), Content: push.Content{Title: "t"},
		})
		return err
	}))
	runtime.ReadMemStats(&after)
	allocated := after.TotalAlloc - before.TotalAlloc
	t.Logf("scheduled %d devices in %d chunks allocating %d KB", msg.DeviceCount, msg.ChunkCount, allocated/1024)
	require.EqualValues(t, devices, msg.DeviceCount)
	require.EqualValues(t, devices/2, msg.RecipientCount)
	// A first chunk of firstChunkSize, then chunks of 500.
	require.EqualValues(t, 1+(devices-firstChunkSize+499)/500, msg.ChunkCount)
	require.Less(t, allocated, uint64(4<<20), "scheduling allocated %d bytes for %d devices", allocated, devices)
}

// TestFirstChunkIsSmall: a message's first chunk holds its first
// firstChunkSize devices, so that it begins quickly when many messages
// fall due at once; the rest are cut in chunks of the chunk size.
func TestFirstChunkIsSmall(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tdb := dbtest.New(t)
	q := db.On(tdb.Pool)
	client, err := NewRiverClient(tdb.Pool, RiverConfig{Logger: discard})
	require.NoError(t, err)
	users := registerUsers(t, q, "u", 2*firstChunkSize+30)
	var msg db.Message
	require.NoError(t, db.InTx(ctx, tdb.Pool, func(tx pgx.Tx) error {
		msg, err = NewEnqueuer(client, firstChunkSize+20).Create(ctx, tx, MessageSpec{
			Priority: PriorityBulk, DispatchAt: time.Now().Add(time.Hour), ExpiresAt: time.Now().Add(2 * time.Hour),
			Audience: Audience{UserIDs: users}, AudienceJSON: []byte(`{}`), Content: push.Content{Title: "t"},
		})
		return err
	}))
	require.Equal(t, []int{firstChunkSize, firstChunkSize + 20, 10}, chunkSizes(t, tdb.Pool, msg.ID))
	require.EqualValues(t, 3, msg.ChunkCount)
}

// TestSnapshotsWaitForTheOlderWorkers: a message is scheduled with its
// chunks' snapshots (migration 0022) unless a process of a release without
// them reports its providers, whose worker could not send such a chunk;
// then, and always with LedgerRows, with a pending ledger row a device, in
// chunks of the kind that release runs. Its chunks write their
// acceptances as runs (migration 0028: RunsKind) unless a process of a
// release without them (one reporting FeatureSnapshots alone) is alive,
// or with LedgerSnapshots. A process that reports every feature is of this
// release.
func TestSnapshotsWaitForTheOlderWorkers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tdb := dbtest.New(t)
	q := db.On(tdb.Pool)
	users := registerUsers(t, q, "s", 3)
	client, err := NewRiverClient(tdb.Pool, RiverConfig{Logger: discard})
	require.NoError(t, err)
	written := func(enq *Enqueuer) (snapshots, rows int, kind string) {
		id := scheduleAt(t, tdb.Pool, enq, PriorityBulk, users, time.Now().Add(time.Hour))
		require.NoError(t, tdb.Pool.QueryRow(ctx, `
			SELECT (SELECT count(*) FROM chunk_devices WHERE message_id = $1),
			       (SELECT count(*) FROM deliveries WHERE message_id = $1),
			       (SELECT j.kind FROM river_job j JOIN message_chunks c ON c.job_id = j.id WHERE c.message_id = $1)`, id).
			Scan(&snapshots, &rows, &kind))
		return snapshots, rows, kind
	}
	report := func(process string, features ...string) {
		require.NoError(t, q.UpsertProviderStatus(ctx, db.UpsertProviderStatusParams{ProcessID: process, Channel: ChannelAPNs, State: BreakerClosed}))
		if features != nil {
			require.NoError(t, q.UpsertProcessFeatures(ctx, db.UpsertProcessFeaturesParams{ProcessID: process, Features: features}))
		}
	}

	report("this-release", FeatureSnapshots, FeatureRuns)
	snapshots, rows, kind := written(NewEnqueuer(client, 0))
	require.Equal(t, [2]int{1, 0}, [2]int{snapshots, rows})
	require.Equal(t, RunsKind, kind)

	snapshots, rows, kind = written(NewEnqueuer(client, 0).WithLedger(LedgerSnapshots))
	require.Equal(t, [2]int{1, 0}, [2]int{snapshots, rows}, "with a row a result")
	require.Equal(t, SnapshotKind, kind)

	snapshots, rows, kind = written(NewEnqueuer(client, 0).WithLedger(LedgerRows))
	require.Equal(t, [2]int{0, 3}, [2]int{snapshots, rows}, "with rows")
	require.Equal(t, FanOutKind, kind)

	report("runs-less-release", FeatureSnapshots)
	snapshots, rows, kind = written(NewEnqueuer(client, 0))
	require.Equal(t, [2]int{1, 0}, [2]int{snapshots, rows}, "while a worker without runs lives")
	require.Equal(t, SnapshotKind, kind)

	report("older-release")
	snapshots, rows, kind = written(NewEnqueuer(client, 0))
	require.Equal(t, [2]int{0, 3}, [2]int{snapshots, rows}, "while an older worker lives")
	require.Equal(t, FanOutKind, kind)
}
