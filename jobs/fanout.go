package jobs

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"

	"github.com/heraldpush/herald/db"
	"github.com/heraldpush/herald/jobs/push"
)

// FanOutKind is the River kind of a chunk job.
const FanOutKind = "fan_out"

// FanOutArgs is one chunk of a message: everything its worker needs to send,
// resolved when the message was scheduled, so that the dispatch second does
// no lookups. The payload travels by reference; it is the same for every
// chunk.
type FanOutArgs struct {
	MessageID  int64     `json:"message_id" river:"unique"`
	Chunk      int       `json:"chunk" river:"unique"`
	PayloadID  int64     `json:"payload_id"`
	Priority   string    `json:"priority"`
	DispatchAt time.Time `json:"dispatch_at"`
	ExpiresAt  time.Time `json:"expires_at"`
	Targets    Targets   `json:"targets"`
}

// Target is one device of a chunk: what its provider needs to send to it,
// which provider that is, and which of the message's localizations it gets
// ("" for the message's own text), picked by its user's locale when the
// message was scheduled.
type Target struct {
	push.Target
	Channel string
	Locale  string
}

// Targets are a chunk's devices. In the job's args they are packed into one
// string, a line per device with tab-separated fields, rather than an array
// of objects: River indexes args with a GIN index, which would otherwise take
// an entry for every field of every device (125,000 for a 25,000-device
// message) and cost more than the rest of scheduling together. A string
// longer than 125 bytes is one hashed entry. Tokens, endpoints and keys never
// hold tabs or line breaks (the API rejects them).
//
// The second field is the channel's letter ('s' for an APNs sandbox
// token), followed by the device's localization key, if any ("fpt-BR"):
// locale tags are letters, digits and hyphens.
type Targets []Target

// channelCodes packs a channel into one letter.
var channelCodes = map[string]byte{ChannelAPNs: 'a', ChannelFCM: 'f', ChannelWebPush: 'w'}

// sandboxCode is the letter of an APNs target with a sandbox token.
const sandboxCode = 's'

func channelOfCode(c byte) (channel string, sandbox, ok bool) {
	switch c {
	case 'a':
		return ChannelAPNs, false, true
	case sandboxCode:
		return ChannelAPNs, true, true
	case 'f':
		return ChannelFCM, false, true
	case 'w':
		return ChannelWebPush, false, true
	}
	return "", false, false
}

// MarshalJSON packs the targets into one JSON string.
func (ts Targets) MarshalJSON() ([]byte, error) {
	var b strings.Builder
	for _, t := range ts {
		code, ok := channelCodes[t.Channel]
		if !ok {
			return nil, fmt.Errorf("target %d: unknown channel %q", t.DeviceID, t.Channel)
		}
		if strings.ContainsAny(t.Token+t.P256dh+t.Auth+t.Locale, "\t\n") {
			return nil, fmt.Errorf("target %d: a field holds a tab or line break", t.DeviceID)
		}
		if t.Sandbox {
			if t.Channel != ChannelAPNs {
				return nil, fmt.Errorf("target %d: only an APNs token can be a sandbox one", t.DeviceID)
			}
			code = sandboxCode
		}
		b.WriteString(strconv.FormatInt(t.DeviceID, 10))
		b.WriteByte('\t')
		b.WriteByte(code)
		b.WriteString(t.Locale)
		b.WriteByte('\t')
		b.WriteString(t.Token)
		if t.P256dh != "" || t.Auth != "" {
			b.WriteByte('\t')
			b.WriteString(t.P256dh)
			b.WriteByte('\t')
			b.WriteString(t.Auth)
		}
		b.WriteByte('\n')
	}
	return json.Marshal(b.String())
}

// UnmarshalJSON unpacks targets packed by MarshalJSON.
func (ts *Targets) UnmarshalJSON(data []byte) error {
	var packed string
	if err := json.Unmarshal(data, &packed); err != nil {
		return fmt.Errorf("targets: %w", err)
	}
	out := make(Targets, 0, strings.Count(packed, "\n"))
	for line := range strings.Lines(packed) {
		fields := strings.Split(strings.TrimSuffix(line, "\n"), "\t")
		if len(fields) != 3 && len(fields) != 5 {
			return fmt.Errorf("targets: malformed line %q", line)
		}
		id, err := strconv.ParseInt(fields[0], 10, 64)
		if err != nil || fields[1] == "" {
			return fmt.Errorf("targets: malformed line %q", line)
		}
		channel, sandbox, ok := channelOfCode(fields[1][0])
		if !ok {
			return fmt.Errorf("targets: malformed line %q", line)
		}
		t := Target{Target: push.Target{DeviceID: id, Token: fields[2], Sandbox: sandbox}, Channel: channel, Locale: fields[1][1:]}
		if len(fields) == 5 {
			t.P256dh, t.Auth = fields[3], fields[4]
		}
		out = append(out, t)
	}
	*ts = out
	return nil
}

// Kind implements river.JobArgs.
func (FanOutArgs) Kind() string { return FanOutKind }

// InsertOpts puts the chunk on its priority's lane and makes (message,
// chunk) unique, so a chunk is never enqueued twice.
func (a FanOutArgs) InsertOpts() river.InsertOpts {
	return river.InsertOpts{
		Queue:      laneQueue(a.Priority),
		UniqueOpts: river.UniqueOpts{ByArgs: true},
	}
}

// Sender sends one message to many devices of one channel: a provider. It
// fills results[i] for targets[i], asking allow before each request; a send
// that allow refuses is left unattempted (zero Result.At) and parked. It
// calls answered (unless nil) with i once results[i] holds a request's
// answer, as answers come, and does not call it for targets it refused
// without a request. It bounds its own requests in flight.
type Sender interface {
	Send(ctx context.Context, m *push.Message, targets []push.Target, results []push.Result, allow func() bool, answered func(i int))
}

// FanOutConfig holds what the chunk worker needs.
type FanOutConfig struct {
	// Pool is the process's connections, used by every lane without a Pool
	// of its own.
	Pool *pgxpool.Pool
	// Lanes are the lanes this worker serves, each with its provider
	// clients and maybe connections of its own (Lane).
	Lanes  []Lane
	Logger *slog.Logger
	Clock  *Clock
	// Breakers are shared by the lanes (a provider's health is the same
	// whichever lane sends). Nil: closed breakers for every channel that
	// has a provider, with the default settings.
	Breakers *Breakers
	// Timeout bounds one attempt of a chunk; zero takes DefaultChunkTimeout.
	Timeout time.Duration
	// Metrics, when set, counts deliveries, skew and provider latency.
	Metrics *Metrics
}

// FanOutWorker turns a chunk into pushes: it checks expiry, marks the
// message dispatching (unless a cancel won), skips devices already settled
// by an earlier attempt, sends to every provider at once, and hands the
// answers as they come back to its process's ledger writer (ledger.go).
type FanOutWorker struct {
	river.WorkerDefaults[FanOutArgs]
	cfg      FanOutConfig
	lanes    map[string]Lane
	messages *messageCache

	ledgersMu sync.Mutex
	// ledgers are the ledger writers, one per lane's pool, made on first
	// use.
	ledgers map[*pgxpool.Pool]*ledger
}

// NewFanOutWorker returns the chunk worker.
func NewFanOutWorker(cfg FanOutConfig) *FanOutWorker {
	cfg.Timeout = cmp.Or(cfg.Timeout, DefaultChunkTimeout)
	w := &FanOutWorker{cfg: cfg, lanes: map[string]Lane{}, messages: newMessageCache(64)}
	for _, l := range cfg.Lanes {
		if l.Pool == nil {
			l.Pool = cfg.Pool
		}
		w.lanes[l.Queue] = l
	}
	if w.cfg.Breakers == nil {
		var channels []string
		for _, ch := range Channels {
			if slices.ContainsFunc(cfg.Lanes, func(l Lane) bool { return l.Providers[ch] != nil }) {
				channels = append(channels, ch)
			}
		}
		w.cfg.Breakers = NewBreakers(BreakerConfig{}, channels...)
	}
	return w
}

// lane is the lane of a chunk. River gives a worker only the chunks of the
// queues it serves; a lane it does not know has no providers, so its
// deliveries would fail with channel_disabled, never silently.
func (w *FanOutWorker) lane(a FanOutArgs) Lane {
	q := laneQueue(a.Priority)
	if l, ok := w.lanes[q]; ok {
		return l
	}
	return Lane{Queue: q, Pool: w.cfg.Pool}
}

// sendBudget is how long a chunk attempt may spend sending: its timeout less
// a reserve for recording the results (a quarter of the timeout, at most 5 s).
func (w *FanOutWorker) sendBudget() time.Duration {
	return w.cfg.Timeout - min(w.cfg.Timeout/4, 5*time.Second)
}

// Timeout bounds one attempt. River's rescuer must not retry a chunk whose
// worker may still be sending, so the client's RescueStuckJobsAfter is set
// above it (see NewRiverClient).
func (w *FanOutWorker) Timeout(*river.Job[FanOutArgs]) time.Duration { return w.cfg.Timeout }

// Work sends one chunk: it begins the chunk (one round trip), groups its
// pending targets by the breaker they answer to, sends every group at once
// in slices, hands each answer as it comes to the ledger writer, and waits
// for the writer to have written them all and closed the chunk.
func (w *FanOutWorker) Work(ctx context.Context, job *river.Job[FanOutArgs]) error {
	a := job.Args
	defer w.cfg.Metrics.chunkStarted(a.Priority)()
	startedAt := w.cfg.Clock.Now()
	if !startedAt.Before(a.ExpiresAt) {
		// Past its lifetime nothing is sent: what is pending expires.
		return w.expire(ctx, a, startedAt)
	}
	ledger := w.ledger(a)
	if err := ledger.drain(ctx, a); err != nil {
		return err
	}
	pending, msg, err := w.begin(ctx, job)
	if err != nil || pending == nil {
		return err
	}
	if len(pending) == 0 {
		return w.finish(ctx, a, ledger, ledger.open(a, startedAt, nil))
	}
	groups := w.group(a, pending)
	// Sending stops early enough to leave time to record what was sent: a
	// chunk that ran out of time still writes its results, so its retry
	// sends only what was not answered.
	sendCtx, cancel := context.WithTimeout(ctx, w.sendBudget())
	defer cancel()
	rec := ledger.open(a, startedAt, make([]push.Result, len(a.Targets)))
	w.send(sendCtx, a, msg, groups, ledger, rec).wait()
	return w.finish(ctx, a, ledger, rec)
}

// begin starts the chunk in one round trip: the first chunk turns the
// message from scheduled to dispatching, unless a cancel won; every chunk
// reads the state that resulted, its still-pending devices and, unless the
// message is cached, its payload. pending is nil when the message is no
// longer sendable; msg, the encoded pushes, is only built when something is
// pending.
func (w *FanOutWorker) begin(ctx context.Context, job *river.Job[FanOutArgs]) (pending map[int64]bool, msg *encodedMessage, err error) {
	a := job.Args
	msg, cached := w.messages.lookup(a)
	payloadID := a.PayloadID
	if cached {
		payloadID = 0
	}
	begun, err := db.BeginChunk(ctx, w.lane(a).Pool, a.MessageID, a.deviceIDs(), payloadID)
	if err != nil {
		return nil, nil, err
	}
	if begun.State != StateDispatching {
		w.cfg.Logger.InfoContext(ctx, "chunk skipped: its message is no longer sendable",
			"message_id", push.FormatMessageID(a.MessageID), "chunk", a.Chunk, "attempt", job.Attempt, "state", begun.State)
		return nil, nil, nil
	}
	pending = make(map[int64]bool, len(begun.Pending))
	if len(begun.Pending) == 0 {
		return pending, nil, nil
	}
	for _, r := range begun.Pending {
		pending[r.DeviceID] = true
	}
	if !cached {
		if msg, err = w.messages.build(a, begun.Payload); err != nil {
			return nil, nil, err
		}
	}
	return pending, msg, nil
}

// sendGroup is what a group of a chunk's targets answers to: a channel's
// breaker, or a Web Push service host's; and the localization they are sent.
type sendGroup struct {
	channel string
	breaker *Breaker
	locale  string
}

// group sorts the chunk's pending targets (their indexes in a.Targets) by the
// breaker they answer to, so that a failing provider or push service parks
// only its own targets.
func (w *FanOutWorker) group(a FanOutArgs, pending map[int64]bool) map[sendGroup][]int {
	groups := map[sendGroup][]int{}
	for i, t := range a.Targets {
		if pending[t.DeviceID] {
			g := sendGroup{t.Channel, w.cfg.Breakers.ForTarget(t), t.Locale}
			groups[g] = append(groups[g], i)
		}
	}
	return groups
}

// sends are a chunk's sends in flight. rec.results[i] is the outcome of
// a.Targets[i], written by the one goroutine that sends it before it hands
// i to the ledger writer.
type sends struct {
	ledger *ledger
	rec    *chunkRecord
	// done is buffered for every slice, so that no sender is ever left
	// blocked.
	done     chan struct{}
	inFlight int
}

// wait returns when every slice is back.
func (s *sends) wait() {
	for ; s.inFlight > 0; s.inFlight-- {
		<-s.done
	}
}

// send sends to every group at once; each provider bounds its own
// concurrency. A channel's targets go to its provider in slices, all at
// once. A provider serves concurrent calls in the order they came
// (push.Limiter), so slices finish one after another rather than all at the
// end.
func (w *FanOutWorker) send(ctx context.Context, a FanOutArgs, msg *encodedMessage, groups map[sendGroup][]int, ledger *ledger, rec *chunkRecord) *sends {
	s := &sends{ledger: ledger, rec: rec, done: make(chan struct{}, len(a.Targets)+len(groups))}
	providers := w.lane(a).Providers
	for g, idx := range groups {
		provider, ok := providers[g.channel]
		if !ok {
			s.disabled(g.channel, idx)
			continue
		}
		for start := 0; start < len(idx); start += sendSlice {
			slice := idx[start:min(start+sendSlice, len(idx))]
			s.inFlight++
			go w.sendTargets(ctx, a, msg.localized(g.locale), provider, g, slice, s)
		}
	}
	return s
}

// disabled fails the targets at idx of a channel without a provider.
func (s *sends) disabled(channel string, idx []int) {
	now := time.Now()
	for _, i := range idx {
		s.rec.results[i] = push.Result{At: now, Reason: push.ReasonChannelDisabled, Detail: channel + " is not configured"}
	}
	s.ledger.add(s.rec, false, idx...)
}

// sendTargets sends the targets at slice through provider and hands each
// answer over as it comes: to the group's breaker and to the ledger
// writer. What the provider settled without an answer (refused locally,
// parked, not sent) is handed over when the slice is back.
func (w *FanOutWorker) sendTargets(ctx context.Context, a FanOutArgs, msg *push.Message, provider Sender, g sendGroup, slice []int, s *sends) {
	targets := make([]push.Target, len(slice))
	for j, i := range slice {
		targets[j] = a.Targets[i].Target
	}
	out := make([]push.Result, len(slice))
	// answered[j] is written by the goroutine that got target j's answer
	// and read here once Send has returned, which waits for them all.
	answered := make([]bool, len(slice))
	hand := func(j int) {
		r := out[j]
		w.cfg.Metrics.requested(g.channel, r)
		switch {
		case r.At.IsZero():
		case r.Reason.Transient() && errors.Is(ctx.Err(), context.Canceled):
			// The chunk was stopped (a shutdown): the request was cut
			// short here, not failed by the provider.
		case r.Reason.Transient():
			g.breaker.Failure(r.Detail)
		default:
			g.breaker.Success()
		}
		s.rec.results[slice[j]] = r
	}
	// Each request takes a place in the ledger writer first, held until
	// its answer is written (MaxUnwritten), then asks the breaker.
	var reserved, made atomic.Int64
	allow := func() bool {
		if !s.ledger.reserve(ctx) {
			return false
		}
		if !g.breaker.Allow() {
			s.ledger.release(1)
			return false
		}
		reserved.Add(1)
		return true
	}
	provider.Send(ctx, msg, targets, out, allow, func(j int) {
		hand(j)
		answered[j] = true
		made.Add(1)
		s.ledger.add(s.rec, true, slice[j])
	})
	// Places taken for requests that were never made (the attempt ended
	// while they waited for a slot) are given back.
	s.ledger.release(int(reserved.Load() - made.Load()))
	var rest []int
	for j, i := range slice {
		if !answered[j] {
			hand(j)
			rest = append(rest, i)
		}
	}
	s.ledger.add(s.rec, false, rest...)
	s.done <- struct{}{}
}

// sendSlice is how many of a chunk's devices on one channel go to the
// provider in one call: a whole chunk's. Answers are handed to the ledger
// writer one by one as they come, so a slice's size does not delay their
// recording.
const sendSlice = 500

// finish closes the chunk once its answers are written: the ledger writer
// writes its timings and settles the message when nothing of it is pending
// any more. The chunk snoozes when some of its deliveries were parked.
func (w *FanOutWorker) finish(ctx context.Context, a FanOutArgs, ledger *ledger, rec *chunkRecord) error {
	parked, detail, wait := w.parked(a, rec.results)
	if err := ledger.close(ctx, rec, len(parked) > 0); err != nil {
		return err
	}
	if len(parked) == 0 {
		return nil
	}
	w.cfg.Logger.WarnContext(ctx, "chunk parked: a provider is failing, its deliveries wait for it",
		"message_id", push.FormatMessageID(a.MessageID), "chunk", a.Chunk, "parked", parked, "error", detail, "retry_in", wait)
	return river.JobSnooze(wait)
}

// parked counts the chunk's deliveries that wait for a breaker, by channel,
// with the error that held them back and how long the chunk should sleep:
// until the first parked provider (or push service) lets a send through
// again, but never past the chunk's expiry, when what is still pending
// expires.
func (w *FanOutWorker) parked(a FanOutArgs, results []push.Result) (parked map[string]int, detail string, wait time.Duration) {
	parked = map[string]int{}
	wait = -1
	for i, r := range results {
		// Refused by the breaker (no time), or attempted and transient: both
		// stay pending and wait for the breaker.
		if (r.At.IsZero() && r.Reason != push.ReasonNone) || (!r.At.IsZero() && r.Reason.Transient()) {
			t := a.Targets[i]
			parked[t.Channel]++
			if detail == "" || !r.At.IsZero() {
				detail = r.Detail
			}
			if d := w.cfg.Breakers.ForTarget(t).RetryIn(); wait < 0 || d < wait {
				wait = d
			}
		}
	}
	if len(parked) == 0 {
		return nil, "", 0
	}
	wait = max(wait, 100*time.Millisecond)
	if untilExpiry := a.ExpiresAt.Sub(w.cfg.Clock.Now()); untilExpiry < wait {
		wait = max(untilExpiry, 0)
	}
	return parked, detail, wait
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
func (w *FanOutWorker) resultsOf(a FanOutArgs, results []push.Result, idx []int) chunkResults {
	c := chunkResults{results: db.RecordResultsParams{MessageID: a.MessageID}}
	p := &c.results
	for _, i := range idx {
		r := results[i]
		if r.At.IsZero() {
			// Not attempted (parked by the breaker, or not sent in time):
			// nothing to write; it stays pending.
			continue
		}
		at := w.cfg.Clock.ToDB(r.At)
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
			// Attempted, not settled: it waits for the breaker and is
			// retried when the chunk wakes, until it expires.
			status = "pending"
		}
		p.DeviceIds = append(p.DeviceIds, a.Targets[i].DeviceID)
		p.Statuses = append(p.Statuses, status)
		p.Reasons = append(p.Reasons, string(r.Reason))
		p.AttemptedUs = append(p.AttemptedUs, at.UnixMicro())
		p.AcceptedUs = append(p.AcceptedUs, acceptedUs)
		c.counted = append(c.counted, settledDelivery{a.Targets[i].Channel, status, r.Reason, at.Sub(a.DispatchAt)})
		if !r.Accepted && r.Reason.Evicts() {
			c.evictIDs = append(c.evictIDs, a.Targets[i].DeviceID)
			c.evictReasons = append(c.evictReasons, string(r.Reason))
		}
	}
	return c
}

// expire marks what is still pending in the chunk expired and settles the
// message if that was the last of it.
func (w *FanOutWorker) expire(ctx context.Context, a FanOutArgs, at time.Time) error {
	ids := a.deviceIDs()
	var counted []settledDelivery
	err := db.InTx(ctx, w.lane(a).Pool, func(tx pgx.Tx) error {
		q := db.On(tx)
		if _, err := q.LockMessage(ctx, a.MessageID); err != nil {
			return fmt.Errorf("lock message: %w", err)
		}
		if err := q.UseGenericPlans(ctx); err != nil {
			return fmt.Errorf("use generic plans: %w", err)
		}
		rows, err := q.ChunkPending(ctx, db.ChunkPendingParams{MessageID: a.MessageID, DeviceIds: ids})
		if err != nil {
			return fmt.Errorf("read chunk ledger: %w", err)
		}
		p, expired := a.expired(rows)
		counted = expired
		res, err := q.RecordResults(ctx, p)
		if err != nil {
			return fmt.Errorf("expire deliveries: %w", err)
		}
		// Its timings, and the settle check of db.WriteChunks; done here in
		// a transaction of its own because the message row is locked first.
		if err := q.RecordChunk(ctx, db.RecordChunkParams{MessageID: a.MessageID, Chunk: int32(a.Chunk), StartedAt: &at, FinishedAt: &at}); err != nil {
			return fmt.Errorf("record chunk: %w", err)
		}
		if res.PendingCount > 0 {
			return nil
		}
		if _, err := q.SettleMessage(ctx, a.MessageID); err != nil && !errors.Is(err, db.ErrNotFound) {
			return fmt.Errorf("settle message: %w", err)
		}
		return nil
	})
	if err == nil {
		w.cfg.Metrics.count(a.Priority, counted)
	}
	return err
}

// expired is the ledger write that expires the chunk's pending deliveries,
// and what the metrics count once it has committed.
func (a FanOutArgs) expired(pending []db.ChunkPendingRow) (db.RecordResultsParams, []settledDelivery) {
	p := db.RecordResultsParams{MessageID: a.MessageID}
	channels := make(map[int64]string, len(a.Targets))
	for _, t := range a.Targets {
		channels[t.DeviceID] = t.Channel
	}
	counted := make([]settledDelivery, 0, len(pending))
	for _, r := range pending {
		counted = append(counted, settledDelivery{channel: channels[r.DeviceID], status: "expired"})
		p.DeviceIds = append(p.DeviceIds, r.DeviceID)
		p.Statuses = append(p.Statuses, "expired")
		p.Reasons = append(p.Reasons, "")
		p.AttemptedUs = append(p.AttemptedUs, 0)
		p.AcceptedUs = append(p.AcceptedUs, 0)
	}
	return p, counted
}

// deviceIDs lists the chunk's devices.
func (a FanOutArgs) deviceIDs() []int64 {
	ids := make([]int64, len(a.Targets))
	for i, t := range a.Targets {
		ids[i] = t.DeviceID
	}
	return ids
}

// Breakers returns the worker's circuit breakers.
func (w *FanOutWorker) Breakers() *Breakers { return w.cfg.Breakers }
