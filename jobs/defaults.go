package jobs

import "time"

// The defaults of Herald's tuning, all in one place: the River clients,
// the lanes, the chunk worker, the breakers, the background services
// (NewWaker, NewPromoter, NewStatusReporter, NewRetainer, NewMaterializer,
// NewReconciler) and the schedule limits take these when their setting is
// zero, `herald serve` reads its environment over them, and its --help and
// the configuration table (docs/configuration.md) show them (a test holds
// both to these values). docs/operations.md, "Sizing", explains how to
// change them.
const (
	// DefaultChunkSize is the number of devices per chunk job. FCM's
	// multicast call takes at most 500 tokens, so a chunk's FCM devices
	// always fit one call; a chunk is small enough that a large audience
	// spreads over every worker of a lane, and large enough that per-chunk
	// costs (one ledger read and one write, one River fetch) stay a small
	// share of the work.
	DefaultChunkSize = 500

	// DefaultUrgentWorkers and DefaultBulkWorkers are each lane's chunks
	// running at once in a process. There are enough bulk workers that every
	// chunk of a 25,000-device message starts at once, leaving the
	// providers' in-flight limits to bound the real concurrency.
	DefaultUrgentWorkers = 10
	DefaultBulkWorkers   = 50

	// DefaultPoolSize is a process's shared connections. A chunk holds one
	// only for its read at the start; its answers are written by the
	// process's ledger writer, one batch for all running chunks every few
	// tens of milliseconds (ledger.go), so 20 serve the 50 bulk workers;
	// more only lets more of them reach PostgreSQL at the same instant,
	// which on a small machine takes CPU from the sends.
	DefaultPoolSize = 20

	// DefaultFetchPollInterval is how often a lane looks for due chunks
	// when nothing told it to. A chunk's instant wakes its lane (Waker), an
	// inserted chunk and a free worker make it fetch at once, so the poll
	// only bounds the lag of a chunk inserted less than the Waker's look
	// (500 ms) before its time. Each poll is a query, and an idle process's
	// polls were most of the PostgreSQL CPU a message cost before its
	// instant: at 50 ms, 40 fetches a second for the two lanes, about
	// 4 us of PostgreSQL CPU per device of a 25,000-device message scheduled
	// ten seconds ahead (herald bench: wait 9.1 and 9.3 against 6.8 and 4.6
	// at 250 ms).
	DefaultFetchPollInterval = 250 * time.Millisecond

	// DefaultLookahead is how long before its time a chunk is made
	// available to fetch (fetching still waits for its time); see
	// NewRiverClient and Promoter.
	DefaultLookahead = 10 * time.Second

	// DefaultChunkTimeout bounds one attempt of a chunk; DefaultRescueAfter
	// is how long a chunk may run before River, finding its process gone,
	// retries it. The second must exceed the first, so that a chunk is
	// never retried while its first attempt may still be sending.
	DefaultChunkTimeout = 30 * time.Second
	DefaultRescueAfter  = time.Minute

	// DefaultLivenessPing is how often a worker checks the connection that
	// holds its liveness lock (Liveness); a worker that lost it stops
	// sending within about this long.
	DefaultLivenessPing = 250 * time.Millisecond
	// DefaultLivenessFence is how long after its last good ping a worker
	// stops sending (Liveness.Held): half DefaultTakeoverGrace.
	DefaultLivenessFence = time.Second
	// DefaultTakeoverEvery is how often a worker looks for running chunks
	// whose worker is gone (Takeover), and DefaultTakeoverGrace how long a
	// worker's lock must stay free before its chunks are taken: twice
	// DefaultLivenessFence, so that a worker that lost its connection but
	// lives has stopped sending, or taken its lock again, first.
	DefaultTakeoverEvery = time.Second
	DefaultTakeoverGrace = 2 * time.Second
	// DefaultLivenessLease is how long a worker's liveness session may
	// stay silent (no ping) before Takeover ends it: a worker frozen or
	// cut off from the database, whose session PostgreSQL would otherwise
	// keep open, its lock and chunks with it, until River's rescue. Three
	// times DefaultLivenessFence, so that the worker stopped sending two
	// seconds before; a worker stalled that long that comes back takes its
	// lock again.
	DefaultLivenessLease = 3 * time.Second

	// DefaultShutdownTimeout is how long a stopping worker lets the chunk
	// attempts it is running finish (and write their ledger) before it
	// cancels them and hands them back: inside the 30 s Kubernetes gives a
	// pod between SIGTERM and SIGKILL, with room to write.
	DefaultShutdownTimeout = 25 * time.Second

	// DefaultMaterializeEvery is how often River's leader runs the schedule
	// materializer: a fraction of DefaultScheduleLead, so that a run is
	// looked at several times before it is due.
	DefaultMaterializeEvery = 15 * time.Second

	// DefaultScheduleLead is how long before a run its message is made: long
	// enough that the audience is expanded and the chunks are waiting well
	// before the run's instant, short enough that devices registered since
	// are included.
	DefaultScheduleLead = 2 * time.Minute

	// DefaultBreakerCooldown is how long an open breaker waits before one
	// probe may go out; it doubles after each failed probe up to
	// DefaultBreakerMaxCooldown (or the cooldown itself, when longer).
	DefaultBreakerCooldown    = time.Second
	DefaultBreakerMaxCooldown = 30 * time.Second

	// DefaultBreakerThreshold is how many transient failures in a row open
	// a breaker: one lost request does not park a provider, a dead one is
	// noticed within the first handful.
	DefaultBreakerThreshold = 5

	// DefaultRetention is how long a settled message, its ledger and its
	// idempotency key are kept (HERALD_RETENTION); finished River jobs are
	// kept no longer.
	DefaultRetention = 30 * 24 * time.Hour

	// DefaultDeviceRetention is how long an evicted device, and its dead
	// token, is kept before retention deletes it (HERALD_DEVICE_RETENTION):
	// until then, registering its token again brings it back as it was.
	DefaultDeviceRetention = 30 * 24 * time.Hour

	// DefaultAuditRetention is how long an entry of the audit log is kept
	// (HERALD_AUDIT_RETENTION): a quarter, long enough to look into an
	// incident found late.
	DefaultAuditRetention = 90 * 24 * time.Hour

	// SessionRetention is how long after it ended (expired, or would have,
	// when it was revoked) a dashboard session's row is kept.
	SessionRetention = 24 * time.Hour

	// DefaultReceiptWindow is how long after its message's expiry a push's
	// receipt token is still taken (HERALD_RECEIPT_WINDOW): a push reaches
	// its device by the expiry at the latest, and a week leaves the user
	// time to open it.
	DefaultReceiptWindow = 7 * 24 * time.Hour

	// DefaultLifetime is a message's lifetime when no expiry is given (and
	// each wave's, for a local-time message).
	DefaultLifetime = time.Hour

	// DefaultReconcileEvery is how often River's leader looks for messages
	// no chunk will settle.
	DefaultReconcileEvery = time.Minute

	// DefaultScheduleMinInterval is the least time between two runs of a
	// schedule: cron's own granularity, so that by default only the
	// operator's choice refuses anything.
	DefaultScheduleMinInterval = time.Minute
	// DefaultScheduleMaxAhead is how many runs of one schedule may be made
	// into messages that have not started. A local-time schedule has its
	// runs of the next 26 hours made at once (localTimeSpread), so this
	// allows one run every quarter of an hour in local time (some 105
	// waiting) and refuses denser ones; a schedule in one zone has only the
	// runs of the next HERALD_SCHEDULE_LEAD waiting.
	DefaultScheduleMaxAhead = 120
	// DefaultMaxSchedules is how many live (not deleted) schedules the
	// installation may hold: far more than an app's reminders need, and
	// few enough that the every-minute runs of all of them (1,000
	// messages a minute at most) stay a small share of what one worker
	// sends.
	DefaultMaxSchedules = 1000

	// DefaultReconcileGrace is how long past its expiry a message may stay
	// unsettled before the Reconciler settles it: longer than a chunk
	// attempt, which may send until its timeout ends, so that no attempt
	// still running is overtaken. Register takes at least twice the chunk
	// timeout.
	DefaultReconcileGrace = 5 * time.Minute

	// DefaultWakeEvery is the Waker's interval between looks ahead for
	// chunks falling due, DefaultWakeAhead how far each looks: a pass that
	// fails leaves time for the next. A look ahead no longer than the
	// interval takes the longer of DefaultWakeAhead and twice the interval.
	// A chunk inserted less than the interval before its time may start on
	// the poll instead.
	DefaultWakeEvery = 500 * time.Millisecond
	DefaultWakeAhead = 2 * time.Second

	// DefaultPromoteEvery is the Promoter's interval between passes: well
	// inside DefaultLookahead, so that a missed pass still leaves a chunk
	// available in time.
	DefaultPromoteEvery = time.Second

	// DefaultStatusEvery is how often a process publishes its breakers'
	// states for GET /v1/providers (StatusReporter).
	DefaultStatusEvery = 2 * time.Second

	// DefaultGaugesEvery is how often a process reads the database's
	// gauges: a scrape every 15 s or 30 s sees a reading at most this old.
	DefaultGaugesEvery = 10 * time.Second

	// DefaultRetainBatchRows is the most ledger rows, idempotency keys or
	// devices one retention statement deletes, DefaultRetainBatchMessages
	// the most messages one batch takes on, and DefaultRetainBudget how
	// long one retention run works before it leaves the rest to the next,
	// so that a backlog (retention shortened, or first enabled on a year of
	// history) is worked off over several runs.
	DefaultRetainBatchRows     = 10_000
	DefaultRetainBatchMessages = 100
	DefaultRetainBudget        = 20 * time.Second

	// DefaultCompactAbove is the size above which the retention rebuilds
	// the ledger's primary key once it is mostly emptied pages
	// (db.CompactLedgerKey): about two million rows' worth, so a rebuild
	// follows only a message of millions.
	DefaultCompactAbove int64 = 64 << 20
)

// Webhooks (webhook.go, webhook_dispatch.go).
const (
	// DefaultWebhookWorkers is how many webhook calls a worker process
	// makes at once, on a queue of their own (QueueWebhooks): a slow
	// receiver holds these, never a chunk lane's workers.
	DefaultWebhookWorkers = 4
	// DefaultWebhookTimeout bounds one call; the answer's body is ignored.
	DefaultWebhookTimeout = 10 * time.Second
	// DefaultWebhookRetryFirst is the wait before a failed call's first
	// retry; each later wait doubles, up to DefaultWebhookRetryMax.
	DefaultWebhookRetryFirst = 5 * time.Second
	DefaultWebhookRetryMax   = time.Hour
	// DefaultWebhookGiveUp is how long after its first attempt a batch is
	// given up: a receiver down for a day misses what happened meanwhile.
	DefaultWebhookGiveUp = 24 * time.Hour
	// DefaultWebhookDispatchEvery is how often each worker process turns
	// the events written since into batch jobs.
	DefaultWebhookDispatchEvery = time.Second
	// DefaultWebhookHold is how long a batch that would not be full waits
	// for more of its message's events: a message failing on many devices
	// as it is sent fills its batches instead of leaving a part-batch each
	// pass, and a lone event waits about this long more.
	DefaultWebhookHold = time.Second
	// WebhookEventRetention is how long after they were written the events
	// of a batch given up are kept, so that its job can be retried from
	// River UI: the day of its tries, and the week River keeps a discarded
	// job.
	WebhookEventRetention = 8 * 24 * time.Hour
)
