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
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	tdb := dbtest.New(t)
	q := db.On(tdb.Pool)
	users := registerUsers(t, q, "w", 2)

	rec, client := startRecorderClient(t, ctx, tdb.Pool, RiverConfig{FetchPollInterval: time.Minute})
	clock := NewClock(tdb.Pool, discard)
	require.NoError(t, clock.Measure(ctx))
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

	enq := NewEnqueuer(client, 0)
	now, err := q.DatabaseNow(ctx)
	require.NoError(t, err)
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
