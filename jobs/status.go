package jobs

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"slices"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/heraldpush/herald/db"
	"github.com/heraldpush/herald/jobs/apps"
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
	// Apps, when set, says which apps have credentials for which channel
	// here; each app's health is reported beside the channels' totals.
	Apps *apps.Registry
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
		// What this release can do, first of all: a process whose
		// provider status has no features beside it is of an earlier
		// release (db.ProcessesWithoutFeature), which holds scheduling to
		// ledger rows while it lives (Enqueuer).
		if err := q.UpsertProcessFeatures(ctx, db.UpsertProcessFeaturesParams{ProcessID: c.ProcessID, Features: features}); err != nil && ctx.Err() == nil {
			c.Logger.WarnContext(ctx, "report process features", "error", err)
		}
		// Each app's rows then: a process whose provider_status rows
		// have no app rows beside them is of a release without apps
		// (db.ProcessesWithoutApps), which this one must never look like.
		r.reportApps(ctx, q)
		for _, channel := range Channels {
			p := db.UpsertProviderStatusParams{ProcessID: c.ProcessID, Channel: channel, State: BreakerClosed}
			if st, ok := c.Breakers.Status(channel); ok {
				p.Configured, p.State, p.Sends, p.Failures = r.configured(channel), st.State, st.Sends, st.Failures
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
			if err := q.DeleteStaleAppProviderStatus(ctx); err != nil && ctx.Err() == nil {
				c.Logger.WarnContext(ctx, "delete stale app provider status", "error", err)
			}
			if err := q.DeleteStaleProcessFeatures(ctx); err != nil && ctx.Err() == nil {
				c.Logger.WarnContext(ctx, "delete stale process features", "error", err)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// reportApps writes each app's health on each channel: the default app
// and every app that has credentials here or has sent.
func (r *StatusReporter) reportApps(ctx context.Context, q *db.Queries) {
	c := r.cfg
	ids := c.Breakers.AppIDs()
	if c.Apps != nil {
		for id := range c.Apps.Names() {
			if !slices.Contains(ids, id) {
				ids = append(ids, id)
			}
		}
	}
	for _, id := range ids {
		set := c.Breakers.App(id)
		for _, channel := range Channels {
			p := db.UpsertAppProviderStatusParams{ProcessID: c.ProcessID, AppID: id, Channel: channel, State: BreakerClosed}
			st, ok := set.AppStatus(channel)
			if c.Apps != nil {
				p.Configured = c.Apps.Configured(id, channel)
			} else {
				p.Configured = ok && id == apps.DefaultID
			}
			if ok {
				p.State, p.Sends, p.Failures, p.Refused = st.State, st.Sends, st.Failures, st.Refused
				if st.LastError != "" {
					p.LastError, p.LastErrorAt = &st.LastError, &st.LastErrorAt
				}
				if st.LastRefused != "" {
					p.LastRefused, p.LastRefusedAt = &st.LastRefused, &st.LastRefusedAt
				}
			}
			if err := q.UpsertAppProviderStatus(ctx, p); err != nil && ctx.Err() == nil && !errors.Is(err, db.ErrNotFound) {
				// An app deleted meanwhile (none is) or the database away.
				c.Logger.WarnContext(ctx, "report app provider status", "app", id, "error", err)
				return
			}
		}
	}
}

// configured reports whether some app has credentials for channel here
// (the breakers say so without an app registry).
func (r *StatusReporter) configured(channel string) bool {
	c := r.cfg
	if c.Apps == nil {
		return true
	}
	for id := range c.Apps.Names() {
		if c.Apps.Configured(id, channel) {
			return true
		}
	}
	return false
}
