package jobs

import (
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
	Pool      *pgxpool.Pool
	Logger    *slog.Logger
	ProcessID string
	// Breakers are the worker's; a channel without one is not configured
	// here.
	Breakers *Breakers
	Interval time.Duration
}

// Run reports until ctx is done.
func (r *StatusReporter) Run(ctx context.Context) {
	interval := r.Interval
	if interval <= 0 {
		interval = 2 * time.Second
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	q := db.On(r.Pool)
	for n := 0; ; n++ {
		for _, channel := range Channels {
			p := db.UpsertProviderStatusParams{ProcessID: r.ProcessID, Channel: channel, State: BreakerClosed}
			if st, ok := r.Breakers.Status(channel); ok {
				p.Configured, p.State, p.Sends, p.Failures = true, st.State, st.Sends, st.Failures
				if st.LastError != "" {
					p.LastError, p.LastErrorAt = &st.LastError, &st.LastErrorAt
				}
			}
			if err := q.UpsertProviderStatus(ctx, p); err != nil && ctx.Err() == nil {
				r.Logger.WarnContext(ctx, "report provider status", "error", err)
			}
		}
		if n%1800 == 0 {
			if err := q.DeleteStaleProviderStatus(ctx); err != nil && ctx.Err() == nil {
				r.Logger.WarnContext(ctx, "delete stale provider status", "error", err)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
