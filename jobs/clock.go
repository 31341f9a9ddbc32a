package jobs

import (
	"context"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/heraldpush/herald/db"
)

// Clock maps the host's clock onto the database's, Herald's one
// authoritative clock: dispatch_at is compared with the database's time and
// every accepted_at is recorded in its frame, so that skew never includes a
// host's NTP error. The offset is measured by asking the database for its
// time and taking the sample with the shortest round trip.
type Clock struct {
	pool   *pgxpool.Pool
	logger *slog.Logger
	offset atomic.Int64 // database minus host, in nanoseconds
}

// NewClock returns a clock for pool. Until its first measurement it assumes
// the host and the database agree.
func NewClock(pool *pgxpool.Pool, logger *slog.Logger) *Clock {
	return &Clock{pool: pool, logger: logger}
}

// Now is the database's current time, by the host's clock and the last
// measured offset.
func (c *Clock) Now() time.Time { return time.Now().Add(c.Offset()) }

// ToDB converts a host instant to the database's frame.
func (c *Clock) ToDB(t time.Time) time.Time { return t.Add(c.Offset()) }

// Offset is the database's clock minus the host's.
func (c *Clock) Offset() time.Duration { return time.Duration(c.offset.Load()) }

// Measure takes a few samples of the database's time and keeps the offset
// of the one with the shortest round trip, whose error is at most half of it.
func (c *Clock) Measure(ctx context.Context) error {
	q := db.On(c.pool)
	best := time.Duration(-1)
	var offset time.Duration
	for range 5 {
		sent := time.Now()
		dbNow, err := q.DatabaseNow(ctx)
		if err != nil {
			return err
		}
		received := time.Now()
		rtt := received.Sub(sent)
		if best < 0 || rtt < best {
			best = rtt
			offset = dbNow.Sub(sent.Add(rtt / 2))
		}
	}
	c.offset.Store(int64(offset))
	return nil
}

// Run measures now and then every interval until ctx is done.
func (c *Clock) Run(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		if err := c.Measure(ctx); err != nil && ctx.Err() == nil {
			c.logger.WarnContext(ctx, "measure database clock offset", "error", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
