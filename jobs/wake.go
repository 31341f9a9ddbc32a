package jobs

import (
	"cmp"
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
	cfg WakerConfig
}

// WakerConfig configures a Waker. Pool, Clock and Logger are required.
type WakerConfig struct {
	Pool   *pgxpool.Pool
	Clock  *Clock
	Logger *slog.Logger
	// Lanes are the lanes to wake, by queue, each with what tells every
	// producer of that queue to fetch (RiverNotify).
	Lanes map[string]func(ctx context.Context) error
	// Every is the interval between looks ahead (DefaultWakeEvery when
	// zero), Ahead how far each looks: one no longer than Every (zero
	// included) takes the longer of DefaultWakeAhead and twice Every.
	Every, Ahead time.Duration
	Metrics      *Metrics
	// Warm, when set, readies the process for the chunks of a queue due at
	// an instant (FanOutWorker.Warm). The Waker calls it once per instant,
	// when it first sees it, one call at a time, with a context that ends at
	// the instant: a warm-up that has not finished by then is of no use.
	Warm func(ctx context.Context, queue string, at time.Time) error
	// Due, when set, is told of each lane's instant as it comes, just
	// before the lane is woken (FanOutWorker.Due).
	Due func(queue string)
}

// NewWaker returns the Waker of cfg, its defaults filled, or an error
// naming the setting it cannot work with.
func NewWaker(cfg *WakerConfig) (*Waker, error) {
	c, err := configure(cfg)
	if err != nil {
		return nil, err
	}
	return &Waker{cfg: c}, nil
}

// withDefaults fills the settings left zero with their defaults.
func (c *WakerConfig) withDefaults() {
	c.Every = cmp.Or(c.Every, DefaultWakeEvery)
	if c.Ahead <= c.Every {
		c.Ahead = max(DefaultWakeAhead, 2*c.Every)
	}
}

// validate names the first setting that no default can mend: a missing
// dependency, or a negative value.
func (c *WakerConfig) validate() error {
	switch {
	case c.Pool == nil:
		return errRequired("WakerConfig.Pool")
	case c.Clock == nil:
		return errRequired("WakerConfig.Clock")
	case c.Logger == nil:
		return errRequired("WakerConfig.Logger")
	case c.Every < 0:
		return errNegative("WakerConfig.Every", c.Every)
	}
	return nil
}

// wakeMargin is how long after a due instant the lane is woken: River's
// fetch takes jobs whose time has come by the database's clock, which the
// Clock knows to within half a round trip.
const wakeMargin = 2 * time.Millisecond

// wakeSpan is how close together a lane's instants are woken as one: at the
// latest of them, whose fetch takes the jobs of all. Chunks that wait for the
// same moment (deliveries held until the end of the same quiet hours,
// throttled devices whose waits run out together) are snoozed each from the
// moment it returns, so they fall due microseconds to milliseconds apart:
// woken one by one, fifty chunks held until the same minute made fifty
// notifications, fifty fetches and fifty warm-ups at once, and every
// process's pool opened backends for them. An instant alone is woken at its
// time; one followed within the span by another is woken up to the span late.
const wakeSpan = 10 * time.Millisecond

// covered says whether an instant armed on d's lane, or about to be (arm),
// falls within wakeSpan after d (or at it): its wake fetches d's jobs too.
func covered(armed map[db.DueInstant]*time.Timer, arm []db.DueInstant, d db.DueInstant) bool {
	covers := func(e db.DueInstant) bool {
		return e.Queue == d.Queue && !e.At.Before(d.At) && e.At.Sub(d.At) <= wakeSpan
	}
	for e := range armed {
		if covers(e) {
			return true
		}
	}
	return slices.ContainsFunc(arm, covers)
}

// Run wakes the lanes until ctx is done.
func (w *Waker) Run(ctx context.Context) {
	c := w.cfg
	queues := slices.Collect(maps.Keys(c.Lanes))
	var mu sync.Mutex
	armed := map[db.DueInstant]*time.Timer{}
	defer func() {
		mu.Lock()
		defer mu.Unlock()
		for _, t := range armed {
			t.Stop()
		}
	}()
	t := time.NewTicker(c.Every)
	defer t.Stop()
	warms := make(chan db.DueInstant, 100)
	defer close(warms)
	if c.Warm != nil {
		go w.warm(ctx, warms)
	}
	for {
		due, err := db.UpcomingDue(ctx, c.Pool, queues, c.Ahead, 100)
		if err != nil && ctx.Err() == nil {
			c.Logger.WarnContext(ctx, "look ahead for due chunks", "error", err)
		}
		mu.Lock()
		// Latest first, so that an instant a later one covers is left to
		// it (covered); then armed, and warmed, soonest first.
		var arm []db.DueInstant
		for _, d := range slices.Backward(due) {
			if armed[d] == nil && !covered(armed, arm, d) {
				arm = append(arm, d)
			}
		}
		for _, d := range slices.Backward(arm) {
			// The instant is the database's; the timer runs on the host.
			armed[d] = time.AfterFunc(time.Until(d.At.Add(-c.Clock.Offset()))+wakeMargin, func() {
				mu.Lock()
				delete(armed, d)
				mu.Unlock()
				if c.Due != nil {
					c.Due(d.Queue)
				}
				nctx, cancel := context.WithTimeout(ctx, time.Second)
				defer cancel()
				if err := c.Lanes[d.Queue](nctx); err != nil {
					if ctx.Err() == nil {
						c.Logger.WarnContext(ctx, "wake a lane", "lane", d.Queue, "error", err)
					}
					return
				}
				c.Metrics.woke(d.Queue)
			})
			if c.Warm != nil {
				select {
				case warms <- d:
				default: // warming is behind; this instant goes cold
				}
			}
		}
		mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// warm warms the instants it is given, one after another, each until its
// time comes.
func (w *Waker) warm(ctx context.Context, instants <-chan db.DueInstant) {
	c := w.cfg
	for d := range instants {
		wctx, cancel := context.WithDeadline(ctx, d.At.Add(-c.Clock.Offset()))
		err := c.Warm(wctx, d.Queue, d.At)
		cancel()
		if err != nil && wctx.Err() == nil {
			c.Logger.WarnContext(ctx, "warm up for chunks falling due", "lane", d.Queue, "at", d.At, "error", err)
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
