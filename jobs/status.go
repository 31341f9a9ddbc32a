package jobs

import (
	"cmp"
	"context"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/heraldpush/herald/db"
)

// StatusReporter publishes this process's breaker states to the database
// every Interval, so that any process can answer GET /v1/providers for the
// whole deployment.
type StatusReporter struct {
	cfg StatusReporterConfig
}

// StatusReporterConfig configures a StatusReporter; every field but
// Interval is required.
type StatusReporterConfig struct {
	Pool      *pgxpool.Pool
	Logger    *slog.Logger
	ProcessID string
	// Breakers are the worker's; a channel without one is not configured
	// here.
	Breakers *Breakers
	// Interval is the time between reports (DefaultStatusEvery when zero).
	Interval time.Duration
}

// NewStatusReporter returns the StatusReporter of cfg, its defaults filled,
// or an error naming the setting it cannot work with.
func NewStatusReporter(cfg *StatusReporterConfig) (*StatusReporter, error) {
	c, err := configure(cfg)
	if err != nil {
		return nil, err
	}
	return &StatusReporter{cfg: c}, nil
}

// withDefaults fills the settings left zero with their defaults.
func (c *StatusReporterConfig) withDefaults() {
	c.Interval = cmp.Or(c.Interval, DefaultStatusEvery)
}

// validate names the first setting that no default can mend: a missing
// dependency, or a negative value.
func (c *StatusReporterConfig) validate() error {
	switch {
	case c.Pool == nil:
		return errRequired("StatusReporterConfig.Pool")
	case c.Logger == nil:
		return errRequired("StatusReporterConfig.Logger")
	case c.ProcessID == "":
		return errRequired("StatusReporterConfig.ProcessID")
	case c.Breakers == nil:
		return errRequired("StatusReporterConfig.Breakers")
	case c.Interval < 0:
		return errNegative("StatusReporterConfig.Interval", c.Interval)
	}
	return nil
}

// Run reports until ctx is done.
func (r *StatusReporter) Run(ctx context.Context) {
	c := r.cfg
	t := time.NewTicker(c.Interval)
	defer t.Stop()
	q := db.On(c.Pool)
	for n := 0; ; n++ {
		for _, channel := range Channels {
			p := db.UpsertProviderStatusParams{ProcessID: c.ProcessID, Channel: channel, State: BreakerClosed}
			if st, ok := c.Breakers.Status(channel); ok {
				p.Configured, p.State, p.Sends, p.Failures = true, st.State, st.Sends, st.Failures
				if st.LastError != "" {
					p.LastError, p.LastErrorAt = &st.LastError, &st.LastErrorAt
				}
			}
			if err := q.UpsertProviderStatus(ctx, p); err != nil && ctx.Err() == nil {
				c.Logger.WarnContext(ctx, "report provider status", "error", err)
			}
		}
		if n%1800 == 0 {
			if err := q.DeleteStaleProviderStatus(ctx); err != nil && ctx.Err() == nil {
				c.Logger.WarnContext(ctx, "delete stale provider status", "error", err)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
