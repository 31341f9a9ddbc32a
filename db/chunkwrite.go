package db

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// ChunkWrite is one message's part of a ledger write, from one or more of
// its chunks: the devices to evict, what the workers saw of those chunks,
// the deliveries, and, on a chunk's last write, whether to settle the
// message.
type ChunkWrite struct {
	MessageID int64
	// Evict, when it holds ids, evicts the devices whose tokens are dead.
	Evict  EvictDevicesParams
	Chunks []RecordChunkParams
	// Results are the message's deliveries; every row's message is
	// MessageID (Results.Add).
	Results RecordResultsParams
	// Settle asks to settle the message if nothing of it is pending after
	// this write; SettleMessage's own guard decides.
	Settle bool
	// FailureEvents writes a webhook's delivery.failed event for each
	// failure the write records (some webhook wants them: migration 0018).
	// A write of several messages writes them for all when one asks.
	FailureEvents bool
	// WithheldEvents writes a webhook's delivery.withheld event for each
	// delivery the write cancels or expires for its user's sake (migration
	// 0024), as FailureEvents does for failures.
	WithheldEvents bool
	// Executions names, by chunk, the execution whose results these are
	// for the chunks that keep their acceptances as runs (migration 0028):
	// a token, not zero, of the chunk's attempt that read its deliveries,
	// the same for that attempt wherever and whenever it writes. A chunk
	// not named writes a row a delivery.
	Executions map[int32]int64
}

// DeliveryKey names one delivery of a ledger write and what its row holds
// besides its result, written when the write is its first (a snapshot's
// device: migration 0022): its user and channel as the chunk read them,
// its chunk and when it was due (microseconds since the epoch, in the
// database's frame).
type DeliveryKey struct {
	MessageID, DeviceID int64
	UserID, Channel     string
	Chunk               int32
	DueUs               int64
	// First says the chunk read no row of the delivery (ChunkPendingRow's
	// Written is false): its result is inserted plainly (RecordResults).
	First bool
}

// Add appends one delivery's result.
func (p *RecordResultsParams) Add(d DeliveryKey, status, reason string, attemptedUs, acceptedUs int64) {
	p.add(d, status, reason, attemptedUs, acceptedUs, 0)
}

// AddThrottled appends the result of a delivery that stays pending because
// the provider throttled its device: it may not be sent again before
// notBeforeUs.
func (p *RecordResultsParams) AddThrottled(d DeliveryKey, reason string, attemptedUs, notBeforeUs int64) {
	p.add(d, "pending", reason, attemptedUs, 0, notBeforeUs)
}

func (p *RecordResultsParams) add(d DeliveryKey, status, reason string, attemptedUs, acceptedUs, notBeforeUs int64) {
	p.MessageIds = append(p.MessageIds, d.MessageID)
	p.DeviceIds = append(p.DeviceIds, d.DeviceID)
	p.UserIds = append(p.UserIds, d.UserID)
	p.Channels = append(p.Channels, d.Channel)
	p.Chunks = append(p.Chunks, d.Chunk)
	p.DueUs = append(p.DueUs, d.DueUs)
	p.Statuses = append(p.Statuses, status)
	p.Reasons = append(p.Reasons, reason)
	p.AttemptedUs = append(p.AttemptedUs, attemptedUs)
	p.AcceptedUs = append(p.AcceptedUs, acceptedUs)
	p.NotBeforeUs = append(p.NotBeforeUs, notBeforeUs)
	p.First = append(p.First, d.First)
}

// Len is how many results p holds.
func (p *RecordResultsParams) Len() int { return len(p.DeviceIds) }

// row appends src's row i.
func (p *RecordResultsParams) row(src *RecordResultsParams, i int) {
	p.add(DeliveryKey{src.MessageIds[i], src.DeviceIds[i], src.UserIds[i], src.Channels[i], src.Chunks[i], src.DueUs[i], src.First[i]},
		src.Statuses[i], src.Reasons[i], src.AttemptedUs[i], src.AcceptedUs[i], src.NotBeforeUs[i])
}

// once is p with each delivery once, its last result kept: an INSERT ... ON
// CONFLICT DO UPDATE must not meet a row twice. Two results of one
// delivery in one write are rare (a chunk retried in the process while its
// answers were still unwritten), so p is returned as it is when it has
// none.
func (p RecordResultsParams) once() RecordResultsParams {
	type key struct{ message, device int64 }
	last := make(map[key]int, len(p.DeviceIds))
	for i := range p.DeviceIds {
		last[key{p.MessageIds[i], p.DeviceIds[i]}] = i
	}
	if len(last) == len(p.DeviceIds) {
		return p
	}
	out := RecordResultsParams{WantFailed: p.WantFailed, WantWithheld: p.WantWithheld}
	for i := range p.DeviceIds {
		if last[key{p.MessageIds[i], p.DeviceIds[i]}] == i {
			out.row(&p, i)
		}
	}
	return out
}

// Append appends src's rows.
func (p *RecordResultsParams) Append(src RecordResultsParams) {
	p.MessageIds = append(p.MessageIds, src.MessageIds...)
	p.DeviceIds = append(p.DeviceIds, src.DeviceIds...)
	p.UserIds = append(p.UserIds, src.UserIds...)
	p.Channels = append(p.Channels, src.Channels...)
	p.Chunks = append(p.Chunks, src.Chunks...)
	p.DueUs = append(p.DueUs, src.DueUs...)
	p.Statuses = append(p.Statuses, src.Statuses...)
	p.Reasons = append(p.Reasons, src.Reasons...)
	p.AttemptedUs = append(p.AttemptedUs, src.AttemptedUs...)
	p.AcceptedUs = append(p.AcceptedUs, src.AcceptedUs...)
	p.NotBeforeUs = append(p.NotBeforeUs, src.NotBeforeUs...)
	p.First = append(p.First, src.First...)
}

// noneFirst is p with no result marked first: every row is written as one
// that may exist.
func (p RecordResultsParams) noneFirst() RecordResultsParams {
	p.First = make([]bool, len(p.First))
	return p
}

// ChunkWritten is what a ChunkWrite did.
type ChunkWritten struct {
	// Accepted, Failed and Expired count the message's deliveries this
	// write settled.
	Accepted, Failed, Expired int32
	// Settled is the message's new state when this write settled it, ""
	// otherwise.
	Settled string
	// When this write settled the message: its priority, and its maximum
	// skew as the SLO grades it (SettleMessage), nil when nothing was due.
	// This write is the only one that settles it, so its process is the one
	// that counts it in the metrics.
	Priority  string
	SLOSkewMs *float64
}

// WriteChunks runs the writes of several messages as one pipelined batch:
// every statement goes to the server in one round trip and runs in one
// implicit transaction, committed without waiting for the disk. A process's
// ledger writer commits the answers of all its running chunks at once.
//
// Every chunk of a message moves the message row's counters, so that row is
// the one lock all of a message's chunks share. Sent as separate statements,
// the transaction would hold it across client round trips (the chunk's
// timings, the commit), and on a busy machine chunks queued behind each
// other for seconds. Pipelined, the locks are held on the server only. The
// messages' rows are locked first, in the order of their ids, so that two
// processes' writes never wait for each other in a cycle. Then every
// message's deliveries are written in two statements (their cost per
// statement was paid once per message before, which made a write of twenty
// messages cost twenty): the results marked first, nearly all of them, by
// InsertFirstResults, counted here (splitFirst); then the others, which
// may meet a row, by RecordResults, which counts what it changed, adds the
// counts of the first ones and moves the messages' counters; a write
// with none of those moves them by the first ones' counts alone
// (CountResults, a plan a fraction of RecordResults'). Then the chunks'
// timings and the settle checks. Its statements run on their
// generic plans (UseLedgerPlans). out[i] is what ws[i] did.
func WriteChunks(ctx context.Context, pool Batcher, ws []ChunkWrite) ([]ChunkWritten, error) {
	order := make([]int, len(ws))
	ids := make([]int64, len(ws))
	var results RecordResultsParams
	for i, w := range ws {
		order[i], ids[i] = i, w.MessageID
		results.Append(w.Results)
		results.WantFailed = results.WantFailed || w.FailureEvents
		results.WantWithheld = results.WantWithheld || w.WithheldEvents
	}
	results = results.once()
	slices.SortFunc(order, func(i, j int) int { return cmp.Compare(ws[i].MessageID, ws[j].MessageID) })
	out := make([]ChunkWritten, len(ws))
	execution := executionsOf(ws)
	first, rest := results.splitFirst()
	runs, plain := first.runs(execution)
	build := func(b *pgx.Batch) {
		clear(out)
		b.Queue(commitWithoutWaitingForDisk)
		b.Queue(useLedgerPlans)
		b.Queue(lockMessages, ids)
		for _, i := range order {
			if e := ws[i].Evict; len(e.Ids) > 0 {
				b.Queue(evictDevices, e.SentAfter, e.Ids, e.Reasons, ws[i].MessageID)
			}
		}
		if len(runs.MessageIds) > 0 {
			b.Queue(insertAcceptedRuns, runs.DeviceIds, runs.UserIds, runs.AttemptedUs, runs.AcceptedUs, runs.MessageIds, runs.Chunks,
				runs.Executions, runs.GroupDueUs, runs.Los, runs.His)
		}
		if len(plain.DeviceIds) > 0 {
			b.Queue(insertFirstResults, plain.MessageIds, plain.DeviceIds, plain.UserIds, plain.Channels, plain.Chunks,
				plain.DueUs, plain.Statuses, plain.Reasons, plain.AttemptedUs, plain.AcceptedUs, plain.NotBeforeUs)
		}
		// Each message's counts as the write moved them.
		counted := func(rows pgx.Rows) error {
			for rows.Next() {
				var r RecordResultsRow
				if err := rows.Scan(&r.MessageID, &r.PendingCount, &r.Accepted, &r.Failed, &r.Expired); err != nil {
					return err
				}
				for i, w := range ws {
					if w.MessageID == r.MessageID {
						out[i].Accepted, out[i].Failed, out[i].Expired = r.Accepted, r.Failed, r.Expired
					}
				}
			}
			return rows.Err()
		}
		switch {
		case len(rest.DeviceIds) > 0:
			b.Queue(recordResults, rest.MessageIds, rest.DeviceIds, rest.UserIds, rest.Channels,
				rest.Chunks, rest.DueUs, rest.Statuses, rest.Reasons, rest.AttemptedUs,
				rest.AcceptedUs, rest.NotBeforeUs, rest.First, rest.WantFailed, rest.WantWithheld,
				rest.CountedMessageIds, rest.CountedStatuses, rest.CountedBuckets, rest.CountedWithheld, rest.CountedN).Query(counted)
		case len(rest.CountedN) > 0:
			b.Queue(countResults, rest.CountedMessageIds, rest.CountedStatuses, rest.CountedBuckets, rest.CountedWithheld,
				rest.CountedN).Query(counted)
		}
		for _, i := range order {
			for _, c := range ws[i].Chunks {
				b.Queue(recordChunk, c.StartedAt, c.FirstAcceptedAt, c.LastAcceptedAt, c.FinishedAt, c.Held, c.MessageID, c.Chunk)
			}
			if ws[i].Settle {
				b.Queue(settleMessage, ws[i].MessageID).QueryRow(func(row pgx.Row) error {
					if err := row.Scan(&out[i].Settled, &out[i].Priority, &out[i].SLOSkewMs); err != nil && !errors.Is(err, pgx.ErrNoRows) {
						return err
					}
					return nil
				})
			}
		}
	}
	err := inBatch(ctx, pool, build)
	if firstRowExists(err) {
		// A delivery the chunk read without a row has one now: the write
		// rolled back whole, and runs again as one whose rows may exist.
		first, rest = results.noneFirst().splitFirst()
		runs, plain = first.runs(execution)
		err = inBatch(ctx, pool, build)
	}
	if err != nil {
		if len(ws) == 1 {
			return nil, fmt.Errorf("write results of message %d: %w", ws[0].MessageID, err)
		}
		return nil, fmt.Errorf("write results of %d messages: %w", len(ws), err)
	}
	return out, nil
}

// splitFirst parts p into the results InsertFirstResults writes (marked
// first, and wanting no webhook event) and those RecordResults writes: the
// ones that may meet a row, and the failures and withheld deliveries a
// webhook wants events of, which RecordResults writes with their rows.
// rest carries the first ones' counts (countFirst) for RecordResults to add.
// When every result is a first one, as at an instant, first is p itself,
// as once returns it: the rows are not copied.
func (p RecordResultsParams) splitFirst() (first, rest RecordResultsParams) {
	rest = RecordResultsParams{WantFailed: p.WantFailed, WantWithheld: p.WantWithheld}
	if p.allFirst() {
		first = p
	} else {
		for i := range p.DeviceIds {
			if p.insertedFirst(i) {
				first.row(&p, i)
			} else {
				rest.row(&p, i)
			}
		}
	}
	rest.countFirst(first)
	return first, rest
}

// executionsOf is the execution of each (message, chunk) of ws that keeps
// its acceptances as runs, 0 for the others.
func executionsOf(ws []ChunkWrite) func(message int64, chunk int32) int64 {
	type key struct {
		message int64
		chunk   int32
	}
	var m map[key]int64
	for _, w := range ws {
		for c, e := range w.Executions {
			if m == nil {
				m = map[key]int64{}
			}
			m[key{w.MessageID, c}] = e
		}
	}
	return func(message int64, chunk int32) int64 { return m[key{message, chunk}] }
}

// runs parts first results, which InsertFirstResults would write a row
// each, into the acceptances of chunk executions that keep them as runs
// (migration 0028), a run a (message, chunk) with its devices ascending,
// and the others (plain), which still get their rows. runs also holds,
// with no devices, each (message, chunk) of such an execution whose first
// results here are rows only: InsertAcceptedRuns checks every group before
// it writes (a row beside another execution's run would be a delivery in
// two places). A run holds deliveries due at one time; only acceptances
// make runs.
func (p RecordResultsParams) runs(execution func(message int64, chunk int32) int64) (runs InsertAcceptedRunsParams, plain RecordResultsParams) {
	var accepted []int
	type key struct {
		message int64
		chunk   int32
	}
	rowsOf := map[key]int64{}
	for i := range p.DeviceIds {
		e := execution(p.MessageIds[i], p.Chunks[i])
		switch {
		case e != 0 && p.Statuses[i] == "accepted":
			accepted = append(accepted, i)
		case e != 0:
			rowsOf[key{p.MessageIds[i], p.Chunks[i]}] = e
		}
	}
	if len(accepted) == 0 && len(rowsOf) == 0 {
		return runs, p
	}
	isRun := make([]bool, len(p.DeviceIds))
	for _, i := range accepted {
		isRun[i] = true
	}
	plain = RecordResultsParams{WantFailed: p.WantFailed, WantWithheld: p.WantWithheld}
	for i := range p.DeviceIds {
		if !isRun[i] {
			plain.row(&p, i)
		}
	}
	slices.SortFunc(accepted, func(a, b int) int {
		return cmp.Or(cmp.Compare(p.MessageIds[a], p.MessageIds[b]), cmp.Compare(p.Chunks[a], p.Chunks[b]),
			cmp.Compare(p.DueUs[a], p.DueUs[b]), cmp.Compare(p.DeviceIds[a], p.DeviceIds[b]))
	})
	for n, i := range accepted {
		if j := n - 1; n == 0 || p.MessageIds[i] != p.MessageIds[accepted[j]] || p.Chunks[i] != p.Chunks[accepted[j]] || p.DueUs[i] != p.DueUs[accepted[j]] {
			if n > 0 {
				runs.His = append(runs.His, int32(n))
			}
			runs.MessageIds = append(runs.MessageIds, p.MessageIds[i])
			runs.Chunks = append(runs.Chunks, p.Chunks[i])
			runs.Executions = append(runs.Executions, execution(p.MessageIds[i], p.Chunks[i]))
			runs.GroupDueUs = append(runs.GroupDueUs, p.DueUs[i])
			runs.Los = append(runs.Los, int32(n+1))
			delete(rowsOf, key{p.MessageIds[i], p.Chunks[i]})
		}
		runs.DeviceIds = append(runs.DeviceIds, p.DeviceIds[i])
		runs.UserIds = append(runs.UserIds, p.UserIds[i])
		runs.AttemptedUs = append(runs.AttemptedUs, p.AttemptedUs[i])
		runs.AcceptedUs = append(runs.AcceptedUs, p.AcceptedUs[i])
	}
	if len(accepted) > 0 {
		runs.His = append(runs.His, int32(len(accepted)))
	}
	for k, e := range rowsOf {
		runs.MessageIds = append(runs.MessageIds, k.message)
		runs.Chunks = append(runs.Chunks, k.chunk)
		runs.Executions = append(runs.Executions, e)
		runs.GroupDueUs = append(runs.GroupDueUs, 0)
		runs.Los = append(runs.Los, 1)
		runs.His = append(runs.His, 0)
	}
	return runs, plain
}

// insertedFirst says result i goes to InsertFirstResults: marked first,
// and no webhook wants an event of it.
func (p *RecordResultsParams) insertedFirst(i int) bool {
	status := p.Statuses[i]
	event := (p.WantFailed && status == "failed") || (p.WantWithheld && withheld(status, p.Reasons[i]) != "")
	return p.First[i] && !event
}

// allFirst says every result goes to InsertFirstResults.
func (p *RecordResultsParams) allFirst() bool {
	for i := range p.DeviceIds {
		if !p.insertedFirst(i) {
			return false
		}
	}
	return true
}

// withheld is the reason a delivery of status and reason was withheld for
// its user's sake, as the message's counters count it (migration 0024),
// or "".
func withheld(status, reason string) string {
	if status != "cancelled" && status != "expired" {
		return ""
	}
	switch reason {
	case "opted_out", "quiet_hours", "capped":
		return reason
	}
	return ""
}

// countFirst counts the results InsertFirstResults writes as RecordResults
// counts the rows it writes (its tallies): by message and status, the
// withheld ones by reason, the accepted ones by the bucket of their skew
// (skewBucket). A pending result moves no count and is left out.
func (p *RecordResultsParams) countFirst(first RecordResultsParams) {
	type tally struct {
		message          int64
		status, withheld string
		bucket           int32
	}
	n := map[tally]int32{}
	var order []tally
	for i, id := range first.MessageIds {
		t := tally{message: id, status: first.Statuses[i], withheld: withheld(first.Statuses[i], first.Reasons[i])}
		if t.status == "pending" {
			continue
		}
		if t.status == "accepted" {
			t.bucket = skewBucket(first.AcceptedUs[i] - first.DueUs[i])
		}
		if n[t] == 0 {
			order = append(order, t)
		}
		n[t]++
	}
	for _, t := range order {
		p.CountedMessageIds = append(p.CountedMessageIds, t.message)
		p.CountedStatuses = append(p.CountedStatuses, t.status)
		p.CountedBuckets = append(p.CountedBuckets, t.bucket)
		p.CountedWithheld = append(p.CountedWithheld, t.withheld)
		p.CountedN = append(p.CountedN, n[t])
	}
}

// skewBucket is skew_histogram_bucket (migration 0019) of a skew of us
// microseconds, as RecordResults computes it: the skew in milliseconds as
// date_part('epoch', accepted_at - due_at) * 1000 gives it (the interval
// carries whole days apart from the rest), then bucket 1 under 1 ms and
// one more for every 10% above, up to 194. TestSkewBucketIsTheDatabases
// holds the two to the same answers.
func skewBucket(us int64) int32 {
	const day = 86_400_000_000
	days, rest := us/day, us%day
	ms := (float64(rest)/1_000_000.0 + 86_400*float64(days)) * 1000
	if !(ms >= 1) {
		return 1
	}
	return int32(min(2+math.Floor(math.Log(ms)/0.09531017980432487), 194))
}

// firstRowExists says err is RecordResults' plain insert of a result
// marked first meeting the delivery's row.
func firstRowExists(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "23505" &&
		(pgErr.ConstraintName == "deliveries_pkey" || pgErr.ConstraintName == "accepted_runs_once")
}

// Batcher runs a pipelined batch: a pool, or one of its connections held
// by a writer whose statements are then planned on that connection alone
// (jobs' ledger writer).
type Batcher interface {
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// Held is the connection a sequential writer (jobs' ledger writer, the
// API's receipt writer) sends its batches through while it runs, so that
// its statements are planned on that one alone, not on whichever connection
// of the pool each write found idle: taken at the first write, given back
// by Release, and after a write that failed, which may have broken it (the
// pool then closes it, and the next write takes another).
type Held struct {
	pool *pgxpool.Pool
	conn *pgxpool.Conn
}

// Hold returns a writer's Held connection of pool, not taken yet.
func Hold(pool *pgxpool.Pool) *Held { return &Held{pool: pool} }

// Write runs write through the held connection, taking it first if need
// be within ctx (an error doing so is interpreted as the statements' are:
// ErrUnavailable).
func (h *Held) Write(ctx context.Context, write func(Batcher) error) error {
	if h.conn == nil {
		conn, err := h.pool.Acquire(ctx)
		if err != nil {
			return interpretError(err)
		}
		h.conn = conn
	}
	err := write(h.conn)
	if err != nil {
		h.Release()
	}
	return err
}

// Release gives the connection back to the pool, if it is held.
func (h *Held) Release() {
	if h.conn != nil {
		h.conn.Release()
		h.conn = nil
	}
}

// inBatch sends the statements build queues as one pipelined batch: one
// round trip, one implicit transaction. Like InTx, it runs it again when
// PostgreSQL aborts it as a deadlock victim or a serialization failure;
// build is called for every run and must reset what its callbacks fill.
func inBatch(ctx context.Context, pool Batcher, build func(b *pgx.Batch)) error {
	return retryConflicts(func() error {
		b := &pgx.Batch{}
		build(b)
		return pool.SendBatch(ctx, b).Close()
	})
}

// ChunkStart is what a chunk needs before it sends.
type ChunkStart struct {
	// State is the message's state once this chunk has tried to start it:
	// dispatching when the chunk may send.
	State string
	// Pending are the chunk's devices whose deliveries are still pending.
	Pending []ChunkPendingRow
	// Payload is the message's content, when it was asked for.
	Payload []byte
	// Rules are what the chunk's deliveries are decided by: its message's
	// category and quiet-hours mode, the installation's quiet hours
	// (migration 0024).
	Rules ChunkRulesRow
}

// Chunk names what a chunk reads of the ledger: a range of its message's
// pending rows (a chunk scheduled with rows), or its snapshot (migration
// 0022: ChunkSnapshotPending), which needs only the message and the chunk.
type Chunk struct {
	ChunkPendingParams
	Snapshot bool
	// Devices is how many devices the chunk's snapshot holds, 0 when not
	// known (a job of an earlier release).
	Devices int32
}

// dense says c's snapshot holds at least a third of the device ids in its
// range: ChunkSnapshotPending reads them in one walk of the key over the
// range rather than one lookup a device, which costs half as much.
func (c Chunk) dense() bool {
	return c.Devices > 0 && c.LastDevice-c.FirstDevice < 3*int64(c.Devices)
}

// BeginChunk starts a chunk in one round trip, pipelined like WriteChunks:
// it marks the message dispatching if it is still scheduled (only the
// first chunk changes the row), reads the state that resulted, what the
// chunk's deliveries are decided by (ChunkRules), the chunk's
// pending deliveries with their devices' tokens (ChunkPending or
// ChunkSnapshotPending, on the generic plan: UseLedgerPlans) and, when
// payloadID is not zero, the payload. Before, these were four round trips
// at the instant every chunk of a message starts, when the database is
// busiest.
func BeginChunk(ctx context.Context, pool *pgxpool.Pool, c Chunk, payloadID int64) (ChunkStart, error) {
	var out ChunkStart
	err := inBatch(ctx, pool, func(b *pgx.Batch) {
		out = ChunkStart{}
		b.Queue(useLedgerPlans)
		b.Queue(startMessage, c.MessageID)
		b.Queue(messageState, c.MessageID).QueryRow(func(row pgx.Row) error { return row.Scan(&out.State) })
		b.Queue(chunkRules, c.MessageID).QueryRow(func(row pgx.Row) error {
			r := &out.Rules
			return row.Scan(&r.Category, &r.QuietHours, &r.Critical, &r.CapCount, &r.CapPeriodS, &r.QuietStart, &r.QuietEnd, &r.DefaultTimezone)
		})
		queueChunkRead(b, c, payloadID, &out)
	})
	if err != nil {
		return ChunkStart{}, fmt.Errorf("begin chunk %d of message %d: %w", c.Chunk, c.MessageID, err)
	}
	return out, nil
}

// ChunkPendingOf reads a chunk's pending deliveries as BeginChunk does, on
// q's connection or transaction.
func (q *Queries) ChunkPendingOf(ctx context.Context, c Chunk) ([]ChunkPendingRow, error) {
	query, args := chunkRead(c)
	rows, err := q.db.Query(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	return scanChunkPending(rows)
}

// chunkRead is the statement that reads c's pending deliveries.
func chunkRead(c Chunk) (string, []any) {
	if c.Snapshot {
		return chunkSnapshotPending, []any{c.MessageID, c.dense(), c.FirstDevice, c.LastDevice, c.Chunk}
	}
	return chunkPending, []any{c.MessageID, c.FirstDevice, c.LastDevice, c.Chunk}
}

// scanChunkPending reads ChunkPending's rows, or ChunkSnapshotPending's,
// which have the same columns.
func scanChunkPending(rows pgx.Rows) ([]ChunkPendingRow, error) {
	defer rows.Close()
	var out []ChunkPendingRow
	for rows.Next() {
		var r ChunkPendingRow
		if err := rows.Scan(&r.DeviceID, &r.Attempt, &r.Channel, &r.Locale, &r.Token, &r.P256dh, &r.Auth, &r.Environment, &r.Gone, &r.NotBefore, &r.AppID, &r.CredentialID, &r.UserID,
			&r.OptedOut, &r.QuietStart, &r.QuietEnd, &r.Timezone, &r.HeldDue, &r.Written); err != nil {
			return nil, err
		}
		if r.HeldDue.Unix() == 0 {
			// The epoch: not held by quiet hours.
			r.HeldDue = time.Time{}
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

// queueChunkRead queues a chunk's read into out: its pending deliveries
// with their devices and, when payloadID is not zero, the payload.
// BeginChunk reads a chunk with it, and WarmChunk reads one the same way
// ahead of its instant.
func queueChunkRead(b *pgx.Batch, c Chunk, payloadID int64, out *ChunkStart) {
	query, args := chunkRead(c)
	b.Queue(query, args...).Query(func(rows pgx.Rows) error {
		pending, err := scanChunkPending(rows)
		out.Pending = pending
		return err
	})
	if payloadID != 0 {
		b.Queue(getPayload, payloadID).QueryRow(func(row pgx.Row) error { return row.Scan(&out.Payload) })
	}
}
