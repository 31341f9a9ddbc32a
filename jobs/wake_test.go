package jobs

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/heraldpush/herald/db"
	"github.com/heraldpush/herald/db/dbtest"
)

// TestWakerStartsChunksAtTheirInstant polls the lanes only once a minute:
// chunks due 1 s and 2.5 s ahead can then start on time only if the Waker
// wakes their lane at that instant, through River's insert notification.
// None may start before its time.
func TestWakerStartsChunksAtTheirInstant(t *testing.T) {
	t.Parallel()
	w := setupWaker(t, 2)
	ctx, tdb, users, rec, enq, clock, now := w.ctx, w.tdb, w.users, w.rec, w.enq, w.clock, w.now
	var mu sync.Mutex
	told := map[string][]time.Time{}
	waker, err := NewWaker(&WakerConfig{
		Pool: tdb.Pool, Clock: clock, Logger: discard, Every: 200 * time.Millisecond,
		Due: func(queue string) {
			mu.Lock()
			defer mu.Unlock()
			told[queue] = append(told[queue], clock.Now())
		},
		Lanes: map[string]func(context.Context) error{
			QueueUrgent: RiverNotify(tdb.Pool, QueueUrgent),
			QueueBulk:   RiverNotify(tdb.Pool, QueueBulk),
		},
	})
	require.NoError(t, err)
	go waker.Run(ctx)

	urgent := scheduleAt(t, tdb.Pool, enq, PriorityUrgent, users, now.Add(time.Second))
	bulk := scheduleAt(t, tdb.Pool, enq, PriorityBulk, users, now.Add(2500*time.Millisecond))
	// Were the lanes not woken, the chunks would wait up to a minute.
	rec.requireOnTime(t, urgent, time.Second, "the urgent chunk")
	rec.requireOnTime(t, bulk, 2500*time.Millisecond, "the bulk chunk")

	// Due was told of each lane's instant as it came (the database's clock,
	// as the Clock reads it, a few milliseconds off at most).
	mu.Lock()
	defer mu.Unlock()
	for queue, at := range map[string]time.Time{QueueUrgent: now.Add(time.Second), QueueBulk: now.Add(2500 * time.Millisecond)} {
		require.NotEmpty(t, told[queue], "Due was not told of the %s lane's instant", queue)
		require.False(t, told[queue][0].Before(at.Add(-50*time.Millisecond)), "Due told of the %s lane's instant before it came", queue)
	}
}

// TestWakerWakesInstantsMomentsApartAsOne schedules four chunks two
// milliseconds apart, as chunks snoozed until the same end of quiet hours
// fall due, and one more 600 ms later: the four are woken, and warmed, once,
// at the latest of them, and every chunk still starts, none before its time
// (the lanes poll only once a minute, so only a wake starts them).
func TestWakerWakesInstantsMomentsApartAsOne(t *testing.T) {
	t.Parallel()
	w := setupWaker(t, 1)
	ctx, tdb, users, rec, enq, clock, now := w.ctx, w.tdb, w.users, w.rec, w.enq, w.clock, w.now
	base := now.Add(1500 * time.Millisecond)
	var close []int64
	for i := range 4 {
		close = append(close, scheduleAt(t, tdb.Pool, enq, PriorityBulk, users, base.Add(time.Duration(2*i)*time.Millisecond)))
	}
	apart := scheduleAt(t, tdb.Pool, enq, PriorityBulk, users, base.Add(600*time.Millisecond))

	var mu sync.Mutex
	var woken int
	var warmed []time.Time
	waker, err := NewWaker(&WakerConfig{
		Pool: tdb.Pool, Clock: clock, Logger: discard, Every: 200 * time.Millisecond,
		Due: func(queue string) {
			mu.Lock()
			defer mu.Unlock()
			woken++
		},
		Warm: func(_ context.Context, _ string, at time.Time) error {
			mu.Lock()
			defer mu.Unlock()
			warmed = append(warmed, at)
			return nil
		},
		Lanes: map[string]func(context.Context) error{QueueBulk: RiverNotify(tdb.Pool, QueueBulk)},
	})
	require.NoError(t, err)
	go waker.Run(ctx)

	for i, id := range close {
		rec.requireOnTime(t, id, 1500*time.Millisecond+time.Duration(2*i)*time.Millisecond, "a chunk moments from the others")
	}
	rec.requireOnTime(t, apart, 2100*time.Millisecond, "the chunk 600 ms later")
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, 2, woken, "the lane is woken once for the four chunks moments apart, once for the last")
	require.Len(t, warmed, 2)
	// (A message's instant is kept to the millisecond.)
	require.WithinDuration(t, base.Add(6*time.Millisecond), warmed[0], time.Millisecond, "the four are warmed at the latest of them")
	require.WithinDuration(t, base.Add(600*time.Millisecond), warmed[1], time.Millisecond)
}

// wakerTest is what a Waker's test runs on: a database with users, a River
// client whose lanes poll only once a minute, recording the chunks it
// starts, its enqueuer, a measured Clock and the database's now.
type wakerTest struct {
	ctx   context.Context
	tdb   *dbtest.DB
	users []string
	rec   *startRecorder
	enq   *Enqueuer
	clock *Clock
	now   time.Time
}

// setupWaker is a wakerTest with n users; its ctx ends with the test.
func setupWaker(t *testing.T, n int) wakerTest {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	tdb := dbtest.New(t)
	q := db.On(tdb.Pool)
	users := registerUsers(t, q, "w", n)
	rec, client := startRecorderClient(t, ctx, tdb.Pool, RiverConfig{FetchPollInterval: time.Minute})
	clock := NewClock(tdb.Pool, discard)
	require.NoError(t, clock.Measure(ctx))
	now, err := q.DatabaseNow(ctx)
	require.NoError(t, err)
	return wakerTest{ctx: ctx, tdb: tdb, users: users, rec: rec, enq: NewEnqueuer(client, 0), clock: clock, now: now}
}
