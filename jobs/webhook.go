package jobs

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"

	"github.com/heraldpush/herald/db"
	"github.com/heraldpush/herald/jobs/push"
	"github.com/heraldpush/herald/jobs/webhook"
)

// QueueWebhooks is the River queue of webhook calls: a queue of its own,
// with few workers, so that a slow receiver never holds a chunk lane's
// worker, and its calls never hold a transaction of the ledger (a batch job
// runs after the events it carries were committed).
const QueueWebhooks = "webhooks"

// WebhookKind is the River kind of a batch of webhook events.
const WebhookKind = "webhook_batch"

// The webhook event types (docs/webhooks.md).
const (
	EventDeliveryFailed    = "delivery.failed"
	EventDeliveryWithheld  = "delivery.withheld"
	EventDeliveryConfirmed = "delivery.confirmed"
	EventDeliveryOpened    = "delivery.opened"
	EventDeviceEvicted     = "device.evicted"
	EventMessageSettled    = "message.settled"
)

// WebhookEvents are the event types a webhook may want.
var WebhookEvents = []string{EventDeliveryFailed, EventDeliveryWithheld, EventDeliveryConfirmed, EventDeliveryOpened, EventDeviceEvicted, EventMessageSettled}

// WebhookBatchSize is the most events one call carries: a message that
// fails on a million devices is a thousand calls, not a million.
const WebhookBatchSize = 1000

// webhookMaxAttempts is River's bound on a batch's attempts: as many as the
// default waits (DefaultWebhookRetryFirst doubling up to
// DefaultWebhookRetryMax) fit in DefaultWebhookGiveUp, 33, the last some 23
// hours after the first. River then discards the batch's job: River UI keeps
// a discarded job a week, where it can be retried, and the batch's events
// as long (WebhookEventRetention).
var webhookMaxAttempts = attemptsWithin(DefaultWebhookRetryFirst, DefaultWebhookRetryMax, DefaultWebhookGiveUp)

// attemptsWithin is how many attempts fit in giveUp when the waits between
// them start at first and double up to most.
func attemptsWithin(first, most, giveUp time.Duration) int {
	attempts, total := 1, time.Duration(0)
	for wait := first; total+wait <= giveUp; wait = min(2*wait, most) {
		total += wait
		attempts++
	}
	return attempts
}

// WebhookArgs is one batch: events of one message for one webhook, which
// the job reads by BatchID (the outbox, migration 0018).
type WebhookArgs struct {
	BatchID   int64 `json:"batch_id"`
	WebhookID int64 `json:"webhook_id"`
	MessageID int64 `json:"message_id"`
	// Events is how many the batch holds, for River UI.
	Events int `json:"events"`
}

// Kind implements river.JobArgs.
func (WebhookArgs) Kind() string { return WebhookKind }

// InsertOpts puts batches on their own queue.
func (WebhookArgs) InsertOpts() river.InsertOpts {
	return river.InsertOpts{Queue: QueueWebhooks, MaxAttempts: webhookMaxAttempts}
}

// WebhookConfig configures the WebhookWorker. Pool, Logger and Policy are
// required; zero durations take the defaults (defaults.go).
type WebhookConfig struct {
	Pool   *pgxpool.Pool
	Logger *slog.Logger
	// Policy is where calls may go (HERALD_WEBHOOK_HOSTS).
	Policy *webhook.Policy
	// Metrics, when set, counts the calls by outcome.
	Metrics *Metrics
	// Timeout bounds one call.
	Timeout time.Duration
	// RetryFirst is the wait before the first retry; the waits double up
	// to RetryMax.
	RetryFirst, RetryMax time.Duration
	// GiveUp is how long after a batch's first attempt it is given up.
	GiveUp time.Duration
	// Now is the clock of the timestamps and the give-up (time.Now).
	Now func() time.Time
}

func (c *WebhookConfig) withDefaults() {
	c.Timeout = cmp.Or(c.Timeout, DefaultWebhookTimeout)
	c.RetryFirst = cmp.Or(c.RetryFirst, DefaultWebhookRetryFirst)
	c.RetryMax = cmp.Or(c.RetryMax, DefaultWebhookRetryMax)
	c.GiveUp = cmp.Or(c.GiveUp, DefaultWebhookGiveUp)
	if c.Now == nil {
		c.Now = time.Now
	}
}

func (c *WebhookConfig) validate() error {
	switch {
	case c.Pool == nil:
		return errors.New("jobs: WebhookConfig.Pool is required")
	case c.Logger == nil:
		return errors.New("jobs: WebhookConfig.Logger is required")
	case c.Policy == nil:
		return errors.New("jobs: WebhookConfig.Policy is required")
	case c.RetryFirst > c.RetryMax:
		return fmt.Errorf("jobs: WebhookConfig.RetryFirst (%s) exceeds RetryMax (%s)", c.RetryFirst, c.RetryMax)
	}
	return nil
}

// WebhookWorker makes one signed call per batch: a 2xx answer delivers it
// (its events are deleted), anything else, or no answer within Timeout, is
// retried with doubling waits until GiveUp after its first attempt, when it
// is given up: River discards it after its last attempt
// (webhookMaxAttempts), and cancels it when GiveUp comes first. Its events
// stay (WebhookEventRetention), so that an operator can retry it from River
// UI.
type WebhookWorker struct {
	river.WorkerDefaults[WebhookArgs]
	cfg    WebhookConfig
	client *http.Client
}

// NewWebhookWorker returns the worker of webhook batches.
func NewWebhookWorker(cfg WebhookConfig) (*WebhookWorker, error) {
	cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return &WebhookWorker{cfg: cfg, client: cfg.Policy.Client(cfg.Timeout)}, nil
}

// Timeout bounds an attempt: the call, and the reads and the delete around
// it.
func (w *WebhookWorker) Timeout(*river.Job[WebhookArgs]) time.Duration {
	return w.cfg.Timeout + 10*time.Second
}

// NextRetry waits RetryFirst after the first failed attempt, doubling after
// each, up to RetryMax.
func (w *WebhookWorker) NextRetry(job *river.Job[WebhookArgs]) time.Time {
	return w.cfg.Now().Add(w.retryWait(job.Attempt))
}

func (w *WebhookWorker) retryWait(attempt int) time.Duration {
	wait := w.cfg.RetryFirst
	for i := 1; i < attempt && wait < w.cfg.RetryMax; i++ {
		wait *= 2
	}
	return min(wait, w.cfg.RetryMax)
}

// Work posts the batch.
func (w *WebhookWorker) Work(ctx context.Context, job *river.Job[WebhookArgs]) error {
	a := job.Args
	q := db.On(w.cfg.Pool)
	target, err := q.WebhookTarget(ctx, a.WebhookID)
	if errors.Is(err, db.ErrNotFound) {
		// Deleted since: its events go with it, unsent.
		if _, err := q.DeleteWebhookBatch(ctx, a.BatchID); err != nil {
			return fmt.Errorf("delete the batch of a deleted webhook: %w", err)
		}
		w.cfg.Metrics.webhookCall("dropped")
		return nil
	}
	if err != nil {
		return fmt.Errorf("read webhook: %w", err)
	}
	rows, err := q.WebhookBatchEvents(ctx, a.BatchID)
	if err != nil {
		return fmt.Errorf("read webhook batch: %w", err)
	}
	if len(rows) == 0 {
		return nil
	}
	body, err := json.Marshal(batchBody(a, rows))
	if err != nil {
		return fmt.Errorf("webhook body: %w", err)
	}
	call, cancel := context.WithTimeout(ctx, w.cfg.Timeout)
	defer cancel()
	status, err := webhook.Post(call, w.client, target.Url, target.Secret, webhook.BatchID(a.BatchID), w.cfg.Now(), body)
	if err == nil && status >= 200 && status < 300 {
		if _, err := q.DeleteWebhookBatch(ctx, a.BatchID); err != nil {
			// Delivered, but its events stay: the retry sends them again
			// with the same webhook-id, which a receiver can tell.
			return fmt.Errorf("delete the delivered batch: %w", err)
		}
		w.cfg.Metrics.webhookCall("delivered")
		return nil
	}
	if err == nil {
		err = fmt.Errorf("the receiver answered %d", status)
	}
	err = fmt.Errorf("webhook %s, batch %s of message %s: %w", webhook.WebhookID(a.WebhookID),
		webhook.BatchID(a.BatchID), push.FormatMessageID(a.MessageID), err)
	last := job.Attempt >= job.MaxAttempts
	if last || w.cfg.Now().Add(w.retryWait(job.Attempt)).Sub(job.CreatedAt) > w.cfg.GiveUp {
		w.cfg.Logger.WarnContext(ctx, "webhook batch given up: no 2xx answer since its first attempt",
			"webhook_id", webhook.WebhookID(a.WebhookID), "batch", webhook.BatchID(a.BatchID),
			"message_id", push.FormatMessageID(a.MessageID), "attempts", job.Attempt, "error", err)
		w.cfg.Metrics.webhookCall("given_up")
		if last {
			// River discards it.
			return err
		}
		// Out of time before its attempts (waits of another length, or a
		// job retried by hand from River UI long after): cancelled.
		return river.JobCancel(err)
	}
	w.cfg.Metrics.webhookCall("retried")
	return err
}

// batchBody is the body of a batch's call.
func batchBody(a WebhookArgs, rows []db.WebhookBatchEventsRow) webhook.Batch {
	b := webhook.Batch{Type: "batch", ID: webhook.BatchID(a.BatchID), WebhookID: webhook.WebhookID(a.WebhookID),
		MessageID: push.FormatMessageID(a.MessageID), Events: make([]webhook.Event, 0, len(rows))}
	for _, r := range rows {
		e := webhook.Event{Type: r.Type, At: r.At.UTC(), Data: r.Data}
		if r.DeviceID != nil {
			e.DeviceID = push.FormatDeviceID(*r.DeviceID)
		}
		if r.UserID != nil {
			e.UserID = *r.UserID
		}
		if r.Reason != nil {
			e.Reason = *r.Reason
		}
		b.Events = append(b.Events, e)
	}
	return b
}

// WebhookTypes is a process's reading of the event types some webhook
// wants, refreshed every second by Run: the ledger writes a failure's event
// only while one does, so a process pays nothing for webhooks while none
// exists. A webhook made is served from the next reading on, within about
// a second.
type WebhookTypes struct {
	pool     *pgxpool.Pool
	logger   *slog.Logger
	failed   atomic.Bool
	withheld atomic.Bool
}

// NewWebhookTypes returns the reading of pool's webhooks; until Refresh or
// Run reads them, it wants nothing.
func NewWebhookTypes(pool *pgxpool.Pool, logger *slog.Logger) *WebhookTypes {
	return &WebhookTypes{pool: pool, logger: logger}
}

// WantsFailures says whether some webhook wants delivery.failed.
func (t *WebhookTypes) WantsFailures() bool { return t != nil && t.failed.Load() }

// WantsWithheld says whether some webhook wants delivery.withheld.
func (t *WebhookTypes) WantsWithheld() bool { return t != nil && t.withheld.Load() }

// Refresh reads the wanted types.
func (t *WebhookTypes) Refresh(ctx context.Context) error {
	types, err := db.On(t.pool).WantedWebhookEvents(ctx)
	if err != nil {
		return fmt.Errorf("read the webhooks' event types: %w", err)
	}
	failed, withheld := false, false
	for _, typ := range types {
		failed = failed || typ == EventDeliveryFailed
		withheld = withheld || typ == EventDeliveryWithheld
	}
	t.failed.Store(failed)
	t.withheld.Store(withheld)
	return nil
}

// Run refreshes the reading every second until ctx ends; a failed read
// keeps the last one.
func (t *WebhookTypes) Run(ctx context.Context) {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	failing := false
	for {
		err := t.Refresh(ctx)
		if err != nil && !failing && ctx.Err() == nil {
			t.logger.WarnContext(ctx, "webhooks' event types not refreshed; the last reading still counts", "error", err)
		}
		failing = err != nil
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}
