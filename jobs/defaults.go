package jobs

import "time"

// The defaults of a worker's tuning, all in one place: the River clients,
// the lanes, the chunk worker, the Promoter and the schedule materializer
// take these when their setting is zero, and `herald serve` reads its
// environment over them. The README's "Sizing" explains how to change them.
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

	// DefaultRetention is how long a settled message, its ledger and its
	// idempotency key are kept (HERALD_RETENTION); finished River jobs are
	// kept no longer.
	DefaultRetention = 30 * 24 * time.Hour

	// DefaultDeviceRetention is how long an evicted device, and its dead
	// token, is kept before retention deletes it (HERALD_DEVICE_RETENTION):
	// until then, registering its token again brings it back as it was.
	DefaultDeviceRetention = 30 * 24 * time.Hour

	// DefaultLifetime is a message's lifetime when no expiry is given (and
	// each wave's, for a local-time message).
	DefaultLifetime = time.Hour

	// DefaultReconcileEvery is how often River's leader looks for messages
	// no chunk will settle.
	DefaultReconcileEvery = time.Minute
)
