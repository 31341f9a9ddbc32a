package jobs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
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
// and which provider that is.
type Target struct {
	push.Target
	Channel string
}

// Targets are a chunk's devices. In the job's args they are packed into one
// string, a line per device with tab-separated fields, rather than an array
// of objects: River indexes args with a GIN index, which would otherwise take
// an entry for every field of every device (125,000 for a 25,000-device
// message) and cost more than the rest of scheduling together. A string
// longer than 125 bytes is one hashed entry. Tokens, endpoints and keys never
// hold tabs or line breaks (the API rejects them).
type Targets []Target

// channelCodes packs a channel into one letter.
var channelCodes = map[string]byte{ChannelAPNs: 'a', ChannelFCM: 'f', ChannelWebPush: 'w'}

func channelOfCode(c byte) (string, bool) {
	switch c {
	case 'a':
		return ChannelAPNs, true
	case 'f':
		return ChannelFCM, true
	case 'w':
		return ChannelWebPush, true
	}
	return "", false
}

// MarshalJSON packs the targets into one JSON string.
func (ts Targets) MarshalJSON() ([]byte, error) {
	var b strings.Builder
	for _, t := range ts {
		code, ok := channelCodes[t.Channel]
		if !ok {
			return nil, fmt.Errorf("target %d: unknown channel %q", t.DeviceID, t.Channel)
		}
		if strings.ContainsAny(t.Token+t.P256dh+t.Auth, "\t\n") {
			return nil, fmt.Errorf("target %d: a field holds a tab or line break", t.DeviceID)
		}
		b.WriteString(strconv.FormatInt(t.DeviceID, 10))
		b.WriteByte('\t')
		b.WriteByte(code)
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
		if err != nil || len(fields[1]) != 1 {
			return fmt.Errorf("targets: malformed line %q", line)
		}
		channel, ok := channelOfCode(fields[1][0])
		if !ok {
			return fmt.Errorf("targets: malformed line %q", line)
		}
		t := Target{Target: push.Target{DeviceID: id, Token: fields[2]}, Channel: channel}
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
// bounds its own requests in flight.
type Sender interface {
	Send(ctx context.Context, m *push.Message, targets []push.Target, results []push.Result, allow func() bool)
}

// FanOutConfig holds what the chunk worker needs.
type FanOutConfig struct {
	Pool *pgxpool.Pool
	// UrgentPool is the urgent lane's own connections, so that an urgent
	// chunk never queues for a connection behind a bulk fan-out's chunks,
	// which all start at the same instant. Nil: the urgent lane shares Pool.
	UrgentPool *pgxpool.Pool
	Logger     *slog.Logger
	Clock      *Clock
	// Providers by channel (apns, fcm, webpush) for the bulk lane; a channel
	// without one is disabled, and its deliveries fail with channel_disabled.
	// Nil in a worker that serves the urgent lane alone.
	Providers map[string]Sender
	// UrgentProviders are the urgent lane's own provider clients, with
	// their own connections and in-flight limits, so that an urgent push
	// never queues behind a bulk fan-out inside a provider client either.
	// Nil: the urgent lane shares Providers.
	UrgentProviders map[string]Sender
	// Breakers are shared by both lanes (a provider's health is the same
	// whichever lane sends). Nil: closed breakers for every channel that
	// has a provider, with the default settings.
	Breakers *Breakers
	// Timeout bounds one attempt of a chunk. Default 30 s.
	Timeout time.Duration
	// Metrics, when set, counts deliveries, skew and provider latency.
	Metrics *Metrics
}

// FanOutWorker turns a chunk into pushes: it checks expiry, marks the
// message dispatching (unless a cancel won), skips devices already settled
// by an earlier attempt, sends to every provider at once, and writes the
// results as they come back (db.WriteChunk).
type FanOutWorker struct {
	river.WorkerDefaults[FanOutArgs]
	cfg      FanOutConfig
	messages *messageCache
}

// NewFanOutWorker returns the chunk worker.
func NewFanOutWorker(cfg FanOutConfig) *FanOutWorker {
	if cfg.Timeout <= 0 {
		cfg.Timeout = 30 * time.Second
	}
	if cfg.Breakers == nil {
		var channels []string
		for _, ch := range Channels {
			if cfg.Providers[ch] != nil || cfg.UrgentProviders[ch] != nil {
				channels = append(channels, ch)
			}
		}
		cfg.Breakers = NewBreakers(BreakerConfig{}, channels...)
	}
	if cfg.UrgentPool == nil {
		cfg.UrgentPool = cfg.Pool
	}
	return &FanOutWorker{cfg: cfg, messages: newMessageCache(64)}
}

// providers are the provider clients of a chunk's lane.
func (w *FanOutWorker) providers(a FanOutArgs) map[string]Sender {
	if a.Priority == PriorityUrgent && w.cfg.UrgentProviders != nil {
		return w.cfg.UrgentProviders
	}
	return w.cfg.Providers
}

// pool is the connection pool of a chunk's lane.
func (w *FanOutWorker) pool(a FanOutArgs) *pgxpool.Pool {
	if a.Priority == PriorityUrgent {
		return w.cfg.UrgentPool
	}
	return w.cfg.Pool
}

// recordTimeout bounds the write of a chunk's results.
const recordTimeout = 10 * time.Second

// sendBudget is how long a chunk attempt may spend sending: its timeout less
// a reserve for recording the results (a quarter of the timeout, at most 5 s).
func (w *FanOutWorker) sendBudget() time.Duration {
	return w.cfg.Timeout - min(w.cfg.Timeout/4, 5*time.Second)
}

// Timeout bounds one attempt. River's rescuer must not retry a chunk whose
// worker may still be sending, so the client's RescueStuckJobsAfter is set
// above it (see NewRiverClient).
func (w *FanOutWorker) Timeout(*river.Job[FanOutArgs]) time.Duration { return w.cfg.Timeout }

// Work sends one chunk.
func (w *FanOutWorker) Work(ctx context.Context, job *river.Job[FanOutArgs]) error {
	a := job.Args
	defer w.cfg.Metrics.chunkStarted(a.Priority)()
	startedAt := w.cfg.Clock.Now()
	log := w.cfg.Logger.With("message_id", push.FormatMessageID(a.MessageID), "chunk", a.Chunk, "attempt", job.Attempt)

	if !startedAt.Before(a.ExpiresAt) {
		// Past its lifetime nothing is sent: what is pending expires.
		return w.expire(ctx, a, startedAt)
	}

	// One round trip: the first chunk turns the message from scheduled to
	// dispatching, unless a cancel won; every chunk reads the state that
	// resulted, its still-pending devices and, unless the message is
	// cached, its payload.
	msg, cached := w.messages.lookup(a)
	payloadID := a.PayloadID
	if cached {
		payloadID = 0
	}
	begun, err := db.BeginChunk(ctx, w.pool(a), a.MessageID, a.deviceIDs(), payloadID)
	if err != nil {
		return err
	}
	if begun.State != StateDispatching {
		log.InfoContext(ctx, "chunk skipped: its message is no longer sendable", "state", begun.State)
		return nil
	}
	if len(begun.Pending) == 0 {
		return w.finish(ctx, a, startedAt, nil, nil)
	}
	pending := make(map[int64]bool, len(begun.Pending))
	for _, r := range begun.Pending {
		pending[r.DeviceID] = true
	}
	if !cached {
		if msg, err = w.messages.build(a, begun.Payload); err != nil {
			return err
		}
	}

	// Group the pending targets by the breaker they answer to (a channel,
	// or a Web Push service's host) and send to every group at once; each
	// provider bounds its own concurrency.
	type group struct {
		channel string
		breaker *Breaker
	}
	byGroup := map[group][]int{}
	for i, t := range a.Targets {
		if pending[t.DeviceID] {
			g := group{t.Channel, w.cfg.Breakers.For(t.Channel, t.Token)}
			byGroup[g] = append(byGroup[g], i)
		}
	}
	providers := w.providers(a)
	// Sending stops early enough to leave time to record what was sent: a
	// chunk that ran out of time still writes its results, so its retry
	// sends only what was not answered.
	sendCtx, cancel := context.WithTimeout(ctx, w.sendBudget())
	defer cancel()
	results := make([]push.Result, len(a.Targets))
	// Each channel's targets go to the provider in slices, all at once. A
	// provider serves concurrent calls in the order they came (push.Limiter),
	// so slices finish one after another rather than all at the end, and
	// each slice's results are recorded within recordEvery of its return:
	// a process that dies mid-fan-out resends only what it had not yet
	// recorded, about one provider's requests in flight.
	// Buffered for every slice, so that no sender is left blocked if a
	// write fails and Work returns before the last slice is back.
	done := make(chan []int, len(a.Targets)+len(byGroup))
	sending := 0
	for g, idx := range byGroup {
		channel, breaker := g.channel, g.breaker
		provider, ok := providers[channel]
		if !ok {
			now := time.Now()
			for _, i := range idx {
				results[i] = push.Result{At: now, Reason: push.ReasonChannelDisabled, Detail: channel + " is not configured"}
			}
			sending++
			go func() { done <- idx }()
			continue
		}
		for start := 0; start < len(idx); start += sendSlice {
			slice := idx[start:min(start+sendSlice, len(idx))]
			sending++
			go func() {
				targets := make([]push.Target, len(slice))
				for j, i := range slice {
					targets[j] = a.Targets[i].Target
				}
				out := make([]push.Result, len(slice))
				provider.Send(sendCtx, msg, targets, out, breaker.Allow)
				for j, i := range slice {
					r := out[j]
					w.cfg.Metrics.requested(channel, r)
					switch {
					case r.At.IsZero():
					case r.Reason.Transient():
						breaker.Failure(r.Detail)
					default:
						breaker.Success()
					}
					results[i] = r
				}
				done <- slice
			}()
		}
	}

	var unrecorded []int
	tick := time.NewTicker(recordEvery)
	defer tick.Stop()
	for sending > 0 {
		select {
		case slice := <-done:
			sending--
			unrecorded = append(unrecorded, slice...)
			if sending > 0 {
				continue
			}
		case <-tick.C:
			if len(unrecorded) == 0 {
				continue
			}
		}
		if sending > 0 {
			if err := w.record(ctx, a, startedAt, results, unrecorded, false); err != nil {
				return err
			}
			unrecorded = unrecorded[:0]
		}
	}
	return w.finish(ctx, a, startedAt, results, unrecorded)
}

// Sending in slices, recorded as they return.
const (
	// sendSlice is how many of a chunk's devices on one channel go to the
	// provider in one call: a whole chunk's. Smaller slices record sooner
	// but cost more CPU per send than they save (measured with herald
	// bench at 50 and 125).
	sendSlice = 500
	// recordEvery is how often a chunk writes the results that came back.
	recordEvery = 200 * time.Millisecond
)

// finish writes the last of a chunk's results and closes the chunk: it
// settles the message when nothing of it is pending any more, and snoozes
// the chunk when some of its deliveries were parked.
func (w *FanOutWorker) finish(ctx context.Context, a FanOutArgs, startedAt time.Time, results []push.Result, idx []int) error {
	if err := w.record(ctx, a, startedAt, results, idx, true); err != nil {
		return err
	}
	parked := map[string]int{}
	var detail string
	// Sleep until the first parked provider (or push service) lets a send
	// through again, but never past the chunk's expiry, when what is still
	// pending expires.
	wait := time.Duration(-1)
	for i, r := range results {
		// Refused by the breaker (no time), or attempted and transient: both
		// stay pending and wait for the breaker.
		if (r.At.IsZero() && r.Reason != push.ReasonNone) || (!r.At.IsZero() && r.Reason.Transient()) {
			t := a.Targets[i]
			parked[t.Channel]++
			if detail == "" || !r.At.IsZero() {
				detail = r.Detail
			}
			if d := w.cfg.Breakers.For(t.Channel, t.Token).RetryIn(); wait < 0 || d < wait {
				wait = d
			}
		}
	}
	if len(parked) == 0 {
		return nil
	}
	wait = max(wait, 100*time.Millisecond)
	if untilExpiry := a.ExpiresAt.Sub(w.cfg.Clock.Now()); untilExpiry < wait {
		wait = max(untilExpiry, 0)
	}
	w.cfg.Logger.WarnContext(ctx, "chunk parked: a provider is failing, its deliveries wait for it",
		"message_id", push.FormatMessageID(a.MessageID), "chunk", a.Chunk, "parked", parked, "error", detail, "retry_in", wait)
	return river.JobSnooze(wait)
}

// record writes the results of the targets at idx, evicts dead tokens and
// moves the message's counters, in one pipelined batch (db.WriteChunk);
// final also closes the chunk's timings and settles the message if nothing
// of it is pending.
func (w *FanOutWorker) record(ctx context.Context, a FanOutArgs, startedAt time.Time, results []push.Result, idx []int, final bool) error {
	p := db.RecordResultsParams{MessageID: a.MessageID}
	var (
		evictIDs              []int64
		evictReasons          []string
		firstAccept, lastSeen *time.Time
		parked                bool
		counted               []settledDelivery
	)
	for _, i := range idx {
		r := results[i]
		if r.At.IsZero() {
			// Parked: the provider's breaker refused the send.
			parked = parked || r.Reason != push.ReasonNone
			continue
		}
		at := w.cfg.Clock.ToDB(r.At)
		status, acceptedUs := "failed", int64(0)
		switch {
		case r.Accepted:
			status, acceptedUs = "accepted", at.UnixMicro()
			if firstAccept == nil || at.Before(*firstAccept) {
				firstAccept = &at
			}
			if lastSeen == nil || at.After(*lastSeen) {
				lastSeen = &at
			}
		case r.Reason.Transient():
			// Attempted, not settled: it waits for the breaker and is
			// retried when the chunk wakes, until it expires.
			status, parked = "pending", true
		}
		p.DeviceIds = append(p.DeviceIds, a.Targets[i].DeviceID)
		p.Statuses = append(p.Statuses, status)
		p.Reasons = append(p.Reasons, string(r.Reason))
		p.AttemptedUs = append(p.AttemptedUs, at.UnixMicro())
		p.AcceptedUs = append(p.AcceptedUs, acceptedUs)
		counted = append(counted, settledDelivery{a.Targets[i].Channel, status, r.Reason, at.Sub(a.DispatchAt)})
		if !r.Accepted && r.Reason.Evicts() {
			evictIDs = append(evictIDs, a.Targets[i].DeviceID)
			evictReasons = append(evictReasons, string(r.Reason))
		}
	}
	if !final && len(p.DeviceIds) == 0 {
		return nil
	}

	finishedAt := w.cfg.Clock.Now()
	chunk := db.RecordChunkParams{
		MessageID: a.MessageID, Chunk: int32(a.Chunk), StartedAt: &startedAt,
		FirstAcceptedAt: firstAccept, LastAcceptedAt: lastSeen,
	}
	if final && !parked {
		chunk.FinishedAt = &finishedAt
	}
	// Record even when the attempt's context is done (timeout, shutdown):
	// pushes that were sent must be written, or the retry sends them again.
	// The message row, which every chunk of the message writes (its
	// counters), is locked last and held only to the commit, on the server
	// (db.WriteChunk). The message is dispatching here, so no cancel can be
	// holding it while waiting for this chunk's deliveries (see
	// jobs/state.go for the lock order).
	writeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), recordTimeout)
	defer cancel()
	_, err := db.WriteChunk(writeCtx, w.pool(a), db.ChunkWrite{
		Evict:   db.EvictDevicesParams{Ids: evictIDs, Reasons: evictReasons, SentAfter: startedAt},
		Chunk:   chunk,
		Results: p,
		Settle:  final,
	})
	if err != nil {
		return fmt.Errorf("record results: %w", err)
	}
	w.cfg.Metrics.count(a.Priority, counted)
	return nil
}

// expire marks what is still pending in the chunk expired and settles the
// message if that was the last of it.
func (w *FanOutWorker) expire(ctx context.Context, a FanOutArgs, at time.Time) error {
	ids := a.deviceIDs()
	var counted []settledDelivery
	err := db.InTx(ctx, w.pool(a), func(tx pgx.Tx) error {
		q := db.On(tx)
		if _, err := q.LockMessage(ctx, a.MessageID); err != nil {
			return fmt.Errorf("lock message: %w", err)
		}
		rows, err := q.ChunkPending(ctx, db.ChunkPendingParams{MessageID: a.MessageID, DeviceIds: ids})
		if err != nil {
			return fmt.Errorf("read chunk ledger: %w", err)
		}
		p := db.RecordResultsParams{MessageID: a.MessageID}
		channels := make(map[int64]string, len(a.Targets))
		for _, t := range a.Targets {
			channels[t.DeviceID] = t.Channel
		}
		counted = counted[:0]
		for _, r := range rows {
			counted = append(counted, settledDelivery{channel: channels[r.DeviceID], status: "expired"})
			p.DeviceIds = append(p.DeviceIds, r.DeviceID)
			p.Statuses = append(p.Statuses, "expired")
			p.Reasons = append(p.Reasons, "")
			p.AttemptedUs = append(p.AttemptedUs, 0)
			p.AcceptedUs = append(p.AcceptedUs, 0)
		}
		res, err := q.RecordResults(ctx, p)
		if err != nil {
			return fmt.Errorf("expire deliveries: %w", err)
		}
		// Its timings, and the settle check of db.WriteChunk; done here in
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
