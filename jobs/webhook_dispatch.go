package jobs

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"

	"github.com/heraldpush/herald/db"
)

// webhookClaimMax bounds the events one pass of the dispatcher claims: a
// backlog is worked off over passes that follow each other at once, each a
// short transaction.
const webhookClaimMax = 20_000

// WebhookDispatcher turns the outbox's events (webhook_events, written in
// the transactions of the facts) into River jobs, one per batch of one
// webhook and one message (WebhookArgs), every Every; a batch that would
// not be full waits Hold for more of its message's events. It claims unclaimed
// events with FOR UPDATE SKIP LOCKED, gives them batch ids and inserts the
// jobs in the same transaction, so an event is in exactly one batch and
// every batch has its job. Every worker process runs one; they skip each
// other's rows.
type WebhookDispatcher struct {
	cfg WebhookDispatcherConfig
}

// WebhookDispatcherConfig configures a WebhookDispatcher. Pool, Logger and
// River are required.
type WebhookDispatcherConfig struct {
	Pool   *pgxpool.Pool
	Logger *slog.Logger
	// River inserts the batch jobs, in the claim's transaction.
	River *river.Client[pgx.Tx]
	// Every is the time between passes (DefaultWebhookDispatchEvery).
	Every time.Duration
	// Hold is how long a batch that would not be full waits for more of
	// its message's events (DefaultWebhookHold).
	Hold time.Duration
}

// NewWebhookDispatcher returns a dispatcher; Run runs it.
func NewWebhookDispatcher(cfg *WebhookDispatcherConfig) (*WebhookDispatcher, error) {
	c := *cfg
	c.Every = cmp.Or(c.Every, DefaultWebhookDispatchEvery)
	c.Hold = cmp.Or(c.Hold, DefaultWebhookHold)
	switch {
	case c.Pool == nil:
		return nil, errors.New("jobs: WebhookDispatcherConfig.Pool is required")
	case c.Logger == nil:
		return nil, errors.New("jobs: WebhookDispatcherConfig.Logger is required")
	case c.River == nil:
		return nil, errors.New("jobs: WebhookDispatcherConfig.River is required")
	case c.Every < 0:
		return nil, fmt.Errorf("jobs: WebhookDispatcherConfig.Every is %s; want a positive duration", c.Every)
	case c.Hold < 0:
		return nil, fmt.Errorf("jobs: WebhookDispatcherConfig.Hold is %s; want a positive duration", c.Hold)
	}
	return &WebhookDispatcher{cfg: c}, nil
}

// Run dispatches every Every until ctx ends.
func (d *WebhookDispatcher) Run(ctx context.Context) {
	tick := time.NewTicker(d.cfg.Every)
	defer tick.Stop()
	failing := false
	for {
		_, err := d.Dispatch(ctx)
		if err != nil && !failing && ctx.Err() == nil {
			d.cfg.Logger.WarnContext(ctx, "webhook events not dispatched; the next pass tries again", "error", err)
		}
		failing = err != nil
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// Dispatch turns every unclaimed event into batch jobs and returns how many
// batches it made.
func (d *WebhookDispatcher) Dispatch(ctx context.Context) (int, error) {
	total := 0
	for {
		batches, events, err := d.pass(ctx)
		total += batches
		if err != nil || events < webhookClaimMax {
			return total, err
		}
	}
}

// pass claims up to webhookClaimMax events in one transaction.
func (d *WebhookDispatcher) pass(ctx context.Context) (batches, events int, err error) {
	err = db.InTx(ctx, d.cfg.Pool, func(tx pgx.Tx) error {
		batches, events = 0, 0
		rows, err := db.On(tx).ClaimWebhookEvents(ctx, db.ClaimWebhookEventsParams{
			MaxEvents: webhookClaimMax, BatchSize: WebhookBatchSize, HoldSeconds: d.cfg.Hold.Seconds(),
		})
		if err != nil {
			return fmt.Errorf("claim webhook events: %w", err)
		}
		if len(rows) == 0 {
			return nil
		}
		params := make([]river.InsertManyParams, len(rows))
		for i, r := range rows {
			params[i] = river.InsertManyParams{Args: WebhookArgs{BatchID: r.BatchID, WebhookID: r.WebhookID, MessageID: r.MessageID, Events: int(r.Events)}}
			events += int(r.Events)
		}
		if _, err := d.cfg.River.InsertManyTx(ctx, tx, params); err != nil {
			return fmt.Errorf("insert webhook batch jobs: %w", err)
		}
		batches = len(rows)
		return nil
	})
	return batches, events, err
}
