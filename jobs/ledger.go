package jobs

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/heraldpush/herald/db"
	"github.com/heraldpush/herald/jobs/push"
)

// The ledger writer. A provider's answer is worth nothing until it is in the
// ledger: a chunk retried after a crash sends again to every device whose
// row is still pending. So answers are not kept by the chunk that got them
// until it finishes; each is handed, as it comes, to its process's writer,
// which commits the answers of all running chunks together every
// recordEvery. The time between an answer and its durable row is bounded by
// that and one write, whatever the chunks are doing, and a process killed
// mid fan-out resends about the answers of that last moment.
//
// The writer also keeps what a chunk sent when a write fails because the
// database is away (a restart, a failover): it keeps the answers and tries
// again with backoff, while the chunk waits for its close to be written
// within its own timeout, instead of failing and having its retry send
// everything again.

// recordEvery is how often a process's writer commits the answers that came
// back: often enough that little is lost with a process, seldom enough
// that a write carries the answers of many chunks.
const recordEvery = 25 * time.Millisecond

// MaxUnwritten bounds, per ledger writer, the pushes that are sent or being
// sent and whose answers are not yet in the ledger: a chunk reserves a place
// before each request and the place is freed once the answer is written. A
// writer slowed down (a loaded database, a machine the database shares)
// then slows the sends instead of piling up answers a crash would lose: a
// process killed mid fan-out resends at most this many pushes per lane,
// and the leads of the messages' first chunks running (ledger.reserve: at
// most firstChunkLead a channel each). A healthy writer never holds this
// many: at 25,000 sends a second it holds the requests in flight and about
// one write's worth of answers.
const MaxUnwritten = 1000

// recordTimeout bounds one write of the ledger writer.
const recordTimeout = 10 * time.Second

// Backoff of the ledger writer while the database is unavailable.
const (
	retryFirst = 50 * time.Millisecond
	retryMax   = time.Second
)

// ledger is a process's writer of chunk results through one connection pool
// (a lane's: the urgent lane's writes never queue behind the bulk lane's).
// Its goroutine runs while it holds something to write, and writes through
// one connection of the pool it holds meanwhile: each of its statements is
// planned once on it. Through the pool, each write went to whichever
// connection was idle, and its statements were planned again on every one
// of them, at the instant and after every ANALYZE of the tables they read
// (a plan of the runs' insert or the settle is a millisecond or more).
type ledger struct {
	pool    *pgxpool.Pool
	logger  *slog.Logger
	clock   *Clock
	metrics *Metrics
	// chunkTimeout is a chunk attempt's bound: the writer keeps the
	// answers of a chunk that gave up waiting for its close that long more.
	chunkTimeout time.Duration
	// webhooks says whether a write records its failures' webhook events.
	webhooks *WebhookTypes

	mu      sync.Mutex
	chunks  map[chunkKey]*chunkRecord
	running bool
	// owed counts the places reserved: requests made or being made whose
	// answers are not yet written (or given up on); room is closed, and
	// replaced, whenever it falls.
	owed int
	room chan struct{}
}

// reserve waits for a place for one request (MaxUnwritten) and takes it; it
// reports false if ctx ends first. A lead's request (a message's first
// devices, push.WithLead) does not wait: it may take a place past
// MaxUnwritten. When many messages fall due at once the writer is full
// from the first round trip on, and its places free up only as fast as
// the database, itself at its busiest then, commits the writes: a
// message's first devices waited for hundreds of milliseconds. A lead is a
// few requests a channel for a message's first chunk, so the places it
// adds are few (firstChunkLead) and the bound on what a crash resends
// grows by as little.
func (l *ledger) reserve(ctx context.Context, lead bool) bool {
	for {
		l.mu.Lock()
		if lead || l.owed < MaxUnwritten {
			l.owed++
			l.mu.Unlock()
			return true
		}
		if l.room == nil {
			l.room = make(chan struct{})
		}
		room := l.room
		l.mu.Unlock()
		select {
		case <-room:
		case <-ctx.Done():
			return false
		}
	}
}

// release frees n places whose requests were never made.
func (l *ledger) release(n int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.releaseLocked(n)
}

// releaseLocked frees n places, and wakes the chunks waiting for one.
func (l *ledger) releaseLocked(n int) {
	l.owed -= n
	if l.room != nil && n > 0 {
		close(l.room)
		l.room = nil
	}
}

type chunkKey struct {
	message int64
	chunk   int
}

// chunkRecord is one chunk attempt's business with the ledger writer. Its
// fields below mu are guarded by the ledger's mu.
type chunkRecord struct {
	a         *running
	startedAt time.Time
	// results are the chunk's; results[i] is written before i is handed
	// over (add) and not after.
	results []push.Result
	// done is closed once the chunk's close is written, or the writer gave
	// up on it (err says why).
	done chan struct{}
	err  error

	// unwritten are the indexes of results handed over and not yet
	// written; owed, the places their requests hold (ledger.reserve).
	unwritten []int
	owed      int
	// closing: the chunk has handed everything over and asks for its
	// close (timings, settle check); parked says some delivery waits for a
	// breaker, so the chunk is not finished.
	closing, parked bool
	// held is how many of its deliveries wait for their users' quiet
	// hours to end as the attempt ends (heldAt), written with its close.
	held int32
	// abandonedAt is when the chunk stopped waiting for its close (its
	// attempt timed out); the writer keeps its answers for a while more.
	abandonedAt time.Time
	// handed are the indexes of every result handed over so far, and
	// rewrite says the chunk's close writes them all again (ledger.lost).
	handed  []int
	rewrite bool

	// firstAccept and lastAccept gather the chunk's accepted answers over
	// its writes, for the close; only the writer's goroutine uses them.
	firstAccept, lastAccept *time.Time
}

// newLedger returns a writer of chunk results through pool.
func newLedger(pool *pgxpool.Pool, logger *slog.Logger, clock *Clock, metrics *Metrics, chunkTimeout time.Duration) *ledger {
	return &ledger{pool: pool, logger: logger, clock: clock, metrics: metrics, chunkTimeout: chunkTimeout, chunks: map[chunkKey]*chunkRecord{}}
}

func recordKey(a FanOutArgs) chunkKey { return chunkKey{a.MessageID, a.Chunk} }

// drain waits until this process holds nothing unwritten of a's chunk: an
// earlier attempt that gave up waiting for the database may have left
// answers here, and the ledger must have them before a new attempt reads
// what is pending.
func (l *ledger) drain(ctx context.Context, a FanOutArgs) error {
	l.mu.Lock()
	r := l.chunks[recordKey(a)]
	l.mu.Unlock()
	if r == nil {
		return nil
	}
	select {
	case <-r.done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("wait for an earlier attempt's results to be written: %w", ctx.Err())
	}
}

// open registers a chunk attempt whose answers will fill results.
func (l *ledger) open(c *running, startedAt time.Time, results []push.Result) *chunkRecord {
	r := &chunkRecord{a: c, startedAt: startedAt, results: results, done: make(chan struct{}), held: heldAt(c, startedAt)}
	l.mu.Lock()
	defer l.mu.Unlock()
	if old := l.chunks[recordKey(c.FanOutArgs)]; old != nil {
		// An earlier attempt's answers still unwritten (drain gave up on
		// them) are no longer this writer's to count.
		l.releaseLocked(old.owed)
		old.unwritten, old.owed = nil, 0
	}
	l.chunks[recordKey(c.FanOutArgs)] = r
	return r
}

// add hands over the results at idx, to be written with the next write;
// reserved says each is the answer of a request that took a place.
func (l *ledger) add(r *chunkRecord, reserved bool, idx ...int) {
	if len(idx) == 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.chunks[recordKey(r.a.FanOutArgs)] != r {
		// The writer gave up on this attempt (a write the database
		// refused): its retry sends these again.
		if reserved {
			l.releaseLocked(len(idx))
		}
		return
	}
	r.unwritten = append(r.unwritten, idx...)
	r.handed = append(r.handed, idx...)
	if reserved {
		r.owed += len(idx)
	}
	l.startLocked()
}

// close asks for the chunk's close to be written after its answers, and
// waits until it is. parked says some of the chunk's deliveries wait for a
// breaker.
//
// It waits even when ctx was cancelled (a shutdown): pushes that were sent
// must be written, or the retry sends them again. It waits until ctx's
// deadline (the attempt's timeout, which leaves a reserve for this after
// sending), and at least recordTimeout: on a machine the database shares,
// a write can take seconds, and an attempt that gave up on a write in
// progress would leave its retry to send those answers again.
func (l *ledger) close(ctx context.Context, r *chunkRecord, parked bool) error {
	l.mu.Lock()
	r.closing, r.parked = true, parked
	l.startLocked()
	l.mu.Unlock()
	deadline := time.Now().Add(recordTimeout)
	if d, ok := ctx.Deadline(); ok && d.After(deadline) {
		deadline = d
	}
	wait, cancel := context.WithDeadline(context.WithoutCancel(ctx), deadline)
	defer cancel()
	select {
	case <-r.done:
		return r.err
	case <-wait.Done():
		l.mu.Lock()
		r.abandonedAt = time.Now()
		l.mu.Unlock()
		return fmt.Errorf("record results: the database did not take them in time: %w", wait.Err())
	}
}

func (l *ledger) startLocked() {
	if !l.running {
		l.running = true
		go l.run()
	}
}

// run writes what the chunks handed over every recordEvery, until nothing
// is left. A write the database was not there for is kept and tried again,
// backing off; one it refused fails the chunks it held.
func (l *ledger) run() {
	var (
		backoff time.Duration
		failing error
		held    = db.Hold(l.pool)
	)
	defer held.Release()
	for last := time.Now(); ; {
		// A write that took longer than recordEvery is followed by the
		// next at once: answers wait for at most one write in progress.
		wait := recordEvery - time.Since(last)
		if backoff > 0 {
			wait = backoff
		}
		time.Sleep(wait)
		last = time.Now()
		batch, more := l.take()
		if !more {
			return
		}
		if len(batch) == 0 {
			continue
		}
		err := l.writeThrough(held, batch)
		switch {
		case err == nil:
			if failing != nil {
				l.logger.Info("ledger writes resumed: the results kept meanwhile are written")
			}
			backoff, failing = 0, nil
			l.written(batch)
		case errors.Is(err, db.ErrUnavailable), errors.Is(err, context.DeadlineExceeded):
			// The database away, or too slow to answer within
			// recordTimeout (a connection hung by a failover).
			if failing == nil {
				l.logger.Warn("ledger write failed: the database is unavailable; results are kept and written when it is back",
					"error", err)
			}
			backoff, failing = min(max(2*backoff, retryFirst), retryMax), err
			l.putBack(batch)
			l.lost()
		default:
			l.logger.Error("ledger write failed; its chunks fail and will be retried", "error", err)
			l.failed(batch, err)
		}
	}
}

// pick is one chunk's share of a write.
type pick struct {
	r     *chunkRecord
	idx   []int
	close bool
	// owed are the places idx's answers hold (ledger.reserve).
	owed int
	// maybeWritten says the chunk lost touch with the database (its
	// rewrite, ledger.lost): a write of its answers may have committed
	// unacknowledged, so they are written as results that may exist.
	maybeWritten bool
}

// take collects what every chunk has to write. more is false, and the
// writer ends, when no chunk is left.
func (l *ledger) take() (batch []pick, more bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for key, r := range l.chunks {
		if !r.abandonedAt.IsZero() && time.Since(r.abandonedAt) > l.chunkTimeout {
			// Its chunk gave up long ago and the database is still away:
			// the chunk's retry, here or in another process, sends these
			// again.
			r.err = errors.New("results dropped: the database was unavailable for too long")
			l.releaseLocked(r.owed)
			delete(l.chunks, key)
			close(r.done)
			l.logger.Warn("chunk results dropped after the database stayed unavailable; its retry sends them again",
				"message_id", push.FormatMessageID(r.a.MessageID), "chunk", r.a.Chunk, "unwritten", len(r.unwritten))
			continue
		}
		if len(r.unwritten) == 0 && !r.closing {
			continue
		}
		idx := r.unwritten
		if r.closing && r.rewrite {
			// Written twice, a result counts once (db.RecordResults).
			idx = slices.Clone(r.handed)
		}
		batch = append(batch, pick{r: r, idx: idx, close: r.closing, owed: r.owed, maybeWritten: r.rewrite})
		r.unwritten, r.owed = nil, 0
	}
	if len(l.chunks) == 0 {
		l.running = false
		return nil, false
	}
	return batch, true
}

// putBack returns a failed write's answers to their chunks, ahead of what
// came since.
func (l *ledger) putBack(batch []pick) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, p := range batch {
		p.r.unwritten = append(p.idx, p.r.unwritten...)
		p.r.owed += p.owed
	}
}

// lost marks every chunk being written as having lost touch with the
// database: what it wrote before may be gone. A write is acknowledged before
// it is durable (db.CommitWithoutWaitingForDisk), and a primary that
// crashes, or fails over to a standby that had not yet received it, takes
// the acknowledged writes of its last moments with it, while the chunks go
// on and close on the server that comes back. A chunk's close then writes
// every result it has again, so that none of its deliveries stays pending
// for good once River marks it completed: what is already there is not
// changed, and what was lost is written.
func (l *ledger) lost() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, r := range l.chunks {
		r.rewrite = true
	}
}

// rewrite asks r's close to write every result it has again (lost): its
// chunk stopped sending because its process lost its liveness lock, and so
// its connection to the database, whether or not a write failed meanwhile.
func (l *ledger) rewrite(r *chunkRecord) {
	l.mu.Lock()
	defer l.mu.Unlock()
	r.rewrite = true
}

// written counts what a write committed and releases the chunks it closed.
func (l *ledger) written(batch []pick) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, p := range batch {
		l.releaseLocked(p.owed)
		if p.close && len(p.r.unwritten) == 0 {
			delete(l.chunks, recordKey(p.r.a.FanOutArgs))
			close(p.r.done)
		}
	}
}

// failed fails the chunks of a write the database refused.
func (l *ledger) failed(batch []pick, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, p := range batch {
		l.releaseLocked(p.owed)
		if l.chunks[recordKey(p.r.a.FanOutArgs)] == p.r {
			l.releaseLocked(p.r.owed)
			p.r.unwritten, p.r.owed = nil, 0
			delete(l.chunks, recordKey(p.r.a.FanOutArgs))
			p.r.err = fmt.Errorf("record results: %w", err)
			close(p.r.done)
		}
	}
}

// writeThrough writes a batch through the connection the writer holds while it
// runs, taking it within recordTimeout if need be.
func (l *ledger) writeThrough(held *db.Held, batch []pick) error {
	ctx, cancel := context.WithTimeout(context.Background(), recordTimeout)
	defer cancel()
	return held.Write(ctx, func(conn db.Batcher) error { return l.write(conn, batch) })
}

// write commits a batch in one transaction through conn, each message's
// answers in one write of its ledger rows and counters.
func (l *ledger) write(conn db.Batcher, batch []pick) error {
	var (
		writes  []db.ChunkWrite
		counted [][]settledDelivery
		byMsg   = map[int64]int{}
		events  = l.webhooks.WantsFailures()
		// withheld: some webhook wants delivery.withheld.
		withheld = l.webhooks.WantsWithheld()
	)
	for _, p := range batch {
		c := l.resultsOf(p.r.a, p.r.results, p.idx)
		i, ok := byMsg[p.r.a.MessageID]
		if !ok {
			i = len(writes)
			byMsg[p.r.a.MessageID] = i
			writes = append(writes, db.ChunkWrite{
				MessageID:      p.r.a.MessageID,
				Evict:          db.EvictDevicesParams{SentAfter: p.r.startedAt},
				FailureEvents:  events,
				WithheldEvents: withheld,
			})
			counted = append(counted, nil)
		}
		w := &writes[i]
		if p.maybeWritten {
			// A run of them may be in: the upsert skips what a run
			// holds, where a run written twice would count its devices
			// twice.
			clear(c.results.First)
		}
		w.Results.Append(c.results)
		if e := p.r.a.Execution; e != 0 && !p.maybeWritten {
			if w.Executions == nil {
				w.Executions = map[int32]int64{}
			}
			w.Executions[int32(p.r.a.Chunk)] = e
		}
		if len(c.evictIDs) > 0 {
			w.Evict.Ids = append(w.Evict.Ids, c.evictIDs...)
			w.Evict.Reasons = append(w.Evict.Reasons, c.evictReasons...)
			// Evict unless re-registered since the earliest of the
			// chunks' sends began.
			if p.r.startedAt.Before(w.Evict.SentAfter) {
				w.Evict.SentAfter = p.r.startedAt
			}
		}
		counted[i] = append(counted[i], c.counted...)
		first, last := earlier(p.r.firstAccept, c.firstAccept), later(p.r.lastAccept, c.lastSeen)
		if p.close {
			// The chunk's timings are written once, with its close.
			chunk := db.RecordChunkParams{
				MessageID: p.r.a.MessageID, Chunk: int32(p.r.a.Chunk), StartedAt: &p.r.startedAt,
				FirstAcceptedAt: first, LastAcceptedAt: last, Held: p.r.held,
			}
			if !p.r.parked {
				finishedAt := l.clock.Now()
				chunk.FinishedAt = &finishedAt
			}
			w.Chunks = append(w.Chunks, chunk)
			w.Settle = true
		}
		p.r.firstAccept, p.r.lastAccept = first, last
	}
	// Record even when the chunks' attempts are over (timeout, shutdown):
	// pushes that were sent must be written, or the retry sends them
	// again. The messages' rows, which every chunk of a message writes
	// (the counters), are locked last and held only to the commit, on the
	// server (db.WriteChunks). The messages are dispatching here, so no
	// cancel can be holding one while waiting for these deliveries (see
	// jobs/state.go for the lock order).
	ctx, cancel := context.WithTimeout(context.Background(), recordTimeout)
	defer cancel()
	out, err := db.WriteChunks(ctx, conn, writes)
	if err != nil {
		return err
	}
	for i, w := range writes {
		l.metrics.count(priorityOf(batch, w.MessageID), counted[i])
		if out[i].Settled != "" {
			l.metrics.settled(out[i].Priority, out[i].SLOSkewMs)
		}
	}
	return nil
}

// priorityOf is the priority of a message in batch, for the metrics.
func priorityOf(batch []pick, messageID int64) string {
	i := slices.IndexFunc(batch, func(p pick) bool { return p.r.a.MessageID == messageID })
	return batch[i].r.a.Priority
}

func earlier(a, b *time.Time) *time.Time {
	if a == nil || (b != nil && b.Before(*a)) {
		return b
	}
	return a
}

func later(a, b *time.Time) *time.Time {
	if a == nil || (b != nil && b.After(*a)) {
		return b
	}
	return a
}

// chunkResults are results of a chunk's targets as one write takes them.
type chunkResults struct {
	results               db.RecordResultsParams
	evictIDs              []int64
	evictReasons          []string
	firstAccept, lastSeen *time.Time
	counted               []settledDelivery
}

// resultsOf gathers the results of the targets at idx for one write: the
// ledger's rows, the dead tokens to evict, the chunk's first and last
// acceptance, and what the metrics count once the write has committed.
func (l *ledger) resultsOf(a *running, results []push.Result, idx []int) chunkResults {
	var c chunkResults
	for _, i := range idx {
		r := results[i]
		if r.At.IsZero() {
			// Not attempted (parked by the breaker, or not sent in time):
			// nothing to write; it stays pending.
			continue
		}
		at := l.clock.ToDB(r.At)
		status, acceptedUs := "failed", int64(0)
		switch {
		case r.Accepted:
			status, acceptedUs = "accepted", at.UnixMicro()
			if c.firstAccept == nil || at.Before(*c.firstAccept) {
				c.firstAccept = &at
			}
			if c.lastSeen == nil || at.After(*c.lastSeen) {
				c.lastSeen = &at
			}
		case r.Reason.Transient():
			// Attempted, not settled: it waits for the breaker (or its
			// device's throttle) and is retried when the chunk wakes,
			// until it expires.
			status = "pending"
		case a.Targets[i].Held:
			// Not sent yet: it waits for its user's quiet hours to end.
			status = "pending"
		case a.Targets[i].Expires:
			// Not sent: its user's quiet hours outlast its message.
			status = "expired"
		case r.Reason.Cancels():
			// Not sent: its device is no longer the delivery's, or its
			// user's preferences withheld it.
			status = "cancelled"
		}
		attemptedUs := at.UnixMicro()
		if status == "cancelled" || r.Reason.Withholds() {
			attemptedUs = 0
		}
		if t := &a.Targets[i]; t.Held {
			// Pending, due when the quiet hours end (withhold.go).
			held := *t
			held.DueAt = t.NotBefore
			c.results.AddThrottled(a.delivery(&held), string(r.Reason), 0, t.NotBefore.UnixMicro())
		} else if throttled(r) {
			// Pending until its device's throttle runs out (throttle.go).
			notBefore := at.Add(throttleWait(r, a.Targets[i].Attempt))
			c.results.AddThrottled(a.delivery(&a.Targets[i]), string(r.Reason), attemptedUs, notBefore.UnixMicro())
		} else {
			c.results.Add(a.delivery(&a.Targets[i]), status, string(r.Reason), attemptedUs, acceptedUs)
		}
		c.counted = append(c.counted, settledDelivery{a.Targets[i].Channel, status, r.Reason, at.Sub(a.due(&a.Targets[i]))})
		if !r.Accepted && r.Reason.Evicts() {
			c.evictIDs = append(c.evictIDs, a.Targets[i].DeviceID)
			c.evictReasons = append(c.evictReasons, string(r.Reason))
		}
	}
	return c
}
