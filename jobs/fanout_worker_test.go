package jobs

import (
	"context"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivertest"
	"github.com/riverqueue/river/rivertype"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldpush/herald/db"
	"github.com/heraldpush/herald/db/dbtest"
	"github.com/heraldpush/herald/jobs/push"
)

// These tests work one chunk of a real message (made by Enqueuer.Create, so
// its ledger and its job's args are what production makes) through River's
// own executor (rivertest), against a real database, with providers that
// answer from a script. Each reaches one branch of FanOutWorker in
// milliseconds.
//
// River's state of the chunk job lives in a transaction of the test's that
// is rolled back at the end, as rivertest intends; the worker reads and
// writes the message and its ledger through its own pool, as it does in
// production, so those writes are committed and the test reads them back.

// fanOutBundle is one test's database, an insert-only River client for
// making messages, and the transaction River's state of the chunk job is
// kept in.
type fanOutBundle struct {
	t      *testing.T
	db     *dbtest.DB
	q      *db.Queries
	client *river.Client[pgx.Tx]
	clock  *Clock
	tx     pgx.Tx
	// design is how the bundle's messages are scheduled (LedgerAuto:
	// with snapshots).
	design Ledger
	// category and quietHours, when set, are the bundle's messages'.
	category, quietHours string
}

// setupFanOut is named for the worker it sets up, not setup, so that it
// cannot collide with another test's setup in this package.
func setupFanOut(t *testing.T) *fanOutBundle {
	t.Helper()
	ctx := context.Background()
	tdb := dbtest.New(t)
	client, err := NewRiverClient(tdb.Pool, RiverConfig{Logger: discard})
	require.NoError(t, err)
	clock := NewClock(tdb.Pool, discard)
	require.NoError(t, clock.Measure(ctx))
	tx, err := tdb.Pool.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	return &fanOutBundle{t: t, db: tdb, q: db.On(tdb.Pool), client: client, clock: clock, tx: tx}
}

// devices registers one user per token, each with that one device.
// Tokens starting "https://" are Web Push endpoints; the rest are
// "apns-..." or "fcm-..." tokens of the channel they name.
func (b *fanOutBundle) devices(tokens ...string) []string {
	b.t.Helper()
	slices.Sort(tokens)
	p := db.RegisterDevicesParams{}
	for i, token := range tokens {
		user := "user-" + string(rune('a'+i))
		p.UserIds = append(p.UserIds, user)
		channel, _, _ := strings.Cut(token, "-")
		p256dh, auth := "", ""
		if strings.HasPrefix(token, "https://") {
			channel, p256dh, auth = ChannelWebPush, "BKey", "AuthKey"
		}
		p.Channels = append(p.Channels, channel)
		p.Tokens = append(p.Tokens, token)
		p.P256dhs = append(p.P256dhs, p256dh)
		p.Auths = append(p.Auths, auth)
	}
	require.NoError(b.t, b.q.EnsureUsers(context.Background(), p.UserIds))
	_, err := b.q.RegisterDevices(context.Background(), p)
	require.NoError(b.t, err)
	return p.UserIds
}

// chunkJob is a message's one chunk: its job as River stores it, its args,
// and its targets as its worker reads them before anything is sent.
type chunkJob struct {
	msg     db.Message
	job     *rivertype.JobRow
	args    FanOutArgs
	targets []Target
}

// device is the id of the chunk's device with token.
func (c chunkJob) device(t *testing.T, token string) int64 {
	t.Helper()
	for _, tg := range c.targets {
		if tg.Token == token {
			return tg.DeviceID
		}
	}
	t.Fatalf("no device has token %q", token)
	return 0
}

// message schedules a bulk message to users, due at dispatchAt and living
// for lifetime, as the API does, and returns its one chunk.
func (b *fanOutBundle) message(users []string, dispatchAt time.Time, lifetime time.Duration) chunkJob {
	b.t.Helper()
	ctx := context.Background()
	var msg db.Message
	require.NoError(b.t, db.InTx(ctx, b.db.Pool, func(tx pgx.Tx) error {
		var err error
		msg, err = NewEnqueuer(b.client, 0).WithLedger(b.design).Create(ctx, tx, MessageSpec{
			Priority: PriorityBulk, DispatchAt: dispatchAt, ExpiresAt: dispatchAt.Add(lifetime),
			Audience: Audience{UserIDs: users}, AudienceJSON: []byte(`{}`),
			Content: push.Content{Title: "t"}, Category: b.category, QuietHours: b.quietHours,
		})
		return err
	}))
	jobIDs, err := b.q.MessageChunkJobs(ctx, msg.ID)
	require.NoError(b.t, err)
	require.Len(b.t, jobIDs, 1)
	c := chunkJob{msg: msg, job: b.job(jobIDs[0])}
	c.args, err = ChunkArgs(c.job.Kind, c.job.EncodedArgs)
	require.NoError(b.t, err)
	c.targets = chunkTargets(b.t, b.q, c.args)
	require.Len(b.t, c.targets, int(msg.DeviceCount))
	return c
}

// chunkTargets reads a chunk's pending targets as its worker does.
func chunkTargets(t testing.TB, q *db.Queries, a FanOutArgs) []Target {
	t.Helper()
	rows, err := q.ChunkPendingOf(context.Background(), a.ledgerRange())
	require.NoError(t, err)
	targets := make([]Target, len(rows))
	for i, r := range rows {
		targets[i] = targetOf(r)
	}
	return targets
}

// dueNow schedules a message to users due now, living an hour.
func (b *fanOutBundle) dueNow(users []string) chunkJob {
	b.t.Helper()
	return b.message(users, b.clock.Now(), time.Hour)
}

// job reads the chunk job as River last left it in the test's transaction.
func (b *fanOutBundle) job(id int64) *rivertype.JobRow {
	b.t.Helper()
	job, err := b.client.JobGetTx(context.Background(), b.tx, id)
	require.NoError(b.t, err)
	return job
}

// worker is a chunk worker on the test's database whose two lanes share
// providers, with cfg's breakers and timeout.
func (b *fanOutBundle) worker(providers map[string]Sender, cfg FanOutConfig) *FanOutWorker {
	cfg.Pool, cfg.Logger, cfg.Clock = b.db.Pool, discard, b.clock
	for _, q := range LaneQueues {
		cfg.Lanes = append(cfg.Lanes, Lane{Queue: q, Providers: providers})
	}
	return NewFanOutWorker(cfg)
}

// work runs one attempt of c's job through River's executor, as River's
// producer would: the job is marked running, worked, and completed, snoozed
// or failed in the test's transaction.
func (b *fanOutBundle) work(w *FanOutWorker, c chunkJob) *rivertest.WorkResult {
	b.t.Helper()
	var res *rivertest.WorkResult
	var err error
	if c.job.Kind != FanOutKind {
		res, err = workOfKind(context.Background(), b.t, b.tx, w, b.job(c.job.ID))
	} else {
		tw := rivertest.NewWorker(b.t, riverpgxv5.New(nil), &river.Config{Logger: discard}, river.Worker[FanOutArgs](w))
		res, err = tw.WorkJob(context.Background(), b.t, b.tx, b.job(c.job.ID))
	}
	require.NoError(b.t, err)
	if res.EventKind == river.EventKindJobCompleted {
		// Every place a request took in the ledger writer is free again
		// once the chunk's answers are written.
		l := w.ledger(w.lane(c.args).Pool)
		l.mu.Lock()
		owed := l.owed
		l.mu.Unlock()
		require.Zero(b.t, owed, "places still held in the ledger writer after the chunk completed")
	}
	return res
}

// ledger is the message's deliveries by device id.
func (b *fanOutBundle) ledger(msgID int64) map[int64]db.ListDeliveriesRow {
	b.t.Helper()
	rows, err := b.q.ListAllDeliveries(context.Background(), db.ListDeliveriesParams{MessageID: msgID, PageSize: 1000})
	require.NoError(b.t, err)
	out := make(map[int64]db.ListDeliveriesRow, len(rows))
	for _, r := range rows {
		out[r.DeviceID] = r
	}
	return out
}

// requireStatus checks the delivery of the chunk's device with token.
func (b *fanOutBundle) requireStatus(c chunkJob, token, status string, reason push.Reason) {
	b.t.Helper()
	d, ok := b.ledger(c.msg.ID)[c.device(b.t, token)]
	require.True(b.t, ok, "no delivery for %s", token)
	require.Equal(b.t, status, d.Status, "the delivery to %s", token)
	got := ""
	if d.Reason != nil {
		got = *d.Reason
	}
	require.Equal(b.t, string(reason), got, "the reason of the delivery to %s", token)
}

// settled reads the message and checks that its counters are the ledger's
// own tallies and add up to its device count, whatever the worker did.
func (b *fanOutBundle) settled(msgID int64) db.Message {
	b.t.Helper()
	m, err := b.q.GetMessage(context.Background(), msgID)
	require.NoError(b.t, err)
	tally := map[string]int32{}
	for _, d := range b.ledger(msgID) {
		tally[d.Status]++
	}
	require.Equal(b.t, map[string]int32{
		"pending": m.PendingCount, "accepted": m.AcceptedCount, "failed": m.FailedCount,
		"expired": m.ExpiredCount, "cancelled": m.CancelledCount,
	}, map[string]int32{
		"pending": tally["pending"], "accepted": tally["accepted"], "failed": tally["failed"],
		"expired": tally["expired"], "cancelled": tally["cancelled"],
	}, "the message's counters against its ledger")
	require.Equal(b.t, m.DeviceCount,
		m.PendingCount+m.AcceptedCount+m.FailedCount+m.ExpiredCount+m.CancelledCount,
		"the message's counters add up to its devices")
	return m
}

// recordingSender is a provider that answers from a script. It records the
// token of every send it makes and answers it with the next result scripted
// for that token (accepted once the script runs out). As push.Limiter does,
// it asks allow before each send and parks the target and every one after it
// once allow refuses.
type recordingSender struct {
	script map[string][]push.Result
	// stallAfter, when above zero, makes a Send answer that many targets
	// and then stop answering until its context ends, as a provider that
	// hangs would; the rest are left unsent, as push.Limiter leaves them.
	stallAfter int
	// stalled, when set, is called as a Send stalls.
	stalled func()
	// sending, when set, is called as a Send begins.
	sending func()

	mu   sync.Mutex
	sent []string
	// hung is set when a stalled Send's context did not end within 10 s:
	// the worker gave the provider no deadline.
	hung bool
}

func (s *recordingSender) Send(ctx context.Context, _ *push.Message, targets []push.Target, results []push.Result, allow func() bool, answered func(i int)) {
	if s.sending != nil {
		s.sending()
	}
	for i, t := range targets {
		if s.stallAfter > 0 && i == s.stallAfter {
			if s.stalled != nil {
				s.stalled()
			}
			select {
			case <-ctx.Done():
			case <-time.After(10 * time.Second):
				s.mu.Lock()
				s.hung = true
				s.mu.Unlock()
			}
			for j := i; j < len(targets); j++ {
				results[j] = push.Result{Reason: push.ReasonProviderUnavailable, Detail: "not sent: the send's context ended"}
			}
			return
		}
		if !allow() {
			for j := i; j < len(targets); j++ {
				results[j] = push.Result{Reason: push.ReasonProviderUnavailable, Detail: "parked: circuit breaker open"}
			}
			return
		}
		results[i] = s.answer(t.Token)
		answered(i)
	}
}

// answer records a send to token and returns its scripted result.
func (s *recordingSender) answer(token string) push.Result {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sent = append(s.sent, token)
	r := push.Result{Accepted: true}
	if next := s.script[token]; len(next) > 0 {
		r, s.script[token] = next[0], next[1:]
	}
	r.At, r.Latency = time.Now(), time.Millisecond
	return r
}

// sends returns the tokens sent to since the last call, sorted.
func (s *recordingSender) sends() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := slices.Sorted(slices.Values(s.sent))
	s.sent = nil
	return out
}

func failing(reason push.Reason) push.Result {
	return push.Result{Reason: reason, Detail: string(reason)}
}

// openBreakers are breakers for every channel that open at the first
// transient failure and stay open for cooldown.
func openBreakers(cooldown time.Duration) *Breakers {
	return NewBreakers(BreakerConfig{Threshold: 1, Cooldown: cooldown, MaxCooldown: cooldown}, Channels...)
}

func TestFanOutExpiredChunkSendsNothing(t *testing.T) {
	t.Parallel()
	b := setupFanOut(t)
	users := b.devices("apns-1", "fcm-1", "https://push.example/w/1")
	// Due two hours ago, expired one hour ago: the chunk's job ran late.
	c := b.message(users, b.clock.Now().Add(-2*time.Hour), time.Hour)
	apns, fcm, web := &recordingSender{}, &recordingSender{}, &recordingSender{}
	w := b.worker(map[string]Sender{ChannelAPNs: apns, ChannelFCM: fcm, ChannelWebPush: web}, FanOutConfig{})

	res := b.work(w, c)
	require.Equal(t, river.EventKindJobCompleted, res.EventKind)
	require.Empty(t, append(append(apns.sends(), fcm.sends()...), web.sends()...), "nothing is sent past expiry")
	for _, token := range []string{"apns-1", "fcm-1", "https://push.example/w/1"} {
		b.requireStatus(c, token, "expired", push.ReasonNone)
	}
	m := b.settled(c.msg.ID)
	require.Equal(t, StateExpired, m.State)
	require.NotNil(t, m.SettledAt)
	require.EqualValues(t, 3, m.ExpiredCount)
}

func TestFanOutCancelWinsTheRace(t *testing.T) {
	t.Parallel()
	b := setupFanOut(t)
	ctx := context.Background()
	c := b.dueNow(b.devices("apns-1", "fcm-1"))
	// River has fetched the chunk, and the cancel commits before the worker
	// starts: the message's row and ledger change as the API's cancel
	// changes them (its chunk jobs, already running, are River's concern).
	require.NoError(t, db.InTx(ctx, b.db.Pool, func(tx pgx.Tx) error {
		q := db.On(tx)
		if _, err := q.CancelMessage(ctx, c.msg.ID); err != nil {
			return err
		}
		_, err := q.CancelPendingDeliveries(ctx, c.msg.ID)
		return err
	}))
	before := b.settled(c.msg.ID)
	ledger := b.ledger(c.msg.ID)
	timings, err := b.q.ChunkTimings(ctx, c.msg.ID)
	require.NoError(t, err)

	apns, fcm := &recordingSender{}, &recordingSender{}
	res := b.work(b.worker(map[string]Sender{ChannelAPNs: apns, ChannelFCM: fcm}, FanOutConfig{}), c)
	require.Equal(t, river.EventKindJobCompleted, res.EventKind)
	require.Empty(t, append(apns.sends(), fcm.sends()...), "a cancelled message sends nothing")
	require.Equal(t, StateCancelled, before.State)
	require.Equal(t, before, b.settled(c.msg.ID), "the message is as the cancel left it")
	require.Equal(t, ledger, b.ledger(c.msg.ID), "the ledger is as the cancel left it")
	after, err := b.q.ChunkTimings(ctx, c.msg.ID)
	require.NoError(t, err)
	require.Equal(t, timings, after, "the chunk records nothing of itself")
}

func TestFanOutDisabledChannelFailsOnlyItsDeliveries(t *testing.T) {
	t.Parallel()
	b := setupFanOut(t)
	c := b.dueNow(b.devices("apns-1", "fcm-1", "fcm-2", "https://push.example/w/1", "https://push.example/w/2"))
	// No Web Push provider here.
	apns, fcm := &recordingSender{}, &recordingSender{}
	res := b.work(b.worker(map[string]Sender{ChannelAPNs: apns, ChannelFCM: fcm}, FanOutConfig{}), c)

	require.Equal(t, river.EventKindJobCompleted, res.EventKind)
	require.Equal(t, []string{"apns-1"}, apns.sends())
	require.Equal(t, []string{"fcm-1", "fcm-2"}, fcm.sends())
	for _, token := range []string{"apns-1", "fcm-1", "fcm-2"} {
		b.requireStatus(c, token, "accepted", push.ReasonNone)
	}
	for _, token := range []string{"https://push.example/w/1", "https://push.example/w/2"} {
		b.requireStatus(c, token, "failed", push.ReasonChannelDisabled)
	}
	m := b.settled(c.msg.ID)
	require.Equal(t, StateDispatched, m.State)
	require.EqualValues(t, 3, m.AcceptedCount)
	require.EqualValues(t, 2, m.FailedCount)
}

func TestFanOutParksAProviderWhoseBreakerIsOpen(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name               string
		cooldown, lifetime time.Duration
		// snoozeFor is how long after the attempt the chunk should wake.
		snoozeFor time.Duration
	}{
		{"until the breaker lets a probe through", time.Minute, time.Hour, time.Minute},
		{"never past the chunk's expiry", time.Hour, 10 * time.Minute, 10 * time.Minute},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setupFanOut(t)
			breakers := openBreakers(tc.cooldown)
			breakers.For(ChannelAPNs, "").Failure("503 from APNs")
			require.Equal(t, BreakerOpen, breakers.For(ChannelAPNs, "").Status().State)
			c := b.message(b.devices("apns-1", "apns-2", "fcm-1"), b.clock.Now(), tc.lifetime)
			apns, fcm := &recordingSender{}, &recordingSender{}
			w := b.worker(map[string]Sender{ChannelAPNs: apns, ChannelFCM: fcm}, FanOutConfig{Breakers: breakers})

			attempted := time.Now()
			res := b.work(w, c)
			// The worker returned river.JobSnooze's *rivertype.JobSnoozeError,
			// which River records as a snooze with the job rescheduled.
			require.Equal(t, river.EventKindJobSnoozed, res.EventKind)
			// River adds the snooze to its own reading of the clock, a
			// moment after the worker's: hence the second's tolerance.
			require.WithinDuration(t, attempted.Add(tc.snoozeFor), res.Job.ScheduledAt, time.Second)
			require.False(t, res.Job.ScheduledAt.After(c.args.ExpiresAt.Add(time.Second)), "snoozed past the chunk's expiry")

			require.Empty(t, apns.sends(), "nothing is attempted while the breaker is open")
			require.Equal(t, []string{"fcm-1"}, fcm.sends())
			ledger := b.ledger(c.msg.ID)
			for _, token := range []string{"apns-1", "apns-2"} {
				b.requireStatus(c, token, "pending", push.ReasonNone)
				require.Zero(t, ledger[c.device(t, token)].AttemptedAt, "a parked delivery was never attempted")
			}
			b.requireStatus(c, "fcm-1", "accepted", push.ReasonNone)
			m := b.settled(c.msg.ID)
			require.Equal(t, StateDispatching, m.State)
			require.EqualValues(t, 2, m.PendingCount)
		})
	}
}

func TestFanOutTimeoutRecordsWhatWasSent(t *testing.T) {
	t.Parallel()
	tokens := []string{"fcm-1", "fcm-2", "fcm-3", "fcm-4"}

	// requireRecorded checks that the two answered sends are in the ledger
	// and the two unanswered ones still pending, never attempted.
	requireRecorded := func(t *testing.T, b *fanOutBundle, c chunkJob, fcm *recordingSender) {
		t.Helper()
		fcm.mu.Lock()
		require.False(t, fcm.hung, "the stalled send's context never ended")
		fcm.mu.Unlock()
		require.Equal(t, tokens[:2], fcm.sends())
		for _, token := range tokens[:2] {
			b.requireStatus(c, token, "accepted", push.ReasonNone)
		}
		ledger := b.ledger(c.msg.ID)
		for _, token := range tokens[2:] {
			b.requireStatus(c, token, "pending", push.ReasonNone)
			require.Zero(t, ledger[c.device(t, token)].AttemptedAt)
		}
		m := b.settled(c.msg.ID)
		require.Equal(t, StateDispatching, m.State)
		require.EqualValues(t, 2, m.AcceptedCount)
	}

	t.Run("the attempt's time runs out", func(t *testing.T) {
		t.Parallel()
		b := setupFanOut(t)
		c := b.dueNow(b.devices(tokens...))
		fcm := &recordingSender{stallAfter: 2}
		w := b.worker(map[string]Sender{ChannelFCM: fcm}, FanOutConfig{Timeout: 300 * time.Millisecond})

		res := b.work(w, c)
		// What was not sent waits for the chunk's next attempt.
		require.Equal(t, river.EventKindJobSnoozed, res.EventKind)
		requireRecorded(t, b, c, fcm)
	})

	// A worker stopping (River cancels the context of the jobs it runs)
	// must still write what was sent. rivertest's executor writes the job's
	// own outcome with the context it was given, so a cancelled one would
	// fail River's write rather than the worker's: this case calls Work
	// directly, with the chunk's real job.
	t.Run("the worker is stopped mid-send", func(t *testing.T) {
		t.Parallel()
		b := setupFanOut(t)
		c := b.dueNow(b.devices(tokens...))
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		fcm := &recordingSender{stallAfter: 2, stalled: cancel}
		w := b.worker(map[string]Sender{ChannelFCM: fcm}, FanOutConfig{})

		err := w.Work(ctx, &river.Job[FanOutArgs]{JobRow: c.job, Args: c.args})
		var snooze *rivertype.JobSnoozeError
		require.ErrorAs(t, err, &snooze, "not a snooze")
		// Handed back at once, for another worker: a stop is not a
		// provider's failure, to wait out or to tell the breaker of.
		require.Zero(t, snooze.Duration, "a stopped chunk waits for nothing")
		st, ok := w.Breakers().Status(ChannelFCM)
		require.True(t, ok)
		require.Equal(t, "closed", st.State)
		require.Zero(t, st.Failures, "the breaker heard of the stop")
		requireRecorded(t, b, c, fcm)
	})
}

func TestFanOutRetriedChunkSendsOnlyWhatIsPending(t *testing.T) {
	t.Parallel()
	b := setupFanOut(t)
	c := b.dueNow(b.devices("apns-1", "fcm-1", "fcm-2", "fcm-3"))
	apns := &recordingSender{}
	// fcm-2 is rate limited once, then accepted.
	fcm := &recordingSender{script: map[string][]push.Result{"fcm-2": {failing(push.ReasonRateLimited)}}}
	w := b.worker(map[string]Sender{ChannelAPNs: apns, ChannelFCM: fcm}, FanOutConfig{})

	res := b.work(w, c)
	require.Equal(t, river.EventKindJobSnoozed, res.EventKind, "a transient failure waits for the next attempt")
	require.Equal(t, []string{"apns-1"}, apns.sends())
	require.Equal(t, []string{"fcm-1", "fcm-2", "fcm-3"}, fcm.sends())
	b.requireStatus(c, "fcm-2", "pending", push.ReasonRateLimited)
	require.Equal(t, StateDispatching, b.settled(c.msg.ID).State)

	res = b.work(w, c)
	require.Equal(t, river.EventKindJobCompleted, res.EventKind)
	require.Empty(t, apns.sends(), "a settled delivery is not sent again")
	require.Equal(t, []string{"fcm-2"}, fcm.sends(), "only the pending delivery is sent again")
	for _, token := range []string{"apns-1", "fcm-1", "fcm-2", "fcm-3"} {
		b.requireStatus(c, token, "accepted", push.ReasonNone)
	}
	m := b.settled(c.msg.ID)
	require.Equal(t, StateDispatched, m.State)
	require.EqualValues(t, 4, m.AcceptedCount)
}

func TestFanOutParksOnlyTheWebPushHostWhoseBreakerIsOpen(t *testing.T) {
	t.Parallel()
	b := setupFanOut(t)
	up := []string{"https://push-a.example/w/1", "https://push-a.example/w/2"}
	down := []string{"https://push-b.example/w/1", "https://push-b.example/w/2"}
	c := b.dueNow(b.devices(append(slices.Clone(up), down...)...))
	breakers := openBreakers(time.Minute)
	breakers.For(ChannelWebPush, down[0]).Failure("503 from push-b")
	web := &recordingSender{}
	w := b.worker(map[string]Sender{ChannelWebPush: web}, FanOutConfig{Breakers: breakers})

	res := b.work(w, c)
	require.Equal(t, river.EventKindJobSnoozed, res.EventKind)
	require.Equal(t, up, web.sends(), "only the healthy host's endpoints are sent to")
	for _, token := range up {
		b.requireStatus(c, token, "accepted", push.ReasonNone)
	}
	for _, token := range down {
		b.requireStatus(c, token, "pending", push.ReasonNone)
	}
	require.EqualValues(t, 2, b.settled(c.msg.ID).PendingCount)
}

func TestFanOutEvictsDeadTokens(t *testing.T) {
	t.Parallel()
	b := setupFanOut(t)
	ctx := context.Background()
	c := b.dueNow(b.devices("apns-1", "apns-2", "fcm-1", "fcm-2", "https://push.example/w/1"))
	apns := &recordingSender{script: map[string][]push.Result{"apns-2": {failing(push.ReasonUnregistered)}}}
	fcm := &recordingSender{script: map[string][]push.Result{
		"fcm-1": {failing(push.ReasonBadToken)},
		"fcm-2": {failing(push.ReasonPayloadRejected)},
	}}
	w := b.worker(map[string]Sender{ChannelAPNs: apns, ChannelFCM: fcm, ChannelWebPush: &recordingSender{}}, FanOutConfig{})

	res := b.work(w, c)
	require.Equal(t, river.EventKindJobCompleted, res.EventKind)
	b.requireStatus(c, "apns-2", "failed", push.ReasonUnregistered)
	b.requireStatus(c, "fcm-1", "failed", push.ReasonBadToken)
	b.requireStatus(c, "fcm-2", "failed", push.ReasonPayloadRejected)
	for token, evicted := range map[string]push.Reason{
		"apns-1": "", "apns-2": push.ReasonUnregistered, "fcm-1": push.ReasonBadToken,
		"fcm-2": "", "https://push.example/w/1": "",
	} {
		d, err := b.q.GetDevice(ctx, c.device(t, token))
		require.NoError(t, err)
		if evicted == "" {
			require.Equal(t, "active", d.Status, "%s: only a dead token is evicted", token)
			continue
		}
		require.Equal(t, "evicted", d.Status, token)
		require.Equal(t, string(evicted), *d.EvictedReason, token)
	}
	m := b.settled(c.msg.ID)
	require.Equal(t, StateDispatched, m.State)
	require.EqualValues(t, 2, m.AcceptedCount)
	require.EqualValues(t, 3, m.FailedCount)
}

// TestFanOutKeepsItsAnswersThroughADatabaseOutage takes the database away
// from the worker once the chunk has begun, before any answer is written,
// and gives it back within the chunk's timeout: the chunk keeps what it
// sent and writes it once the database is back, so nothing is sent twice,
// and no provider's breaker hears of the database.
func TestFanOutKeepsItsAnswersThroughADatabaseOutage(t *testing.T) {
	t.Parallel()
	b := setupFanOut(t)
	tokens := []string{"apns-1", "fcm-1", "fcm-2"}
	c := b.dueNow(b.devices(tokens...))
	proxy := dbtest.NewProxy(t, b.db.URL)
	pool, err := db.Open(context.Background(), proxy.URL, db.PoolConfig{MaxConns: 4})
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	var outage sync.Once
	down := func() {
		outage.Do(func() {
			proxy.Down()
			time.AfterFunc(time.Second, proxy.Up)
		})
	}
	apns, fcm := &recordingSender{sending: down}, &recordingSender{sending: down}
	breakers := NewBreakers(BreakerConfig{Threshold: 1}, Channels...)
	providers := map[string]Sender{ChannelAPNs: apns, ChannelFCM: fcm}
	w := NewFanOutWorker(FanOutConfig{Pool: pool, Logger: discard, Clock: b.clock, Breakers: breakers,
		Lanes: []Lane{{Queue: QueueUrgent, Providers: providers}, {Queue: QueueBulk, Providers: providers}}})

	res := b.work(w, c)
	require.Equal(t, river.EventKindJobCompleted, res.EventKind)
	require.Equal(t, []string{"apns-1"}, apns.sends())
	require.Equal(t, []string{"fcm-1", "fcm-2"}, fcm.sends())
	for _, token := range tokens {
		b.requireStatus(c, token, "accepted", push.ReasonNone)
	}
	require.Equal(t, StateDispatched, b.settled(c.msg.ID).State)
	for _, channel := range []string{ChannelAPNs, ChannelFCM} {
		st, _ := breakers.Status(channel)
		require.Equal(t, BreakerClosed, st.State, channel)
		require.Zero(t, st.Failures, "%s: a database fault counted against the provider", channel)
	}
}

// TestFanOutRecordsEachAnswerAsItComes checks the crash window: the answers
// of a slice still sending are in the ledger within moments, not when the
// slice or the chunk is done, so a process that dies resends little.
func TestFanOutRecordsEachAnswerAsItComes(t *testing.T) {
	t.Parallel()
	b := setupFanOut(t)
	tokens := []string{"fcm-1", "fcm-2", "fcm-3", "fcm-4"}
	c := b.dueNow(b.devices(tokens...))
	var recorded bool
	fcm := &recordingSender{stallAfter: 2}
	fcm.stalled = func() {
		// The first two answers are in; the slice waits for the rest.
		recorded = assert.Eventually(t, func() bool { //nolint:forbidigo // on the sender's goroutine, where require cannot stop the test
			ledger := b.ledger(c.msg.ID)
			return ledger[c.device(t, "fcm-1")].Status == "accepted" && ledger[c.device(t, "fcm-2")].Status == "accepted"
		}, 5*time.Second, 5*time.Millisecond, "answers wait for their slice to be written")
	}
	w := b.worker(map[string]Sender{ChannelFCM: fcm}, FanOutConfig{Timeout: 8 * time.Second})
	res := b.work(w, c)
	require.True(t, recorded)
	require.Equal(t, river.EventKindJobSnoozed, res.EventKind)
	b.requireStatus(c, "fcm-3", "pending", push.ReasonNone)
}

// testLease is a process's liveness as a test sets it (FanOutConfig.Lease).
type testLease struct {
	held    atomic.Bool
	session atomic.Uint64
}

func (l *testLease) Held() bool      { return l.held.Load() }
func (l *testLease) Session() uint64 { return l.session.Load() }

// TestFanOutStopsWhenItsSessionChanges: a chunk that began under one
// liveness session sends nothing more once the process holds its lock
// under another (it lost the lock, and another worker may have taken the
// chunk meanwhile), though the lock is held again: the attempt ends as
// fenced, and its devices not yet sent stay pending for whoever has the
// chunk. Before, an attempt that had not asked while the lock was lost
// (blocked on the database, or on its turn at the provider) went on
// sending under the new session.
func TestFanOutStopsWhenItsSessionChanges(t *testing.T) {
	t.Parallel()
	b := setupFanOut(t)
	users := b.devices("apns-1", "apns-2", "apns-3")
	c := b.dueNow(users)
	lease := &testLease{}
	lease.held.Store(true)
	lease.session.Store(1)
	apns := &recordingSender{}
	// The lock is lost and taken again, under a new session, once the
	// first push is answered.
	sender := senderFunc(func(ctx context.Context, m *push.Message, targets []push.Target, results []push.Result, allow func() bool, answered func(int)) {
		apns.Send(ctx, m, targets, results, func() bool {
			if len(apns.sent) == 1 {
				lease.session.Store(2)
			}
			return allow()
		}, answered)
	})
	w := b.worker(map[string]Sender{ChannelAPNs: sender}, FanOutConfig{Lease: lease})
	b.work(w, c)
	require.Len(t, apns.sends(), 1, "nothing was sent under the new session")
	pending := 0
	for _, d := range b.ledger(c.msg.ID) {
		if d.Status == "pending" {
			pending++
		}
	}
	require.Equal(t, 2, pending, "the devices not sent stay pending for whoever has the chunk")
}

// TestFanOutWritesAgainWhatAFailoverLost: a write the primary acknowledged
// and its standby never received is gone once the standby is promoted, and
// the chunk that made it goes on with the new primary. Its process loses
// its liveness lock with the old primary, so the chunk ends as fenced, and
// its close writes every answer it had again: the device answered before
// the failover is accepted, not left pending for the chunk's retry to send
// it twice (or, had the chunk finished, pending for good under a completed
// job). Before, a chunk's close wrote only what it had not written yet.
func TestFanOutWritesAgainWhatAFailoverLost(t *testing.T) {
	t.Parallel()
	b := setupFanOut(t)
	c := b.dueNow(b.devices("apns-1", "apns-2", "apns-3"))
	lease := &testLease{}
	lease.held.Store(true)
	lease.session.Store(1)
	apns := &recordingSender{}
	var failedOver bool
	sender := senderFunc(func(ctx context.Context, m *push.Message, targets []push.Target, results []push.Result, allow func() bool, answered func(int)) {
		apns.Send(ctx, m, targets, results, func() bool {
			if len(apns.sent) == 1 && !failedOver {
				failedOver = true
				// The first answer is written; then the primary fails
				// over to a standby that never got that write, and the
				// lock is taken again on the new primary.
				failedOver = b.loseFirstAnswer(t, c, "apns-1")
				lease.session.Store(2)
			}
			return allow()
		}, answered)
	})
	w := b.worker(map[string]Sender{ChannelAPNs: sender}, FanOutConfig{Lease: lease})
	b.work(w, c)
	require.True(t, failedOver)
	require.Equal(t, []string{"apns-1"}, apns.sends(), "nothing was sent under the new session")
	b.requireStatus(c, "apns-1", "accepted", push.ReasonNone)
	b.requireStatus(c, "apns-2", "pending", push.ReasonNone)
}

// loseFirstAnswer waits until the first answer, the named device's
// acceptance, is written, then takes it out of the ledger as a database
// that lost it would have it: the delivery pending again, whether it was
// written as a row or as a run (migration 0028: the first answer's run
// holds it alone). It runs on the sender's goroutine, where require cannot
// stop the test, and says whether it did it.
func (b *fanOutBundle) loseFirstAnswer(t *testing.T, c chunkJob, name string) bool {
	ctx := context.Background()
	device := c.device(t, name)
	written := assert.Eventually(t, func() bool { //nolint:forbidigo // on the sender's goroutine
		return b.ledger(c.msg.ID)[device].Status == "accepted"
	}, 5*time.Second, 5*time.Millisecond, "the first answer was not written")
	tag, err := b.db.Pool.Exec(ctx, `
		WITH run AS (DELETE FROM accepted_runs WHERE message_id = $1 AND devices = ARRAY[$2::bigint] RETURNING 1),
		row AS (UPDATE deliveries SET status = 'pending', attempt = attempt - 1, attempted_at = NULL, accepted_at = NULL
		        WHERE message_id = $1 AND device_id = $2 RETURNING 1)
		SELECT * FROM run UNION ALL SELECT * FROM row`, c.msg.ID, device)
	assert.NoError(t, err)                        //nolint:forbidigo,testifylint // on the sender's goroutine
	assert.Equal(t, int64(1), tag.RowsAffected()) //nolint:forbidigo // on the sender's goroutine
	_, err = b.db.Pool.Exec(ctx, `UPDATE messages SET pending_count = pending_count + 1, accepted_count = accepted_count - 1 WHERE id = $1`, c.msg.ID)
	assert.NoError(t, err) //nolint:forbidigo // on the sender's goroutine
	return written
}

// TestFanOutWritesAgainWhatACrashLost: as TestFanOutWritesAgainWhatAFailoverLost,
// for a database that went away and came back within the chunk (a crash
// and restart, a failover quicker than the liveness lock notices): a write
// that failed meanwhile tells the writer that what it wrote before may be
// gone, so the chunk's close writes every answer again, and the chunk,
// which completes, leaves no delivery pending under it.
func TestFanOutWritesAgainWhatACrashLost(t *testing.T) {
	t.Parallel()
	b := setupFanOut(t)
	c := b.dueNow(b.devices("apns-1", "apns-2", "apns-3"))
	proxy := dbtest.NewProxy(t, b.db.URL)
	pool, err := db.Open(context.Background(), proxy.URL, db.PoolConfig{MaxConns: 4})
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	apns := &recordingSender{}
	var crashed bool
	sender := senderFunc(func(ctx context.Context, m *push.Message, targets []push.Target, results []push.Result, allow func() bool, answered func(int)) {
		apns.Send(ctx, m, targets, results, func() bool {
			if len(apns.sent) == 1 && !crashed {
				// The first answer is written, then lost with the
				// server, which is away for a second.
				crashed = b.loseFirstAnswer(t, c, "apns-1")
				proxy.Down()
				time.AfterFunc(time.Second, proxy.Up)
			}
			return allow()
		}, answered)
	})
	providers := map[string]Sender{ChannelAPNs: sender}
	w := NewFanOutWorker(FanOutConfig{Pool: pool, Logger: discard, Clock: b.clock,
		Lanes: []Lane{{Queue: QueueUrgent, Providers: providers}, {Queue: QueueBulk, Providers: providers}}})
	res := b.work(w, c)
	require.True(t, crashed)
	require.Equal(t, river.EventKindJobCompleted, res.EventKind)
	require.Equal(t, []string{"apns-1", "apns-2", "apns-3"}, apns.sends())
	for _, token := range []string{"apns-1", "apns-2", "apns-3"} {
		b.requireStatus(c, token, "accepted", push.ReasonNone)
	}
	require.Equal(t, StateDispatched, b.settled(c.msg.ID).State)
}

// senderFunc is a Sender made of a function.
type senderFunc func(ctx context.Context, m *push.Message, targets []push.Target, results []push.Result, allow func() bool, answered func(int))

func (f senderFunc) Send(ctx context.Context, m *push.Message, targets []push.Target, results []push.Result, allow func() bool, answered func(int)) {
	f(ctx, m, targets, results, allow, answered)
}

// workOfKind works job, a chunk job of SnapshotKind or RunsKind, with w, as
// River would in tx.
func workOfKind(ctx context.Context, t testing.TB, tx pgx.Tx, w *FanOutWorker, job *rivertype.JobRow) (*rivertest.WorkResult, error) {
	t.Helper()
	if job.Kind == RunsKind {
		tw := rivertest.NewWorker(t, riverpgxv5.New(nil), &river.Config{Logger: discard}, river.Worker[RunsArgs](runsWorker(w)))
		return tw.WorkJob(ctx, t, tx, job)
	}
	tw := rivertest.NewWorker(t, riverpgxv5.New(nil), &river.Config{Logger: discard}, river.Worker[SnapshotArgs](snapshotWorker(w)))
	return tw.WorkJob(ctx, t, tx, job)
}
