package jobs

import (
	"context"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/heraldpush/herald/db"
)

// Waker starts the lanes' fetches at the instants their chunks fall due.
//
// A lane finds due chunks by polling (FetchPollInterval, 250 ms), so a chunk
// starts on average half a poll after its time, and up to a whole poll. River's
// producers also fetch at once when told that a job was inserted in their
// queue: the insert notification River's own inserts send. The Waker looks
// ahead for the instants at which chunks of its lanes fall due and at each
// sends that notification for the lane, so that every process's producer of
// the lane fetches then. Should River stop hearing it (the notification is
// River's, not Herald's), chunks still start on the poll.
type Waker struct {
	Pool   *pgxpool.Pool
	Clock  *Clock
	Logger *slog.Logger
	// Lanes are the lanes to wake, by queue, each with what tells every
	// producer of that queue to fetch (RiverNotify).
	Lanes map[string]func(ctx context.Context) error
	// Every is the interval between looks ahead (default 500 ms), Ahead how
	// far each looks (default 2 s: a pass that fails leaves time for the
	// next). A chunk inserted less than Every before its time may start on
	// the poll instead.
	Every, Ahead time.Duration
	Metrics      *Metrics
}

// wakeMargin is how long after a due instant the lane is woken: River's
// fetch takes jobs whose time has come by the database's clock, which the
// Clock knows to within half a round trip.
const wakeMargin = 2 * time.Millisecond

// Run wakes the lanes until ctx is done.
func (w *Waker) Run(ctx context.Context) {
	every, ahead := w.Every, w.Ahead
	if every <= 0 {
		every = 500 * time.Millisecond
	}
	if ahead <= every {
		ahead = max(2*time.Second, 2*every)
	}
	queues := slices.Collect(maps.Keys(w.Lanes))
	var mu sync.Mutex
	armed := map[db.DueInstant]*time.Timer{}
	defer func() {
		mu.Lock()
		defer mu.Unlock()
		for _, t := range armed {
			t.Stop()
		}
	}()
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		due, err := db.UpcomingDue(ctx, w.Pool, queues, ahead, 100)
		if err != nil && ctx.Err() == nil {
			w.Logger.WarnContext(ctx, "look ahead for due chunks", "error", err)
		}
		mu.Lock()
		for _, d := range due {
			if armed[d] != nil {
				continue
			}
			// The instant is the database's; the timer runs on the host.
			armed[d] = time.AfterFunc(time.Until(d.At.Add(-w.Clock.Offset()))+wakeMargin, func() {
				mu.Lock()
				delete(armed, d)
				mu.Unlock()
				nctx, cancel := context.WithTimeout(ctx, time.Second)
				defer cancel()
				if err := w.Lanes[d.Queue](nctx); err != nil {
					if ctx.Err() == nil {
						w.Logger.WarnContext(ctx, "wake a lane", "lane", d.Queue, "error", err)
					}
					return
				}
				w.Metrics.woke(d.Queue)
			})
		}
		mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// RiverNotify returns a Waker's wake for queue on pool, whose River
// clients then fetch at once: River's insert notification, as an insert
// would send it (db.NotifyRiverInsert).
func RiverNotify(pool *pgxpool.Pool, queue string) func(ctx context.Context) error {
	schema := db.PoolSchema(pool)
	return func(ctx context.Context) error { return db.NotifyRiverInsert(ctx, pool, schema, queue) }
}
