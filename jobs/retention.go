package jobs

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"

	"github.com/heraldpush/herald/db"
)

// RetainKind is the River kind of the periodic job that deletes what is
// older than the retention.
const RetainKind = "retain"

// MinRetention is the shortest retention accepted; shorter than a day is
// meant for tests and soaks.
const MinRetention = time.Minute

// RetainArgs is the periodic retention job; it carries nothing.
type RetainArgs struct{}

// Kind implements river.JobArgs.
func (RetainArgs) Kind() string { return RetainKind }

// InsertOpts keeps one retention job waiting or running at a time.
func (RetainArgs) InsertOpts() river.InsertOpts {
	return periodicInsertOpts()
}

// retainEvery is how often the retention job runs: every minute, or four
// times a retention when that is shorter, so that nothing outlives the
// retention by much.
func retainEvery(retention time.Duration) time.Duration {
	return min(time.Minute, max(retention/4, time.Second))
}

// retainRiverJobs has River's own job cleaner (a maintenance service of
// River's leader, every 30 s, 10,000 jobs a statement) remove finished jobs
// by River's defaults (completed and cancelled after a day, discarded after
// a week, so an operator can still retry them from River UI), and never
// later than the retention. River keeps a finished job whole, so keeping
// them as long as the ledger would keep a second, needless history.
func retainRiverJobs(rc *river.Config, retention time.Duration) {
	rc.CompletedJobRetentionPeriod = min(retention, 24*time.Hour)
	rc.CancelledJobRetentionPeriod = min(retention, 24*time.Hour)
	rc.DiscardedJobRetentionPeriod = min(retention, 7*24*time.Hour)
}

// Retainer deletes settled messages older than the retention, with their
// ledger (deliveries) and chunks, the payloads no message or schedule
// references any more, the idempotency keys of deleted messages and of
// schedules deleted longer ago than the retention, the devices evicted
// longer ago than the device retention, the audit log's entries older than
// the audit retention, dashboard sessions that ended more than
// SessionRetention ago, and the events of webhook batches given up longer
// than WebhookEventRetention (or the retention, when shorter) ago.
//
// It works in bounded batches, each one statement found through an index,
// so a batch costs the same however much history the tables hold, and
// locks no more than a batch of rows. A message whose ledger is larger than
// a batch loses its ledger over several statements and is deleted with the
// last one: until then its counters still describe the whole ledger.
type Retainer struct {
	cfg RetainerConfig
	// capBlock is where the sweep of the cap histories resumes
	// (sweepCapHistories): the first page of its next range.
	capBlock atomic.Int64
	// capSweep is how many pages one statement of the sweep reads, and
	// capSweepRun how many one run does: capSweepBlocks and
	// capSweepRunBlocks.
	capSweep, capSweepRun int64
}

// The cap histories have no index by age (migration 0026), so the
// retainer reads their table in ranges of capSweepBlocks pages (8 MiB) a
// statement, at most capSweepRunBlocks (256 MiB) a run, resuming where
// the previous run stopped: the whole table each run up to that size
// (about a million users' histories of one category), and a larger one
// over a few runs.
const (
	capSweepBlocks    = 1024
	capSweepRunBlocks = 32 * capSweepBlocks
)

// RetainerConfig configures a Retainer. Pool and Logger are required.
type RetainerConfig struct {
	Pool   *pgxpool.Pool
	Logger *slog.Logger
	// Retention is how long after settling a message is kept
	// (DefaultRetention when zero).
	Retention time.Duration
	// DeviceRetention is how long after its eviction an evicted device is
	// kept (DefaultDeviceRetention when zero).
	DeviceRetention time.Duration
	// AuditRetention is how long an audit log entry is kept
	// (DefaultAuditRetention when zero).
	AuditRetention time.Duration
	// BatchRows is the most ledger rows, idempotency keys, devices, audit
	// entries or sessions one statement deletes (DefaultRetainBatchRows when
	// zero); BatchMessages the most messages one batch takes on
	// (DefaultRetainBatchMessages).
	BatchRows, BatchMessages int
	// Budget is how long one run works before it leaves the rest to the
	// next run (DefaultRetainBudget when zero).
	Budget time.Duration
	// CompactAbove is the size above which the ledger's primary key is
	// rebuilt once it is mostly emptied pages (db.CompactLedgerKey), by a
	// run that found no message left to delete (DefaultCompactAbove when
	// zero).
	CompactAbove int64
	// Now is the authoritative clock; the database's when nil.
	Now func(ctx context.Context) (time.Time, error)
}

// NewRetainer returns the Retainer of cfg, its defaults filled, or an error
// naming the setting it cannot work with.
func NewRetainer(cfg *RetainerConfig) (*Retainer, error) {
	c, err := configure(cfg)
	if err != nil {
		return nil, err
	}
	return &Retainer{cfg: c, capSweep: capSweepBlocks, capSweepRun: capSweepRunBlocks}, nil
}

// withDefaults fills the settings left zero with their defaults.
func (c *RetainerConfig) withDefaults() {
	c.Retention = cmp.Or(c.Retention, DefaultRetention)
	c.DeviceRetention = cmp.Or(c.DeviceRetention, DefaultDeviceRetention)
	c.AuditRetention = cmp.Or(c.AuditRetention, DefaultAuditRetention)
	c.BatchRows = cmp.Or(c.BatchRows, DefaultRetainBatchRows)
	c.BatchMessages = cmp.Or(c.BatchMessages, DefaultRetainBatchMessages)
	c.Budget = cmp.Or(c.Budget, DefaultRetainBudget)
	c.CompactAbove = cmp.Or(c.CompactAbove, DefaultCompactAbove)
}

// validate names the first setting that no default can mend: a missing
// dependency, or a negative value.
func (c *RetainerConfig) validate() error {
	switch {
	case c.Pool == nil:
		return errRequired("RetainerConfig.Pool")
	case c.Logger == nil:
		return errRequired("RetainerConfig.Logger")
	case c.Retention < 0:
		return errNegative("RetainerConfig.Retention", c.Retention)
	case c.DeviceRetention < 0:
		return errNegative("RetainerConfig.DeviceRetention", c.DeviceRetention)
	case c.AuditRetention < 0:
		return errNegative("RetainerConfig.AuditRetention", c.AuditRetention)
	case c.BatchRows < 0:
		return fmt.Errorf("jobs: RetainerConfig.BatchRows is %d; it must not be negative (zero takes the default)", c.BatchRows)
	case c.BatchMessages < 0:
		return fmt.Errorf("jobs: RetainerConfig.BatchMessages is %d; it must not be negative (zero takes the default)", c.BatchMessages)
	case c.Budget < 0:
		return errNegative("RetainerConfig.Budget", c.Budget)
	case c.CompactAbove < 0:
		return fmt.Errorf("jobs: RetainerConfig.CompactAbove is %d; it must not be negative (zero takes the default)", c.CompactAbove)
	}
	return nil
}

// Removed counts what a run deleted.
type Removed struct {
	Messages, Deliveries, Receipts, Payloads, IdempotencyKeys, Devices, AuditEntries, Sessions int64
	// WebhookEvents are the events of webhook batches given up, kept
	// WebhookEventRetention for a retry from River UI.
	WebhookEvents int64
	// Credentials are the Web Push credentials a rotation had kept for
	// the subscriptions made with their key, retired once none was left.
	Credentials int64
	// CapHistories are users' histories of a capped category older than
	// its period (or of a category no longer capped).
	CapHistories int64
	// DeletedDevices are the records of what devices deleted before the
	// retention were (their user and channel), which no message left
	// names.
	DeletedDevices int64
	// LedgerKeyFreed is the bytes the rebuild of the ledger's primary key
	// gave back (db.CompactLedgerKey), when there was one.
	LedgerKeyFreed int64
}

// Run deletes what settled before now minus the retention, the devices
// evicted before now minus the device retention, the audit entries older
// than the audit retention and the sessions that ended over a day ago,
// until nothing is left or the budget is spent.
func (r *Retainer) Run(ctx context.Context) (Removed, error) {
	c := r.cfg
	var removed Removed
	now, err := c.now(ctx)
	if err != nil {
		return removed, fmt.Errorf("read the clock: %w", err)
	}
	cutoff := now.Add(-c.Retention)
	deadline := time.Now().Add(c.Budget)
	q := db.On(c.Pool)
	for time.Now().Before(deadline) {
		more, err := c.messageBatch(ctx, q, cutoff, &removed)
		if err != nil {
			return removed, err
		}
		if !more {
			// Every message past the retention is gone: the ledger's key
			// is rebuilt if they left it mostly empty.
			if removed.LedgerKeyFreed, err = c.compactLedgerKey(ctx); err != nil {
				return removed, err
			}
			break
		}
	}
	// Keys follow what they made: a message's key is deleted once its
	// message is, a schedule's once the schedule has been deleted for the
	// retention.
	err = c.batches(deadline, &removed.IdempotencyKeys, func() (int64, error) {
		return deleted("idempotency keys")(q.DeleteIdempotencyKeys(ctx, db.DeleteIdempotencyKeysParams{Cutoff: cutoff, MaxRows: int32(c.BatchRows)}))
	})
	if err != nil {
		return removed, err
	}
	deviceCutoff := now.Add(-c.DeviceRetention)
	err = c.batches(deadline, &removed.Devices, func() (int64, error) {
		return c.deleteEvictedDevices(ctx, deviceCutoff)
	})
	if err != nil {
		return removed, err
	}
	err = c.batches(deadline, &removed.DeletedDevices, func() (int64, error) {
		return deleted("deleted devices' records")(q.DeleteDeletedDevices(ctx, db.DeleteDeletedDevicesParams{Cutoff: cutoff, MaxRows: int32(c.BatchRows)}))
	})
	if err != nil {
		return removed, err
	}
	auditCutoff := now.Add(-c.AuditRetention)
	err = c.batches(deadline, &removed.AuditEntries, func() (int64, error) {
		return deleted("audit entries")(q.DeleteAuditEntries(ctx, db.DeleteAuditEntriesParams{Cutoff: auditCutoff, MaxRows: int32(c.BatchRows)}))
	})
	if err != nil {
		return removed, err
	}
	sessionCutoff := now.Add(-SessionRetention)
	err = c.batches(deadline, &removed.Sessions, func() (int64, error) {
		return deleted("ended sessions")(q.DeleteEndedSessions(ctx, db.DeleteEndedSessionsParams{Cutoff: sessionCutoff, MaxRows: int32(c.BatchRows)}))
	})
	if err != nil {
		return removed, err
	}
	// A VAPID key a rotation kept is retired once every subscription made
	// with it has subscribed again (or gone).
	creds, err := q.RetireUnusedWebPushCredentials(ctx)
	if err != nil {
		return removed, fmt.Errorf("retire unused Web Push credentials: %w", err)
	}
	removed.Credentials = int64(len(creds))
	// A cap's history is kept no longer than its category's period
	// (jobs/preferences): past it, it counts for no cap.
	removed.CapHistories, err = r.sweepCapHistories(ctx, q, deadline)
	if err != nil {
		return removed, err
	}
	webhookCutoff := now.Add(-min(WebhookEventRetention, c.Retention))
	return removed, c.batches(deadline, &removed.WebhookEvents, func() (int64, error) {
		return deleted("webhook events")(q.DeleteOldWebhookEvents(ctx, db.DeleteOldWebhookEventsParams{Before: webhookCutoff, Batch: int32(c.BatchRows)}))
	})
}

// sweepCapHistories deletes the cap histories that count for no cap any
// more in the next ranges of their table, at least one range a run however
// the steps before it used the budget, and at most the whole table.
func (r *Retainer) sweepCapHistories(ctx context.Context, q *db.Queries, deadline time.Time) (int64, error) {
	total, err := q.FrequencyCapBlocks(ctx)
	if err != nil {
		return 0, fmt.Errorf("size the frequency cap histories: %w", err)
	}
	from := r.capBlock.Load()
	if from >= total {
		// The table was truncated, or rewritten smaller.
		from = 0
	}
	var removed int64
	for swept := int64(0); swept < min(total, r.capSweepRun); {
		to := min(from+r.capSweep, total)
		n, err := q.DeleteStaleFrequencyCaps(ctx, db.DeleteStaleFrequencyCapsParams{FromBlock: from, ToBlock: to})
		removed += n
		if err != nil {
			return removed, fmt.Errorf("delete frequency cap histories: %w", err)
		}
		swept += to - from
		if from = to; from >= total {
			from = 0
		}
		if !time.Now().Before(deadline) {
			break
		}
	}
	r.capBlock.Store(from)
	return removed, nil
}

// compactLedgerKey rebuilds the ledger's primary key when it is mostly
// emptied pages, and returns the bytes that gave back. A rebuild that
// fails is logged, not returned: the rest of the retention goes on, and the
// next run tries again (dropping what the failed one left).
func (c RetainerConfig) compactLedgerKey(ctx context.Context) (int64, error) {
	done, err := db.CompactLedgerKey(ctx, c.Pool, c.CompactAbove)
	if done.Dropped > 0 {
		c.Logger.WarnContext(ctx, "dropped an unfinished rebuild of the ledger's primary key", "indexes", done.Dropped)
	}
	if err != nil {
		if ctx.Err() != nil {
			return 0, err
		}
		c.Logger.WarnContext(ctx, "the ledger's primary key was not rebuilt; the next retention run tries again", "error", err)
		return 0, nil
	}
	if !done.Rebuilt {
		return 0, nil
	}
	c.Logger.InfoContext(ctx, "rebuilt the ledger's primary key, mostly emptied by the retention",
		"bytes_before", done.Before.Bytes, "bytes_after", done.After.Bytes)
	return done.Before.Bytes - done.After.Bytes, nil
}

// deleted says what a batch was deleting in its error, if it has one.
func deleted(what string) func(n int64, err error) (int64, error) {
	return func(n int64, err error) (int64, error) {
		if err != nil {
			return n, fmt.Errorf("delete %s: %w", what, err)
		}
		return n, nil
	}
}

// batches runs batch, which deletes at most BatchRows and counts them into
// removed, until one deletes fewer or the deadline has passed: at least
// once each run, however the steps before it used the budget.
func (c RetainerConfig) batches(deadline time.Time, removed *int64, batch func() (int64, error)) error {
	for {
		n, err := batch()
		*removed += n
		if err != nil || n < int64(c.BatchRows) || !time.Now().Before(deadline) {
			return err
		}
	}
}

// deleteEvictedDevices deletes at most BatchRows devices evicted before the
// cutoff, in one transaction that first cancels their pending deliveries,
// with their messages' counters, as an erasure does (db.EraseDevices), so
// that no delivery waits on a device that is gone. Unlike an erasure it need
// not wait for messages being made: those read only active devices.
func (c RetainerConfig) deleteEvictedDevices(ctx context.Context, cutoff time.Time) (int64, error) {
	var n int64
	err := db.InTx(ctx, c.Pool, func(tx pgx.Tx) error {
		q := db.On(tx)
		ids, err := q.LockEvictedDevices(ctx, db.LockEvictedDevicesParams{Cutoff: cutoff, MaxRows: int32(c.BatchRows)})
		if err != nil || len(ids) == 0 {
			return err
		}
		if err := q.CancelPendingForDevices(ctx, db.CancelPendingOfDevicesParams{DeviceIds: ids, Reason: db.ReasonDeviceEvicted}); err != nil {
			return fmt.Errorf("cancel pending deliveries: %w", err)
		}
		n, err = q.DeleteDevices(ctx, ids)
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("delete evicted devices: %w", err)
	}
	return n, nil
}

// messageBatch deletes one batch: up to BatchRows ledger rows of the oldest
// retainable messages and, once their ledger is gone, the messages and the
// payloads left unreferenced. It reports whether there may be more.
func (c RetainerConfig) messageBatch(ctx context.Context, q *db.Queries, cutoff time.Time, removed *Removed) (bool, error) {
	ids, err := q.RetainableMessages(ctx, db.RetainableMessagesParams{Cutoff: cutoff, MaxMessages: int32(c.BatchMessages)})
	if err != nil {
		return false, fmt.Errorf("find retainable messages: %w", err)
	}
	if len(ids) == 0 {
		return false, nil
	}
	rows, err := q.DeleteLedgerRows(ctx, db.DeleteLedgerRowsParams{MessageIds: ids, MaxRows: int32(c.BatchRows)})
	removed.Deliveries += rows
	if err != nil {
		return false, fmt.Errorf("delete ledger rows: %w", err)
	}
	if rows == int64(c.BatchRows) {
		// These messages may have more ledger left.
		return true, nil
	}
	// Their receipts go with the ledger, after it: a receipt is written
	// only for a delivery the ledger has, so none is added once it is gone.
	receipts, err := q.DeleteReceiptRows(ctx, db.DeleteReceiptRowsParams{MessageIds: ids, MaxRows: int32(c.BatchRows)})
	removed.Receipts += receipts
	if err != nil {
		return false, fmt.Errorf("delete receipts: %w", err)
	}
	if receipts == int64(c.BatchRows) {
		return true, nil
	}
	payloads, err := c.deleteMessages(ctx, ids)
	removed.Messages += int64(len(payloads))
	if err != nil {
		return false, err
	}
	slices.Sort(payloads)
	n, err := q.DeleteUnreferencedPayloads(ctx, slices.Compact(payloads))
	removed.Payloads += n
	if err != nil {
		return false, fmt.Errorf("delete payloads: %w", err)
	}
	// Nothing deleted at all means the messages found are not deletable
	// (which only a concurrent change could cause): stop rather than spin.
	return rows > 0 || receipts > 0 || len(payloads) > 0, nil
}

// deleteMessages deletes those of ids whose ledger and receipts are gone,
// and returns their payloads. It locks the messages first, as a receipts
// write does (db.WriteReceipts) before it reads the ledger: a receipt
// whose write read a delivery just before its deletion has committed once
// the lock is granted, and keeps its message, whose receipts the next run
// deletes, instead of outliving it.
func (c RetainerConfig) deleteMessages(ctx context.Context, ids []int64) ([]int64, error) {
	var payloads []int64
	err := db.InTx(ctx, c.Pool, func(tx pgx.Tx) error {
		q := db.On(tx)
		if err := q.LockMessages(ctx, ids); err != nil {
			return err
		}
		var err error
		payloads, err = q.DeleteMessagesWithoutLedger(ctx, ids)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("delete messages: %w", err)
	}
	return payloads, nil
}

func (c RetainerConfig) now(ctx context.Context) (time.Time, error) {
	if c.Now != nil {
		return c.Now(ctx)
	}
	return db.On(c.Pool).DatabaseNow(ctx)
}

// RetainWorker runs the Retainer as River's periodic job.
type RetainWorker struct {
	river.WorkerDefaults[RetainArgs]
	r *Retainer
}

// NewRetainWorker returns the worker of the periodic retention job.
func NewRetainWorker(r *Retainer) *RetainWorker { return &RetainWorker{r: r} }

// Timeout lets a run spend its budget: River's job timeout is the chunks'
// (30 s by default), which a run's last statements could pass.
func (w *RetainWorker) Timeout(*river.Job[RetainArgs]) time.Duration {
	return w.r.cfg.Budget + time.Minute
}

// Work deletes what is older than the retention.
func (w *RetainWorker) Work(ctx context.Context, _ *river.Job[RetainArgs]) error {
	// Its own completed runs go first, as the materializer's do, so that
	// they never bury the chunk jobs in River UI's lists.
	if err := db.DeleteCompletedRuns(ctx, w.r.cfg.Pool, RetainKind); err != nil {
		return err
	}
	removed, err := w.r.Run(ctx)
	if removed != (Removed{}) {
		w.r.cfg.Logger.InfoContext(ctx, "deleted history older than the retention",
			"messages", removed.Messages, "deliveries", removed.Deliveries, "receipts", removed.Receipts,
			"payloads", removed.Payloads, "idempotency_keys", removed.IdempotencyKeys,
			"evicted_devices", removed.Devices, "audit_entries", removed.AuditEntries,
			"dashboard_sessions", removed.Sessions, "webhook_events", removed.WebhookEvents,
			"web_push_credentials", removed.Credentials, "cap_histories", removed.CapHistories,
			"deleted_devices", removed.DeletedDevices, "ledger_key_bytes_freed", removed.LedgerKeyFreed)
	}
	return err
}
