package jobs

import (
	"cmp"
	"context"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/heraldpush/herald/db"
)

// Promoter makes chunk jobs available as they come within the look-ahead
// window, in every worker process rather than only River's leader, so that a
// chunk scheduled days ahead starts on time even while leadership changes
// hands. See NewRiverClient.
type Promoter struct {
	Pool      *pgxpool.Pool
	Logger    *slog.Logger
	Lookahead time.Duration
	// Interval between passes; default 1 s, well inside Lookahead, so a
	// missed pass still leaves the chunk available in time.
	Interval time.Duration
}

// Run promotes until ctx is done.
func (p *Promoter) Run(ctx context.Context) {
	interval := cmp.Or(p.Interval, time.Second)
	lookahead := cmp.Or(p.Lookahead, DefaultLookahead)
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		for {
			n, err := db.PromoteDueJobs(ctx, p.Pool, LaneQueues, lookahead, 1000)
			if err != nil {
				if ctx.Err() == nil {
					p.Logger.WarnContext(ctx, "promote due chunks", "error", err)
				}
				break
			}
			if n < 1000 {
				break
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
