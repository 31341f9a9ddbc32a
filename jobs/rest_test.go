package jobs

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"
	"github.com/stretchr/testify/require"

	"github.com/heraldpush/herald/db"
	"github.com/heraldpush/herald/db/dbtest"
	"github.com/heraldpush/herald/jobs/push"
)

// chunkRecorder is a chunk worker that records which chunks it was given,
// and how many of their deliveries the ledger held then.
type chunkRecorder struct {
	river.WorkerDefaults[FanOutArgs]
	pool   *pgxpool.Pool
	mu     sync.Mutex
	ledger map[int]int // chunk -> the message's ledger rows when it started
}

func (r *chunkRecorder) Work(ctx context.Context, job *river.Job[FanOutArgs]) error {
	var rows int
	if err := r.pool.QueryRow(ctx, `SELECT count(*) FROM ledger WHERE message_id = $1`, job.Args.MessageID).Scan(&rows); err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ledger[job.Args.Chunk] = rows
	return nil
}

func (r *chunkRecorder) started(chunk int) (int, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	n, ok := r.ledger[chunk]
	return n, ok
}

// restPopulation registers n users with a device each, and gives the first
// user a second device, registered last: it falls in the rest, its user in
// the first chunk, and is still one recipient.
func restPopulation(t *testing.T, q *db.Queries, n int) []string {
	t.Helper()
	users := registerUsers(t, q, "r", n)
	_, err := q.RegisterDevices(context.Background(), db.RegisterDevicesParams{
		UserIds: []string{users[0]}, Channels: []string{"fcm"}, Tokens: []string{"tok-second"},
		P256dhs: []string{""}, Auths: []string{""},
	})
	require.NoError(t, err)
	return users
}

func nowMessage(users []string) Message {
	return Message{Priority: PriorityBulk, Audience: Audience{UserIDs: users}, Payload: push.Content{Title: "now"}}
}

// TestSubmitSendsTheFirstChunkWhileTheRestIsWritten: a message sent now
// commits its first chunk before the rest of its ledger is written, so the
// chunk's worker starts it with only its own deliveries in the ledger
// (the rest's writer is held back here by holding the message's rest
// lock); the answer waits for the rest and counts the whole audience; and
// the ledger ends as one transaction writes it: the same chunks, every
// device once.
func TestSubmitSendsTheFirstChunkWhileTheRestIsWritten(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	tdb := dbtest.New(t)
	q := db.On(tdb.Pool)
	users := restPopulation(t, q, 1100)

	rec := &chunkRecorder{pool: tdb.Pool, ledger: map[int]int{}}
	cfg := RiverConfig{Logger: discard, Workers: river.NewWorkers()}
	AddChunkWorkers(cfg.Workers, rec)
	river.AddWorker(cfg.Workers, &RestWorker{pool: tdb.Pool, chunkSize: 500})
	client, err := NewRiverClient(tdb.Pool, cfg)
	require.NoError(t, err)
	require.NoError(t, client.Start(ctx))
	t.Cleanup(func() { _ = client.Stop(context.Background()) })
	enq := NewEnqueuer(client, 500)

	// The next message's rest lock, held.
	var next int64
	require.NoError(t, tdb.Pool.QueryRow(ctx,
		`SELECT coalesce(pg_sequence_last_value(pg_get_serial_sequence('messages', 'id')) + 1, 1)`).Scan(&next))
	hold, err := tdb.Pool.Begin(ctx)
	require.NoError(t, err)
	defer hold.Rollback(ctx) //nolint:errcheck
	require.NoError(t, db.On(hold).LockMessageRest(ctx, next))

	answered := make(chan Receipt, 1)
	go func() {
		r, err := enq.Submit(ctx, tdb.Pool, nowMessage(users), "test")
		if err != nil {
			t.Error(err)
		}
		answered <- r
	}()
	var rows int
	require.Eventually(t, func() bool {
		var ok bool
		rows, ok = rec.started(0)
		return ok
	}, 10*time.Second, 5*time.Millisecond, "the first chunk never started while the rest waited")
	require.Equal(t, firstChunkSize, rows, "the first chunk started with its own deliveries alone in the ledger")
	m, err := q.GetMessage(ctx, next)
	require.NoError(t, err)
	require.NotNil(t, m.RestAfter, "the rest is still to be written")
	select {
	case <-answered:
		t.Fatal("answered before the rest was written")
	case <-time.After(50 * time.Millisecond):
	}

	require.NoError(t, hold.Rollback(ctx))
	receipt := <-answered
	require.Equal(t, push.FormatMessageID(next), receipt.MessageID)
	require.EqualValues(t, 1100, receipt.RecipientCount, "a user with devices in the first chunk and the rest is one recipient")
	require.EqualValues(t, 1101, receipt.DeviceCount)
	require.EqualValues(t, 4, receipt.ChunkCount)
	m, err = q.GetMessage(ctx, next)
	require.NoError(t, err)
	require.Nil(t, m.RestAfter)
	require.Equal(t, [4]int32{1100, 1101, 4, 1101}, [4]int32{m.RecipientCount, m.DeviceCount, m.ChunkCount, m.PendingCount + m.AcceptedCount})
	require.Equal(t, []int{firstChunkSize, 500, 500, 51}, chunkSizes(t, tdb.Pool, next), "the chunks one transaction cuts")
	jobs, err := q.MessageChunkJobs(ctx, next)
	require.NoError(t, err)
	require.Len(t, jobs, 4, "every chunk has its job")
	for chunk := 1; chunk < 4; chunk++ {
		require.Eventually(t, func() bool { _, ok := rec.started(chunk); return ok }, 10*time.Second, 5*time.Millisecond)
	}
	backstops, err := client.JobList(ctx, river.NewJobListParams().Kinds(RestKind))
	require.NoError(t, err)
	require.Empty(t, backstops.Jobs, "the backstop job went with the rest")
}

// commitFirst runs the first of Submit's two transactions alone, as a
// request that dies before its second does.
func commitFirst(t *testing.T, pool *pgxpool.Pool, enq *Enqueuer, m Message, scope string) (Receipt, restJob) {
	t.Helper()
	var (
		receipt Receipt
		rest    *restJob
	)
	require.NoError(t, db.InTx(context.Background(), pool, func(tx pgx.Tx) error {
		var err error
		receipt, rest, err = enq.schedule(context.Background(), tx, m, scope, true)
		return err
	}))
	require.NotNil(t, rest, "a message sent now to more than a chunk is written in two")
	return receipt, *rest
}

// TestRestWrittenWhenTheRequestDies: a request that committed its first
// chunk and died leaves a message that cannot settle, and a backstop job;
// the job (and, failing it, the reconciler) writes the rest, and the
// message ends as if the request had lived.
func TestRestWrittenWhenTheRequestDies(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tdb := dbtest.New(t)
	q := db.On(tdb.Pool)
	users := restPopulation(t, q, 700)
	client, err := NewRiverClient(tdb.Pool, RiverConfig{Logger: discard})
	require.NoError(t, err)
	enq := NewEnqueuer(client, 500)

	receipt, rest := commitFirst(t, tdb.Pool, enq, nowMessage(users), "test")
	require.EqualValues(t, firstChunkSize, receipt.DeviceCount)
	id := rest.messageID
	backstop, err := client.JobGet(ctx, rest.backstopID)
	require.NoError(t, err)
	require.Equal(t, RestKind, backstop.Kind)
	require.Equal(t, rivertype.JobStateScheduled, backstop.State)
	require.WithinDuration(t, time.Now().Add(restBackstop), backstop.ScheduledAt, restBackstop)

	// Its first chunk all settled, the message still does not settle.
	_, err = tdb.Pool.Exec(ctx, `UPDATE messages SET pending_count = 0, accepted_count = pending_count WHERE id = $1`, id)
	require.NoError(t, err)
	_, err = q.SettleMessage(ctx, id)
	require.ErrorIs(t, err, db.ErrNotFound, "a message whose rest is to be written does not settle")
	_, err = tdb.Pool.Exec(ctx, `UPDATE messages SET pending_count = accepted_count, accepted_count = 0 WHERE id = $1`, id)
	require.NoError(t, err)

	// The backstop's work.
	require.NoError(t, completeRest(ctx, tdb.Pool, enq, id))
	m, err := q.GetMessage(ctx, id)
	require.NoError(t, err)
	require.Nil(t, m.RestAfter)
	require.Equal(t, [4]int32{700, 701, 3, 701}, [4]int32{m.RecipientCount, m.DeviceCount, m.ChunkCount, m.PendingCount})
	require.Equal(t, []int{firstChunkSize, 500, 151}, chunkSizes(t, tdb.Pool, id))
	require.NoError(t, completeRest(ctx, tdb.Pool, enq, id), "a second writer finds the rest written")
	require.Equal(t, []int{firstChunkSize, 500, 151}, chunkSizes(t, tdb.Pool, id))

	// The reconciler writes a rest that waited past staleRest, and leaves
	// a fresh one to its request.
	_, rest = commitFirst(t, tdb.Pool, enq, nowMessage(users), "test")
	stale := rest.messageID
	_, rest = commitFirst(t, tdb.Pool, enq, nowMessage(users), "test")
	fresh := rest.messageID
	_, err = tdb.Pool.Exec(ctx, `UPDATE messages SET created_at = created_at - interval '2 minutes' WHERE id = $1`, stale)
	require.NoError(t, err)
	r, err := NewReconciler(&ReconcilerConfig{Pool: tdb.Pool, Logger: discard})
	require.NoError(t, err)
	require.NoError(t, r.completeRests(ctx, enq))
	for id, written := range map[int64]bool{stale: true, fresh: false} {
		m, err := q.GetMessage(ctx, id)
		require.NoError(t, err)
		require.Equal(t, written, m.RestAfter == nil, "message %d", id)
	}
}

// TestCancelAndRetryWaitForTheRest: a cancel or an idempotent retry that
// comes between a message's two transactions writes the rest first: the
// cancel cancels the whole audience and every chunk job, the retry answers
// the whole audience's counts, as the key's stored receipt then does.
func TestCancelAndRetryWaitForTheRest(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tdb := dbtest.New(t)
	q := db.On(tdb.Pool)
	users := restPopulation(t, q, 600)
	client, err := NewRiverClient(tdb.Pool, RiverConfig{Logger: discard})
	require.NoError(t, err)
	enq := NewEnqueuer(client, 500)

	_, rest := commitFirst(t, tdb.Pool, enq, nowMessage(users), "test")
	require.NoError(t, db.InTx(ctx, tdb.Pool, func(tx pgx.Tx) error {
		cancelled, err := enq.Cancel(ctx, tx, rest.messageID)
		require.True(t, cancelled)
		return err
	}))
	m, err := q.GetMessage(ctx, rest.messageID)
	require.NoError(t, err)
	require.Equal(t, StateCancelled, m.State)
	require.Equal(t, [3]int32{601, 601, 0}, [3]int32{m.DeviceCount, m.CancelledCount, m.PendingCount})
	jobIDs, err := q.MessageChunkJobs(ctx, rest.messageID)
	require.NoError(t, err)
	require.Len(t, jobIDs, 3)
	for _, jobID := range jobIDs {
		job, err := client.JobGet(ctx, jobID)
		require.NoError(t, err)
		require.Equal(t, rivertype.JobStateCancelled, job.State)
	}

	m2 := nowMessage(users)
	m2.IdempotencyKey = "k"
	first, rest := commitFirst(t, tdb.Pool, enq, m2, "test")
	require.EqualValues(t, firstChunkSize, first.DeviceCount)
	var again Receipt
	require.NoError(t, db.InTx(ctx, tdb.Pool, func(tx pgx.Tx) error {
		again, err = enq.Schedule(ctx, tx, m2, "test")
		return err
	}))
	require.Equal(t, first.MessageID, again.MessageID)
	require.Equal(t, [3]int32{600, 601, 3}, [3]int32{again.RecipientCount, again.DeviceCount, again.ChunkCount})
	var stored []byte
	require.NoError(t, tdb.Pool.QueryRow(ctx, `SELECT response FROM idempotency_keys WHERE key = 'k'`).Scan(&stored))
	var replayed Receipt
	require.NoError(t, json.Unmarshal(stored, &replayed))
	require.Equal(t, again, replayed, "the stored receipt counts the whole audience")
	require.Equal(t, []int{firstChunkSize, 500, 51}, chunkSizes(t, tdb.Pool, rest.messageID))
}

// TestSubmitWritesLaterMessagesWhole: a message due later, or to no more
// devices than its first chunk, is written in one transaction.
func TestSubmitWritesLaterMessagesWhole(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tdb := dbtest.New(t)
	q := db.On(tdb.Pool)
	users := registerUsers(t, q, "w", 120)
	client, err := NewRiverClient(tdb.Pool, RiverConfig{Logger: discard})
	require.NoError(t, err)
	enq := NewEnqueuer(client, 500)
	for _, m := range []Message{
		{Audience: Audience{UserIDs: users}, Payload: push.Content{Title: "later"}, DispatchAt: time.Now().Add(time.Minute)},
		{Audience: Audience{UserIDs: users[:firstChunkSize]}, Payload: push.Content{Title: "few"}},
	} {
		var rest *restJob
		require.NoError(t, db.InTx(ctx, tdb.Pool, func(tx pgx.Tx) error {
			_, rest, err = enq.schedule(ctx, tx, m, "test", true)
			return err
		}))
		require.Nil(t, rest, m.Payload.Title)
	}
	backstops, err := client.JobList(ctx, river.NewJobListParams().Kinds(RestKind))
	require.NoError(t, err)
	require.Empty(t, backstops.Jobs)
	require.Equal(t, []int{firstChunkSize, 70}, chunkSizes(t, tdb.Pool, 1))
	require.Equal(t, []int{firstChunkSize}, chunkSizes(t, tdb.Pool, 2))
}
