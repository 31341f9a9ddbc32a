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
	cfg PromoterConfig
}

// PromoterConfig configures a Promoter. Pool and Logger are required.
type PromoterConfig struct {
	Pool   *pgxpool.Pool
	Logger *slog.Logger
	// Lookahead is how long before its time a chunk is made available
	// (DefaultLookahead when zero): the River clients' RiverConfig.Lookahead.
	Lookahead time.Duration
	// Interval is the time between passes (DefaultPromoteEvery when zero).
	Interval time.Duration
}

// NewPromoter returns the Promoter of cfg, its defaults filled, or an error
// naming the setting it cannot work with.
func NewPromoter(cfg *PromoterConfig) (*Promoter, error) {
	c, err := configure(cfg)
	if err != nil {
		return nil, err
	}
	return &Promoter{cfg: c}, nil
}

// withDefaults fills the settings left zero with their defaults.
func (c *PromoterConfig) withDefaults() {
	c.Lookahead = cmp.Or(c.Lookahead, DefaultLookahead)
	c.Interval = cmp.Or(c.Interval, DefaultPromoteEvery)
}

// validate names the first setting that no default can mend: a missing
// dependency, or a negative value.
func (c *PromoterConfig) validate() error {
	switch {
	case c.Pool == nil:
		return errRequired("PromoterConfig.Pool")
	case c.Logger == nil:
		return errRequired("PromoterConfig.Logger")
	case c.Lookahead < 0:
		return errNegative("PromoterConfig.Lookahead", c.Lookahead)
	case c.Interval < 0:
		return errNegative("PromoterConfig.Interval", c.Interval)
	}
	return nil
}

// Run promotes until ctx is done.
func (p *Promoter) Run(ctx context.Context) {
	c := p.cfg
	t := time.NewTicker(c.Interval)
	defer t.Stop()
	for {
		for {
			n, err := db.PromoteDueJobs(ctx, c.Pool, LaneQueues, c.Lookahead, 1000)
			if err != nil {
				if ctx.Err() == nil {
					c.Logger.WarnContext(ctx, "promote due chunks", "error", err)
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
