package jobs

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"

	"github.com/heraldpush/herald/db"
	"github.com/heraldpush/herald/jobs/apps"
	"github.com/heraldpush/herald/jobs/push"
	"github.com/heraldpush/herald/jobs/receipt"
)

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
	// Webhooks, when set, says whether some webhook wants the ledger's
	// failures as events (WebhookTypes); nil: none does.
	Webhooks *WebhookTypes
	// Lease, when set, is asked before every provider request: this
	// process may no longer claim its chunks when it is not held (it lost
	// its liveness lock, and Takeover may give them to another worker), or
	// when it is held by another session than when the chunk began (the
	// lock was lost and taken again: another worker may have taken the
	// chunk meanwhile). Then the request is not made, the delivery stays
	// pending for whoever sends it, and the attempt ends as fenced.
	Lease Lease
	// Receipts, when set, signs the receipt token every push carries
	// (push.ReceiptKey), which the app sends back from the device; nil
	// sends pushes without one (HERALD_RECEIPTS=off).
	Receipts *receipt.Signer
	// ReceiptWindow is how long after its message's expiry a receipt
	// token stays good, so that an opened receipt can come days after
	// the push; zero takes DefaultReceiptWindow.
	ReceiptWindow time.Duration
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
	// begins are the pools' gates for beginning chunks (beginGate).
	begins map[*pgxpool.Pool]*beginGate
	// urgent lets the process's urgent chunks go ahead of its bulk work.
	urgent urgentFirst
	// warmed are the provider connections the instants' warm-ups opened
	// lately (warm_providers.go).
	warmed connWarmups
}

// NewFanOutWorker returns the chunk worker.
func NewFanOutWorker(cfg FanOutConfig) *FanOutWorker {
	cfg.Timeout = cmp.Or(cfg.Timeout, DefaultChunkTimeout)
	cfg.ReceiptWindow = cmp.Or(cfg.ReceiptWindow, DefaultReceiptWindow)
	w := &FanOutWorker{cfg: cfg, lanes: map[string]Lane{}, messages: newMessageCache(64), begins: map[*pgxpool.Pool]*beginGate{}}
	for _, l := range cfg.Lanes {
		if l.Pool == nil {
			l.Pool = cfg.Pool
		}
		w.lanes[l.Queue] = l
		if l.Pool != nil && w.begins[l.Pool] == nil {
			w.begins[l.Pool] = newBeginGate(int(l.Pool.Config().MaxConns/4), firstsWait)
		}
	}
	if w.cfg.Breakers == nil {
		var channels []string
		for _, ch := range Channels {
			if slices.ContainsFunc(cfg.Lanes, func(l Lane) bool { return l.Providers[ch] != nil || l.Apps != nil }) {
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

// ledger returns the ledger writer of a lane's pool, made on first use.
func (w *FanOutWorker) ledger(pool *pgxpool.Pool) *ledger {
	w.ledgersMu.Lock()
	defer w.ledgersMu.Unlock()
	if w.ledgers == nil {
		w.ledgers = map[*pgxpool.Pool]*ledger{}
	}
	l := w.ledgers[pool]
	if l == nil {
		l = newLedger(pool, w.cfg.Logger, w.cfg.Clock, w.cfg.Metrics, w.cfg.Timeout)
		l.webhooks = w.cfg.Webhooks
		w.ledgers[pool] = l
	}
	return l
}

// Due is told by the Waker that chunks of queue fall due now: at the urgent
// lane's instants, the process's bulk work is held back from now until an
// urgent chunk starts (urgentFirst.expect), when the process serves that
// lane.
func (w *FanOutWorker) Due(queue string) {
	if _, ok := w.lanes[queue]; ok && queue == QueueUrgent {
		w.urgent.expect()
	}
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
	// The chunk's lane is looked up once: its connections, its ledger
	// writer and its providers serve the whole attempt.
	lane := w.lane(a)
	// An urgent chunk holds the process's bulk work back until its sends
	// are answered (urgentFirst); a message's first chunk, small and the
	// message's own instant, goes on beside it.
	release := func() {}
	if lane.Queue == QueueUrgent {
		release = w.urgent.hold()
		defer release()
	} else if a.Chunk != 0 {
		w.urgent.wait(ctx)
	}
	startedAt := w.cfg.Clock.Now()
	if !startedAt.Before(a.ExpiresAt) {
		// Past its lifetime nothing is sent: what is pending expires.
		return w.expire(ctx, a, lane.Pool, startedAt)
	}
	ledger := w.ledger(lane.Pool)
	if err := ledger.drain(ctx, a); err != nil {
		return err
	}
	c, msg, err := w.begin(ctx, job, lane.Pool, startedAt)
	if err != nil || c == nil {
		return err
	}
	if len(c.Targets) == 0 {
		return w.finish(ctx, c, ledger, ledger.open(c, startedAt, nil), false)
	}
	groups := w.group(c, startedAt)
	// What is tried is what is grouped: a device gone is cancelled, and
	// one waiting for its throttle skipped, neither tried.
	tried := map[string]int{}
	for g, idx := range groups {
		tried[g.channel] += len(idx)
	}
	w.cfg.Metrics.tried(tried)
	// Sending stops early enough to leave time to record what was sent: a
	// chunk that ran out of time still writes its results, so its retry
	// sends only what was not answered.
	sendCtx, cancel := context.WithTimeout(ctx, w.sendBudget())
	defer cancel()
	rec := ledger.open(c, startedAt, make([]push.Result, len(c.Targets)))
	s := w.send(sendCtx, c, msg, groups, lane, ledger, rec)
	s.wait()
	release()
	err = w.finish(ctx, c, ledger, rec, s.fenced.Load())
	if s.fenced.Load() {
		return w.afterFence(ctx, job, lane.Pool, err)
	}
	return err
}

// afterFence ends an attempt that stopped sending because this process
// lost its liveness lock. Another worker may have taken the chunk over
// meanwhile (Takeover) and be running it: then whatever this attempt
// returned, River would write over that attempt's state, and a snooze
// would let a third attempt run beside it. So once the lock is back, an
// attempt whose chunk is no longer its own returns nil: River marks the
// job completed, which starts no other attempt, and the worker that has it
// sends what is pending. (Should that attempt then park a delivery behind
// a breaker, the reconciler expires it at its expiry: at most once wins
// over at least once.)
func (w *FanOutWorker) afterFence(ctx context.Context, job *river.Job[FanOutArgs], pool *pgxpool.Pool, err error) error {
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for !w.cfg.Lease.Held() {
		select {
		case <-ctx.Done():
			return err
		case <-tick.C:
		}
	}
	if len(job.AttemptedBy) == 0 {
		return err
	}
	owned, qerr := db.ChunkAttemptOwned(ctx, pool, job.ID, job.AttemptedBy[len(job.AttemptedBy)-1])
	if qerr != nil || owned {
		return err
	}
	w.cfg.Logger.Warn("chunk taken over while this worker had lost its liveness lock; leaving it to the worker that has it",
		"job_id", job.ID, "message_id", job.Args.MessageID, "chunk", job.Args.Chunk)
	return nil
}

// begin starts the chunk in one round trip: the first chunk turns the
// message from scheduled to dispatching, unless a cancel won; every chunk
// reads the state that resulted, its still-pending deliveries with their
// devices and, unless the message is cached, its payload. c is nil when
// the message is no longer sendable; msg, the encoded pushes, is only built
// when something is pending. pool is the connections of the chunk's lane.
func (w *FanOutWorker) begin(ctx context.Context, job *river.Job[FanOutArgs], pool *pgxpool.Pool, now time.Time) (c *running, msg *encodedMessage, err error) {
	a := job.Args
	msg, cached := w.messages.lookup(a)
	payloadID := a.PayloadID
	if cached {
		payloadID = 0
	}
	release, err := w.begins[pool].enter(ctx, a.Chunk == 0)
	if err != nil {
		return nil, nil, err
	}
	begun, err := db.BeginChunk(ctx, pool, a.ledgerRange(), payloadID)
	if err == nil && begun.State == StateDispatching {
		c = &running{FanOutArgs: a, Targets: make([]Target, len(begun.Pending)), Rule: ruleOf(begun.Rules)}
		if a.Runs {
			c.Execution = executionOf(job.ID, job.Attempt)
		}
		for i, r := range begun.Pending {
			c.Targets[i] = targetOf(r)
		}
		// Decided before the gate is let go, so that a capped category's
		// claim takes a connection only while the chunk holds its place
		// among those beginning, as its read did: at an instant the chunks
		// do not open more connections between them than the gate lets
		// begin.
		err = withhold(ctx, c, pool, now)
	}
	release()
	if err != nil {
		return nil, nil, err
	}
	if begun.State != StateDispatching {
		w.cfg.Logger.InfoContext(ctx, "chunk skipped: its message is no longer sendable",
			"message_id", push.FormatMessageID(a.MessageID), "chunk", a.Chunk, "attempt", job.Attempt, "state", begun.State)
		return nil, nil, nil
	}
	if len(c.Targets) > 0 && !cached {
		if msg, err = w.messages.build(a, begun.Payload); err != nil {
			return nil, nil, err
		}
	}
	return c, msg, nil
}

// sendGroup is what a group of a chunk's targets answers to: a channel's
// breaker, or a Web Push service host's; and the localization they are sent.
type sendGroup struct {
	channel string
	breaker *Breaker
	locale  string
	// app is the targets' app, whose client sends them; credential, for
	// Web Push, the credential their subscriptions were made with.
	app        int32
	credential int64
}

// Lease is a process's claim to the chunks it runs (Liveness): Held says
// it may send now, Session which liveness session holds it, so that a chunk
// that began under one session does not go on sending under the next.
type Lease interface {
	Held() bool
	Session() uint64
}

// group sorts the chunk's targets (their indexes in c.Targets) by the
// breaker they answer to, so that a failing provider or push service parks
// only its own targets. A target whose device was throttled until after now
// (the database's time) is not sent: it waits (throttle.go).
func (w *FanOutWorker) group(c *running, now time.Time) map[sendGroup][]int {
	groups := map[sendGroup][]int{}
	for i, t := range c.Targets {
		if !t.sendable(now) {
			continue
		}
		g := sendGroup{channel: t.Channel, breaker: w.cfg.Breakers.ForTarget(t), locale: t.Locale, app: max(t.App, apps.DefaultID)}
		if t.Channel == ChannelWebPush {
			g.credential = t.Credential
		}
		groups[g] = append(groups[g], i)
	}
	return groups
}

// sends are a chunk's sends in flight. rec.results[i] is the outcome of
// c.Targets[i], written by the one goroutine that sends it before it hands
// i to the ledger writer.
type sends struct {
	ledger *ledger
	rec    *chunkRecord
	// done is buffered for every slice, so that no sender is ever left
	// blocked.
	done     chan struct{}
	inFlight int
	// fenced says a request was not made because this process had lost
	// its liveness lock (FanOutConfig.Lease).
	fenced atomic.Bool
	// session is the liveness session the chunk began under.
	session uint64
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
// end. The clients are the chunk's lane's, by app and channel.
func (w *FanOutWorker) send(ctx context.Context, c *running, msg *encodedMessage, groups map[sendGroup][]int, lane Lane, ledger *ledger, rec *chunkRecord) *sends {
	s := &sends{ledger: ledger, rec: rec, done: make(chan struct{}, len(c.Targets)+len(groups))}
	if w.cfg.Lease != nil {
		s.session = w.cfg.Lease.Session()
	}
	s.gone(c)
	for g, idx := range groups {
		// Each slice takes the client it sends through when it starts
		// and gives it back once its sends are answered: a rotation
		// meanwhile leaves the slice on the credential it began with.
		provider, lease, why := w.sender(lane, g)
		if provider == nil {
			s.disabled(why, idx)
			continue
		}
		lease.Release()
		app := w.appName(lane, g.app)
		m := msg.variant(app, g.locale)
		if c.Chunk == 0 {
			// A message's first devices go out before the chunks that
			// were already being sent: they take the next request slots
			// (push.WithLead) and the next places in the ledger writer
			// (ledger.reserve). When many messages fall due at once, none
			// waits for the others to begin.
			lead := idx[:min(firstChunkLead, len(idx))]
			idx = idx[len(lead):]
			s.inFlight++
			go w.sendTargets(push.WithLead(ctx, len(lead)), c, m, lane, g, app, lead, s)
		}
		for start := 0; start < len(idx); start += sendSlice {
			slice := idx[start:min(start+sendSlice, len(idx))]
			s.inFlight++
			go w.sendTargets(ctx, c, m, lane, g, app, slice, s)
		}
	}
	return s
}

// sender is the client a group's targets go through on lane, with the
// lease to release once its sends are answered; nil, with why, when the
// group's app has none for its channel.
func (w *FanOutWorker) sender(lane Lane, g sendGroup) (s Sender, lease *apps.Lease, why string) {
	if lane.Apps != nil {
		return lane.Apps.Lookup(lane.Queue, g.app, g.channel, g.credential)
	}
	if p, ok := lane.Providers[g.channel]; ok && g.app == apps.DefaultID {
		return p, nil, ""
	}
	return nil, nil, g.channel + " is not configured"
}

// appName is app's name, for its payload's overrides and the metrics.
func (w *FanOutWorker) appName(lane Lane, app int32) string {
	if lane.Apps != nil {
		if name := lane.Apps.Name(app); name != "" {
			return name
		}
	}
	if app == apps.DefaultID {
		return apps.DefaultName
	}
	return strconv.Itoa(int(app))
}

// gone cancels, unsent, the deliveries of the chunk's devices that are no
// longer their users' to send to (Target.Gone), and those their users'
// preferences withheld (withhold.go): cancelled, expired, or held pending
// until quiet hours end.
func (s *sends) gone(c *running) {
	now := time.Now()
	var idx []int
	for i, t := range c.Targets {
		switch {
		case t.Gone != push.ReasonNone:
			s.rec.results[i] = push.Result{At: now, Reason: t.Gone}
		case t.Held:
			s.rec.results[i] = push.Result{At: now, Reason: push.ReasonQuietHours}
		default:
			continue
		}
		idx = append(idx, i)
	}
	if len(idx) > 0 {
		s.ledger.add(s.rec, false, idx...)
	}
}

// disabled fails the targets at idx of an app's channel without a
// client, saying why.
func (s *sends) disabled(why string, idx []int) {
	now := time.Now()
	for _, i := range idx {
		s.rec.results[i] = push.Result{At: now, Reason: push.ReasonChannelDisabled, Detail: why}
	}
	s.ledger.add(s.rec, false, idx...)
}

// sendTargets sends the targets at slice through the group's client (app
// is the group's app's name, for the metrics) and hands each answer over
// as it comes: to the group's breaker and to the ledger writer. What the provider settled without an answer (refused locally,
// parked, not sent) is handed over when the slice is back.
func (w *FanOutWorker) sendTargets(ctx context.Context, c *running, msg *push.Message, lane Lane, g sendGroup, app string, slice []int, s *sends) {
	targets := make([]push.Target, len(slice))
	for j, i := range slice {
		targets[j] = c.Targets[i].Target
	}
	// The tokens of a chunk are good until the receipt window after its
	// expiry: a push may reach its device until then, and be opened days
	// later.
	push.SignReceipts(w.cfg.Receipts, c.MessageID, c.ExpiresAt.Add(w.cfg.ReceiptWindow), targets)
	out := make([]push.Result, len(slice))
	// answered[j] is written by the goroutine that got target j's answer
	// and read here once Send has returned, which waits for them all.
	answered := make([]bool, len(slice))
	hand := func(j int) {
		r := out[j]
		w.cfg.Metrics.requested(app, g.channel, r)
		switch {
		case r.At.IsZero():
		case r.Reason == push.ReasonCredentialsRefused:
			// The provider is up and refuses this app's credentials:
			// not its outage, but what the app's health and an alert
			// must show.
			g.breaker.Success()
			w.cfg.Breakers.App(g.app).Refused(g.channel, r.Detail, r.At)
			w.cfg.Metrics.refused(app, g.channel)
		case r.Reason.Transient() && errors.Is(ctx.Err(), context.Canceled):
			// The chunk was stopped (a shutdown): the request was cut
			// short here, not failed by the provider.
		case r.TargetThrottled:
			// A limit of this device's alone: the provider answered, so
			// it is up, and only this delivery waits (throttle.go).
			g.breaker.Success()
		case r.Reason.Transient() && r.RetryAfter > 0:
			// The provider (or push service) asked for a pause of all
			// its sends: a provider-wide 429 or a 503 with Retry-After.
			g.breaker.Pause(r.RetryAfter, r.Detail)
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
	lead := push.LeadOf(ctx) > 0
	yields := c.Priority != PriorityUrgent && c.Chunk != 0
	allow := func() bool {
		if yields {
			w.urgent.wait(ctx)
		}
		if l := w.cfg.Lease; l != nil && (!l.Held() || l.Session() != s.session) {
			s.fenced.Store(true)
			return false
		}
		if !s.ledger.reserve(ctx, lead) {
			return false
		}
		if !g.breaker.Allow() {
			s.ledger.release(1)
			return false
		}
		reserved.Add(1)
		return true
	}
	w.sendRotating(ctx, msg, lane, g, targets, out, allow, func(j int) {
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

// maxClientChanges bounds how many times one slice moves to a newer client
// of its app's credential: rotations seconds apart are one or two.
const maxClientChanges = 3

// sendRotating sends targets through the group's client, filling out[j]
// and calling answered(j) as each answer comes. Should a rotation replace
// the client while the slice is sent, the requests already made finish
// with the credential they began with, and those not made yet go through
// the new client: a slice of a large fan-out waits for its turn at the
// provider, and it must not send with a credential retired meanwhile.
// Without a client, what is left fails channel_disabled, saying why.
func (w *FanOutWorker) sendRotating(ctx context.Context, msg *push.Message, lane Lane, g sendGroup,
	targets []push.Target, out []push.Result, allow func() bool, answered func(j int)) {
	idx := make([]int, len(targets))
	for j := range idx {
		idx[j] = j
	}
	for change := 0; len(idx) > 0; change++ {
		provider, lease, why := w.sender(lane, g)
		if provider == nil {
			// Its client went between the group's look and the
			// slice's (the app was disabled, its credential retired).
			now := time.Now()
			for _, j := range idx {
				out[j] = push.Result{At: now, Reason: push.ReasonChannelDisabled, Detail: why}
			}
			return
		}
		sub, subOut := targets, out
		if change > 0 {
			sub, subOut = make([]push.Target, len(idx)), make([]push.Result, len(idx))
			for k, j := range idx {
				sub[k] = targets[j]
			}
		}
		var moved atomic.Bool
		provider.Send(ctx, msg, sub, subOut, func() bool {
			if change < maxClientChanges && lease.Retired() {
				moved.Store(true)
				return false
			}
			return allow()
		}, func(k int) {
			out[idx[k]] = subOut[k]
			answered(idx[k])
		})
		lease.Release()
		var next []int
		for k, j := range idx {
			if change > 0 {
				out[j] = subOut[k]
			}
			if moved.Load() && out[j].At.IsZero() && ctx.Err() == nil {
				next = append(next, j)
			}
		}
		if !moved.Load() {
			return
		}
		for _, j := range next {
			out[j] = push.Result{}
		}
		idx = next
	}
}

// firstChunkSize is the most devices a message's first chunk holds (and
// the first chunk of each of a local-time message's waves). Small, so that
// it begins quickly: reading a chunk's devices is the largest part of its
// beginning, and when many messages fall due at once their first chunks
// begin together, each reading its devices while the database is at its
// busiest. Every device of it but its lead still waits for its turn.
const firstChunkSize = 50

// firstChunkLead is how many of a message's first chunk's devices on each
// channel are sent ahead of the chunks already waiting for the provider.
const firstChunkLead = 10

// sendSlice is how many of a chunk's devices on one channel go to the
// provider in one call: a whole chunk's. Answers are handed to the ledger
// writer one by one as they come, so a slice's size does not delay their
// recording.
const sendSlice = 500

// finish closes the chunk once its answers are written: the ledger writer
// writes its timings and settles the message when nothing of it is pending
// any more. The chunk snoozes when some of its deliveries were parked or
// wait for their devices' throttles: until the first of them may be sent (a
// parked one at its breaker's probe, or a share of the breaker's cooldown
// after it: Breaker.Wake).
func (w *FanOutWorker) finish(ctx context.Context, c *running, ledger *ledger, rec *chunkRecord, fenced bool) error {
	parked, detail, breakers := w.parked(c, rec.results)
	waiting, firstDue := w.throttledWait(c, rec.results)
	if fenced {
		ledger.rewrite(rec)
	}
	if err := ledger.close(ctx, rec, len(parked) > 0 || waiting > 0); err != nil {
		return err
	}
	if len(parked) == 0 && waiting == 0 {
		return nil
	}
	if errors.Is(ctx.Err(), context.Canceled) {
		// The process is stopping (or an operator cancelled the job, which
		// River records over this): what was not sent is no provider's
		// failure. The chunk is handed back, its answers written, for
		// another worker to take at once.
		w.cfg.Logger.InfoContext(ctx, "chunk handed back: this worker is stopping",
			"message_id", push.FormatMessageID(c.MessageID), "chunk", c.Chunk, "unsent", parked, "throttled", waiting)
		return river.JobSnooze(0)
	}
	if fenced {
		// This process lost its liveness lock mid-chunk and stopped
		// sending (afterFence): no provider's failure either.
		w.cfg.Logger.WarnContext(ctx, "chunk handed back: this worker lost its liveness lock",
			"message_id", push.FormatMessageID(c.MessageID), "chunk", c.Chunk, "unsent", parked, "throttled", waiting)
		return river.JobSnooze(0)
	}
	// The wait is taken from now, once the close has written the answers,
	// not from before it: River schedules the snooze from when the chunk
	// returns, and a wait taken before the close (tens of milliseconds at
	// an instant) woke the chunk that much after its first delivery's
	// time, each chunk by a different amount. Chunks that held their
	// deliveries until the same end of quiet hours then fell due at as
	// many instants, each one woken, warmed and fetched on its own.
	waitThrottle := max(firstDue.Sub(w.cfg.Clock.Now()), 0)
	if len(parked) == 0 {
		wait := w.untilExpiry(c, waitThrottle)
		w.cfg.Logger.InfoContext(ctx, "chunk waits for throttled devices",
			"message_id", push.FormatMessageID(c.MessageID), "chunk", c.Chunk, "throttled", waiting, "retry_in", wait)
		return river.JobSnooze(wait)
	}
	wait := wake(breakers)
	if waiting > 0 {
		wait = min(wait, waitThrottle)
	}
	wait = w.untilExpiry(c, wait)
	w.cfg.Logger.WarnContext(ctx, "chunk parked: a provider is failing, its deliveries wait for it",
		"message_id", push.FormatMessageID(c.MessageID), "chunk", c.Chunk, "parked", parked, "throttled", waiting,
		"error", detail, "retry_in", wait)
	return river.JobSnooze(wait)
}

// throttledWait counts the chunk's deliveries that wait for their devices'
// throttles: those the provider throttled in this attempt, and those not
// sent because an earlier attempt's throttle had not run out when this one
// began (the only targets an attempt leaves without any result: their
// time may have come while it ran, and they are still to send). first is
// when the first of them may be sent (in the database's frame).
func (w *FanOutWorker) throttledWait(c *running, results []push.Result) (waiting int, first time.Time) {
	for i, t := range c.Targets {
		var until time.Time
		switch r := results[i]; {
		case throttled(r):
			until = w.cfg.Clock.ToDB(r.At).Add(throttleWait(r, t.Attempt))
		case t.Held, r.At.IsZero() && r.Reason == push.ReasonNone && t.Gone == push.ReasonNone:
			// Held for its user's quiet hours, or not sent because an
			// earlier attempt's wait had not run out.
			until = t.NotBefore
		default:
			continue
		}
		if waiting == 0 || until.Before(first) {
			first = until
		}
		waiting++
	}
	return waiting, first
}

// untilExpiry is wait, at least a short while and never past the chunk's
// expiry, when what is still pending expires.
func (w *FanOutWorker) untilExpiry(c *running, wait time.Duration) time.Duration {
	wait = max(wait, 100*time.Millisecond)
	if untilExpiry := c.ExpiresAt.Sub(w.cfg.Clock.Now()); untilExpiry < wait {
		wait = max(untilExpiry, 0)
	}
	return wait
}

// parkedDetail is what the log says of a parked delivery's error: for Web
// Push, with the push service's host, as GET /v1/providers says it; never
// more of the target (push.ScrubDetail), since the log outlives a user's
// erasure.
func parkedDetail(t Target, detail string) string {
	detail = push.ScrubDetail(detail)
	if host := push.EndpointHost(t.Token); t.Channel == ChannelWebPush && host != "" && detail != "" {
		return host + ": " + detail
	}
	return detail
}

// parked counts the chunk's deliveries that wait for a breaker, by channel,
// with the error that held them back and the breakers they wait for.
func (w *FanOutWorker) parked(c *running, results []push.Result) (parked map[string]int, detail string, breakers []*Breaker) {
	parked = map[string]int{}
	// The error told is the last attempted one's (else the first refused
	// one's), described once, after the walk.
	told := -1
	for i, r := range results {
		// Refused by the breaker (no time), or attempted and transient: both
		// stay pending and wait for the breaker. A throttled device waits
		// for its own throttle instead (throttledWait).
		if (r.At.IsZero() && r.Reason != push.ReasonNone) || (!r.At.IsZero() && r.Reason.Transient() && !r.TargetThrottled) {
			t := c.Targets[i]
			parked[t.Channel]++
			if told < 0 || results[told].Detail == "" || !r.At.IsZero() {
				told = i
			}
			if br := w.cfg.Breakers.ForTarget(t); !slices.Contains(breakers, br) {
				breakers = append(breakers, br)
			}
		}
	}
	if len(parked) == 0 {
		return nil, "", nil
	}
	detail = parkedDetail(c.Targets[told], results[told].Detail)
	return parked, detail, breakers
}

// wake is how long a chunk whose sends breakers parked should sleep: until
// the first of them lets it try again (Breaker.Wake). Each breaker is asked
// once a chunk, however many of its devices it parked, so that the chunk
// wakes at its share of the breaker's cooldown, and not at the least of
// hundreds of draws, which would bring every chunk back at the probe's
// instant again.
func wake(breakers []*Breaker) time.Duration {
	wait := time.Duration(-1)
	for _, br := range breakers {
		if d := br.Wake(); wait < 0 || d < wait {
			wait = d
		}
	}
	return max(wait, 0)
}

// expire marks what is still pending in the chunk expired, through pool
// (its lane's), and settles the message if that was the last of it.
func (w *FanOutWorker) expire(ctx context.Context, a FanOutArgs, pool *pgxpool.Pool, at time.Time) error {
	var (
		counted []settledDelivery
		settled db.SettleMessageRow
	)
	err := db.InTx(ctx, pool, func(tx pgx.Tx) error {
		q := db.On(tx)
		if _, err := q.LockMessage(ctx, a.MessageID); err != nil {
			return fmt.Errorf("lock message: %w", err)
		}
		if err := q.UseLedgerPlans(ctx); err != nil {
			return fmt.Errorf("use generic plans: %w", err)
		}
		rows, err := q.ChunkPendingOf(ctx, a.ledgerRange())
		if err != nil {
			return fmt.Errorf("read chunk ledger: %w", err)
		}
		p, expired := a.expired(rows)
		counted = expired
		if _, err := q.RecordResults(ctx, p); err != nil {
			return fmt.Errorf("expire deliveries: %w", err)
		}
		// Its timings, and the settle check, as db.WriteChunks writes them
		// (SettleMessage's guard decides).
		if err := q.RecordChunk(ctx, db.RecordChunkParams{MessageID: a.MessageID, Chunk: int32(a.Chunk), StartedAt: &at, FinishedAt: &at}); err != nil {
			return fmt.Errorf("record chunk: %w", err)
		}
		settled = db.SettleMessageRow{}
		if settled, err = q.SettleMessage(ctx, a.MessageID); err != nil && !errors.Is(err, db.ErrNotFound) {
			return fmt.Errorf("settle message: %w", err)
		}
		return nil
	})
	if err == nil {
		w.cfg.Metrics.count(a.Priority, counted)
		w.cfg.Metrics.settled(settled.Priority, settled.SloSkewMs)
	}
	return err
}

// kindWorker runs the chunk jobs of another kind than FanOutKind
// (SnapshotKind, RunsKind) with a chunk worker (the FanOutWorker): the
// same chunk, its args as args makes them.
type kindWorker[A river.JobArgs] struct {
	river.WorkerDefaults[A]
	w    river.Worker[FanOutArgs]
	args func(A) FanOutArgs
}

// AddChunkWorkers adds w to workers for every kind of chunk job.
func AddChunkWorkers(workers *river.Workers, w river.Worker[FanOutArgs]) {
	river.AddWorker(workers, w)
	river.AddWorker(workers, snapshotWorker(w))
	river.AddWorker(workers, runsWorker(w))
}

// snapshotWorker runs the chunk jobs of SnapshotKind with w.
func snapshotWorker(w river.Worker[FanOutArgs]) *kindWorker[SnapshotArgs] {
	return &kindWorker[SnapshotArgs]{w: w, args: func(a SnapshotArgs) FanOutArgs {
		a.Snapshot = true
		return a.FanOutArgs
	}}
}

// runsWorker runs the chunk jobs of RunsKind with w.
func runsWorker(w river.Worker[FanOutArgs]) *kindWorker[RunsArgs] {
	return &kindWorker[RunsArgs]{w: w, args: func(a RunsArgs) FanOutArgs {
		a.Snapshot, a.Runs = true, true
		return a.FanOutArgs
	}}
}

// fanOutJob is job as the FanOutWorker runs it.
func (k *kindWorker[A]) fanOutJob(job *river.Job[A]) *river.Job[FanOutArgs] {
	return &river.Job[FanOutArgs]{JobRow: job.JobRow, Args: k.args(job.Args)}
}

// Timeout implements river.Worker: the chunk worker's.
func (k *kindWorker[A]) Timeout(job *river.Job[A]) time.Duration {
	return k.w.Timeout(k.fanOutJob(job))
}

// Work implements river.Worker: the chunk worker's.
func (k *kindWorker[A]) Work(ctx context.Context, job *river.Job[A]) error {
	return k.w.Work(ctx, k.fanOutJob(job))
}

// Breakers returns the worker's circuit breakers.
func (w *FanOutWorker) Breakers() *Breakers { return w.cfg.Breakers }
