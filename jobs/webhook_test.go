package jobs

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"
	"github.com/stretchr/testify/require"

	"github.com/heraldpush/herald/db"
	"github.com/heraldpush/herald/db/dbtest"
	"github.com/heraldpush/herald/jobs/webhook"
)

type webhookBundle struct {
	t          *testing.T
	pool       *pgxpool.Pool
	dispatcher *WebhookDispatcher
	webhookID  int64
}

// setupWebhooks makes a database with one webhook that wants failures, to
// url, and a dispatcher on it that holds no part-batch back.
func setupWebhooks(t *testing.T, url string) *webhookBundle {
	t.Helper()
	tdb := dbtest.New(t)
	client, err := NewRiverClient(tdb.Pool, RiverConfig{Logger: discard})
	require.NoError(t, err)
	d, err := NewWebhookDispatcher(&WebhookDispatcherConfig{Pool: tdb.Pool, Logger: discard, River: client, Hold: time.Nanosecond})
	require.NoError(t, err)
	w, err := db.On(tdb.Pool).CreateWebhook(context.Background(), db.CreateWebhookParams{
		Url: url, Events: []string{EventDeliveryFailed}, Secret: webhook.NewSecret(), MaxWebhooks: 10,
	})
	require.NoError(t, err)
	return &webhookBundle{t: t, pool: tdb.Pool, dispatcher: d, webhookID: w.ID}
}

// addEvents writes n failures of message msg to the outbox, on dbtx, as
// the ledger writes them.
func (b *webhookBundle) addEvents(dbtx db.DBTX, msg int64, n int) {
	b.t.Helper()
	_, err := dbtx.Exec(context.Background(), `
		INSERT INTO webhook_events (webhook_id, message_id, type, device_id, user_id, reason, at)
		SELECT $1, $2, 'delivery.failed', g, 'u' || g, 'unregistered', now() FROM generate_series(1, $3::int) g`,
		b.webhookID, msg, n)
	require.NoError(b.t, err)
}

// jobs are the batch jobs inserted, by batch id.
func (b *webhookBundle) jobs() map[int64]WebhookArgs {
	b.t.Helper()
	rows, err := b.pool.Query(context.Background(), "SELECT (args->>'batch_id')::bigint, (args->>'webhook_id')::bigint, (args->>'events')::int, (args->>'message_id')::bigint, queue FROM river_job WHERE kind = $1", WebhookKind)
	require.NoError(b.t, err)
	defer rows.Close()
	out := map[int64]WebhookArgs{}
	for rows.Next() {
		var a WebhookArgs
		var queue string
		require.NoError(b.t, rows.Scan(&a.BatchID, &a.WebhookID, &a.Events, &a.MessageID, &queue))
		require.Equal(b.t, QueueWebhooks, queue)
		out[a.BatchID] = a
	}
	require.NoError(b.t, rows.Err())
	return out
}

// TestWebhookDispatchTakesLateCommits: events are claimed by what is
// unclaimed, not by an id cursor, so the events of a transaction that drew
// its ids first and committed last are dispatched too.
func TestWebhookDispatchTakesLateCommits(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setupWebhooks(t, "https://hooks.example.com/")
	late, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = late.Rollback(ctx) }()
	b.addEvents(late, 1, 3) // the lower ids, not committed yet
	b.addEvents(b.pool, 2, 2)
	n, err := b.dispatcher.Dispatch(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.NoError(t, late.Commit(ctx))
	n, err = b.dispatcher.Dispatch(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, n, "the late transaction's events")
	byMessage := map[int64]int{}
	for _, a := range b.jobs() {
		byMessage[a.MessageID] += a.Events
	}
	require.Equal(t, map[int64]int{1: 3, 2: 2}, byMessage)
}

// TestWebhookDispatchersShareNothing: dispatchers of several processes at
// once put each event in exactly one batch of at most WebhookBatchSize,
// each batch of one message, and each batch has its job.
func TestWebhookDispatchersShareNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setupWebhooks(t, "https://hooks.example.com/")
	for msg := int64(1); msg <= 3; msg++ {
		b.addEvents(b.pool, msg, 2500)
	}
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			_, err := b.dispatcher.Dispatch(ctx)
			require.NoError(t, err)
		})
	}
	wg.Wait()
	rows, err := b.pool.Query(ctx, "SELECT batch_id, count(*), count(DISTINCT message_id) FROM webhook_events GROUP BY batch_id")
	require.NoError(t, err)
	defer rows.Close()
	jobs := b.jobs()
	total, batches := 0, 0
	for rows.Next() {
		var batch *int64
		var n, messages int
		require.NoError(t, rows.Scan(&batch, &n, &messages))
		require.NotNil(t, batch, "an event left unclaimed")
		require.Equal(t, 1, messages)
		require.LessOrEqual(t, n, WebhookBatchSize)
		require.Equal(t, n, jobs[*batch].Events, "batch %d's job", *batch)
		total += n
		batches++
	}
	require.NoError(t, rows.Err())
	require.Equal(t, 7500, total)
	require.Len(t, jobs, batches, "a job for each batch, and none without one")
	// Three batches of each message's 2,500 events at the fewest; two
	// dispatchers may each claim part of one message's events (each skips
	// the rows the other has locked), which makes a batch more.
	require.GreaterOrEqual(t, batches, 9)
}

// TestWebhookWorker: a 2xx delivers a batch and deletes its events; any
// other answer is retried with doubling waits; a batch failing a day after
// its first attempt is given up (cancelled, its events kept for a retry
// from River UI); a deleted webhook's batch is dropped.
func TestWebhookWorker(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var status atomic.Int32
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		w.WriteHeader(int(status.Load()))
	}))
	t.Cleanup(srv.Close)
	b := setupWebhooks(t, srv.URL+"/hook")
	policy, err := webhook.NewPolicy([]string{"127.0.0.1"})
	require.NoError(t, err)
	w, err := NewWebhookWorker(WebhookConfig{Pool: b.pool, Logger: discard, Policy: policy, RetryFirst: time.Second, RetryMax: 8 * time.Second})
	require.NoError(t, err)
	b.addEvents(b.pool, 1, 5)
	_, err = b.dispatcher.Dispatch(ctx)
	require.NoError(t, err)
	var args WebhookArgs
	for _, a := range b.jobs() {
		args = a
	}
	job := func(attempt int, age time.Duration) *river.Job[WebhookArgs] {
		return &river.Job[WebhookArgs]{Args: args, JobRow: &rivertype.JobRow{Attempt: attempt, MaxAttempts: webhookMaxAttempts, CreatedAt: time.Now().Add(-age)}}
	}
	left := func() int {
		var n int
		require.NoError(t, b.pool.QueryRow(ctx, "SELECT count(*) FROM webhook_events WHERE batch_id = $1", args.BatchID).Scan(&n))
		return n
	}

	status.Store(http.StatusServiceUnavailable)
	err = w.Work(ctx, job(1, 0))
	require.ErrorContains(t, err, "answered 503")
	var cancel *river.JobCancelError
	require.NotErrorAs(t, err, &cancel)
	require.Equal(t, 5, left())
	for attempt, wait := range map[int]time.Duration{1: time.Second, 2: 2 * time.Second, 4: 8 * time.Second, 9: 8 * time.Second} {
		require.WithinDuration(t, time.Now().Add(wait), w.NextRetry(job(attempt, 0)), 100*time.Millisecond, "attempt %d", attempt)
	}

	err = w.Work(ctx, job(20, DefaultWebhookGiveUp))
	require.ErrorAs(t, err, &cancel, "given up a day after its first attempt")
	require.Equal(t, 5, left(), "kept for a retry from River UI")
	err = w.Work(ctx, job(webhookMaxAttempts, 0))
	require.ErrorContains(t, err, "answered 503")
	require.NotErrorAs(t, err, &cancel, "its last attempt: River discards it")
	require.Equal(t, 5, left(), "kept for a retry from River UI")

	status.Store(http.StatusNoContent)
	require.NoError(t, w.Work(ctx, job(webhookMaxAttempts+1, DefaultWebhookGiveUp)), "retried by hand")
	require.Zero(t, left())
	require.EqualValues(t, 4, calls.Load())

	b.addEvents(b.pool, 2, 1)
	_, err = b.dispatcher.Dispatch(ctx)
	require.NoError(t, err)
	for _, a := range b.jobs() {
		if a.MessageID == 2 {
			args = a
		}
	}
	_, err = db.On(b.pool).DeleteWebhook(ctx, b.webhookID)
	require.NoError(t, err)
	require.NoError(t, w.Work(ctx, job(1, 0)))
	require.EqualValues(t, 4, calls.Load(), "a deleted webhook is not called")
	require.Zero(t, left())
}

// TestWebhookAttemptsFillADay: River's bound on a batch's attempts gives
// up about a day after the first, on the default waits.
func TestWebhookAttemptsFillADay(t *testing.T) {
	t.Parallel()
	w := &WebhookWorker{cfg: WebhookConfig{}}
	w.cfg.withDefaults()
	var total time.Duration
	for attempt := 1; attempt < webhookMaxAttempts; attempt++ {
		total += w.retryWait(attempt)
	}
	require.LessOrEqual(t, total, DefaultWebhookGiveUp)
	require.Greater(t, total+w.retryWait(webhookMaxAttempts), DefaultWebhookGiveUp)
	require.Greater(t, total, 22*time.Hour)
	require.Equal(t, 33, webhookMaxAttempts)
}

// TestWebhookTypes: the process's reading of what the webhooks want
// follows them.
func TestWebhookTypes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tdb := dbtest.New(t)
	types := NewWebhookTypes(tdb.Pool, discard)
	require.NoError(t, types.Refresh(ctx))
	require.False(t, types.WantsFailures())
	q := db.On(tdb.Pool)
	w, err := q.CreateWebhook(ctx, db.CreateWebhookParams{Url: "https://h.example.com/", Events: []string{EventMessageSettled}, Secret: webhook.NewSecret(), MaxWebhooks: 10})
	require.NoError(t, err)
	require.NoError(t, types.Refresh(ctx))
	require.False(t, types.WantsFailures())
	_, err = q.CreateWebhook(ctx, db.CreateWebhookParams{Url: "https://h.example.com/", Events: []string{EventDeliveryFailed}, Secret: webhook.NewSecret(), MaxWebhooks: 10})
	require.NoError(t, err)
	require.NoError(t, types.Refresh(ctx))
	require.True(t, types.WantsFailures())
	_, err = q.DeleteWebhook(ctx, w.ID+1)
	require.NoError(t, err)
	require.NoError(t, types.Refresh(ctx))
	require.False(t, types.WantsFailures())
	var nilTypes *WebhookTypes
	require.False(t, nilTypes.WantsFailures())
}
