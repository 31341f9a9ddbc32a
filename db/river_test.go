package db_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivertest"
	"github.com/riverqueue/river/rivertype"
	"github.com/stretchr/testify/require"

	"github.com/heraldpush/herald/db"
	"github.com/heraldpush/herald/db/dbtest"
)

// These tests pin each of db/river.go's uses of River's own tables and
// notifications against the River this binary embeds, through River's
// public API on the other side: what Herald writes, River reads as it
// means it, and what Herald reads, River wrote.

type pinArgs struct{}

func (pinArgs) Kind() string { return "river_pin" }

// insertOnly is an insert-only River client on the test's database, in
// Herald's schema.
func insertOnly(t *testing.T, tdb *dbtest.DB) *river.Client[pgx.Tx] {
	t.Helper()
	c, err := river.NewClient(riverpgxv5.New(tdb.Pool), &river.Config{Schema: db.PoolSchema(tdb.Pool)})
	require.NoError(t, err)
	return c
}

// TestRiverInsertNotificationIsRivers: NotifyRiverInsert sends, on the same
// channel, the same payload River's own insert of an available job sends,
// which is what River's producers listen for.
func TestRiverInsertNotificationIsRivers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tdb := dbtest.New(t)
	schema := db.PoolSchema(tdb.Pool)
	conn, err := tdb.Pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	_, err = conn.Exec(ctx, "LISTEN "+pgx.Identifier{schema + ".river_insert"}.Sanitize())
	require.NoError(t, err)
	next := func() (string, string) {
		t.Helper()
		wait, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		n, err := conn.Conn().WaitForNotification(wait)
		require.NoError(t, err, "no notification on %s.river_insert", schema)
		return n.Channel, n.Payload
	}

	_, err = insertOnly(t, tdb).Insert(ctx, pinArgs{}, &river.InsertOpts{Queue: "bulk"})
	require.NoError(t, err)
	riversChannel, riversPayload := next()

	require.NoError(t, db.NotifyRiverInsert(ctx, tdb.Pool, schema, "bulk"))
	channel, payload := next()
	require.Equal(t, riversChannel, channel)
	require.JSONEq(t, riversPayload, payload)
}

// TestRiverJobsAsHeraldReadsAndWritesThem: a job River scheduled is counted
// in its queue's depth and listed as due; promoting it makes it available
// to River (as River reads it back) with its time kept; a completed run of a
// periodic kind is deleted, and River no longer has it.
func TestRiverJobsAsHeraldReadsAndWritesThem(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tdb := dbtest.New(t)
	client := insertOnly(t, tdb)
	at := time.Now().Add(30 * time.Second).UTC().Truncate(time.Microsecond)
	res, err := client.Insert(ctx, pinArgs{}, &river.InsertOpts{Queue: "bulk", ScheduledAt: at})
	require.NoError(t, err)
	require.Equal(t, rivertype.JobStateScheduled, res.Job.State)

	depth, err := db.RiverQueueDepth(ctx, tdb.Pool)
	require.NoError(t, err)
	require.Contains(t, depth, db.QueueDepth{Queue: "bulk", State: "scheduled", Jobs: 1})

	n, err := db.PromoteDueJobs(ctx, tdb.Pool, []string{"bulk"}, time.Minute, 10)
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	job, err := client.JobGet(ctx, res.Job.ID)
	require.NoError(t, err)
	require.Equal(t, rivertype.JobStateAvailable, job.State, "River reads the promoted job as available")
	require.True(t, job.ScheduledAt.Equal(at), "its time is kept: River's fetch still waits for it")
	due, err := db.UpcomingDue(ctx, tdb.Pool, []string{"bulk"}, time.Minute, 10)
	require.NoError(t, err)
	require.Len(t, due, 1)
	require.True(t, due[0].At.Equal(at))

	// A run River completed, as its completer marks one.
	done, err := client.Insert(ctx, pinArgs{}, nil)
	require.NoError(t, err)
	_, err = tdb.Pool.Exec(ctx, `UPDATE river_job SET state = 'completed', finalized_at = now(), attempt = 1, attempted_at = now() WHERE id = $1`, done.Job.ID)
	require.NoError(t, err)
	completed, err := client.JobGet(ctx, done.Job.ID)
	require.NoError(t, err)
	require.Equal(t, rivertype.JobStateCompleted, completed.State)
	require.NoError(t, db.DeleteCompletedRuns(ctx, tdb.Pool, pinArgs{}.Kind()))
	_, err = client.JobGet(ctx, done.Job.ID)
	require.ErrorIs(t, err, river.ErrNotFound)
	_, err = client.JobGet(ctx, res.Job.ID)
	require.NoError(t, err, "only completed runs are deleted")
}

// blockingWorker runs pinArgs jobs until release is closed.
type blockingWorker struct {
	river.WorkerDefaults[pinArgs]
	started chan struct{}
	release chan struct{}
}

func (w *blockingWorker) Work(ctx context.Context, _ *river.Job[pinArgs]) error {
	w.started <- struct{}{}
	select {
	case <-w.release:
	case <-ctx.Done():
	}
	return nil
}

// TestAbandonedChunksFollowTheLivenessLock: a job River is running under a
// client named after a liveness key (as a worker names its clients) is
// abandoned while no session holds that key's lock, and not while one
// does; River writes the client's name where AbandonedChunks and
// ChunkAttemptOwned read it. RetakeChunk makes a running job available
// once, as River reads it, with the reason among its errors.
func TestAbandonedChunksFollowTheLivenessLock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tdb := dbtest.New(t)
	const key = 77
	const clientID = "herald-77-bulk"
	w := &blockingWorker{started: make(chan struct{}, 1), release: make(chan struct{})}
	workers := river.NewWorkers()
	river.AddWorker(workers, w)
	working, err := river.NewClient(riverpgxv5.New(tdb.Pool), &river.Config{
		ID: clientID, Schema: db.PoolSchema(tdb.Pool), Workers: workers,
		Queues: map[string]river.QueueConfig{"bulk": {MaxWorkers: 1}}, FetchCooldown: 20 * time.Millisecond, FetchPollInterval: 50 * time.Millisecond,
	})
	require.NoError(t, err)
	require.NoError(t, working.Start(ctx))
	t.Cleanup(func() { _ = working.Stop(ctx) })
	res, err := working.Insert(ctx, pinArgs{}, &river.InsertOpts{Queue: "bulk"})
	require.NoError(t, err)
	<-w.started

	abandoned, err := db.AbandonedChunks(ctx, tdb.Pool, []string{pinArgs{}.Kind()})
	require.NoError(t, err)
	require.Equal(t, []db.AbandonedChunk{{ID: res.Job.ID, ClientID: clientID, Queue: "bulk"}}, abandoned,
		"no session holds lock 77: the job's worker is gone")
	owned, err := db.ChunkAttemptOwned(ctx, tdb.Pool, res.Job.ID, clientID)
	require.NoError(t, err)
	require.True(t, owned)

	conn, err := pgx.Connect(ctx, tdb.URL)
	require.NoError(t, err)
	ok, err := db.TryLivenessLock(ctx, conn, key)
	require.NoError(t, err)
	require.True(t, ok)
	abandoned, err = db.AbandonedChunks(ctx, tdb.Pool, []string{pinArgs{}.Kind()})
	require.NoError(t, err)
	require.Empty(t, abandoned, "the lock is held: its worker is alive")
	other, err := pgx.Connect(ctx, tdb.URL)
	require.NoError(t, err)
	defer other.Close(ctx)
	ok, err = db.TryLivenessLock(ctx, other, key)
	require.NoError(t, err)
	require.False(t, ok, "one session holds a key")
	require.NoError(t, conn.Close(ctx))
	require.Eventually(t, func() bool {
		abandoned, err := db.AbandonedChunks(ctx, tdb.Pool, []string{pinArgs{}.Kind()})
		return err == nil && len(abandoned) == 1
	}, 10*time.Second, 10*time.Millisecond, "the session ended, and its lock with it")

	close(w.release)
	require.Eventually(t, func() bool {
		owned, err := db.ChunkAttemptOwned(ctx, tdb.Pool, res.Job.ID, clientID)
		return err == nil && !owned
	}, 10*time.Second, 10*time.Millisecond, "a finished job is no attempt's")

	// A running job, as River's fetch leaves it, retaken.
	client := insertOnly(t, tdb)
	stuck, err := client.Insert(ctx, pinArgs{}, &river.InsertOpts{Queue: "other"})
	require.NoError(t, err)
	_, err = tdb.Pool.Exec(ctx, `UPDATE river_job SET state = 'running', attempt = 1, attempted_at = now(), attempted_by = '{herald-78-other}' WHERE id = $1`, stuck.Job.ID)
	require.NoError(t, err)
	gone := db.AbandonedChunk{ID: stuck.Job.ID, ClientID: "herald-78-other", Queue: "other"}
	taken, err := db.RetakeChunk(ctx, tdb.Pool, db.AbandonedChunk{ID: stuck.Job.ID, ClientID: "herald-79-other"}, "not its client")
	require.NoError(t, err)
	require.False(t, taken, "a job is retaken only from the client that ran it")
	taken, err = db.RetakeChunk(ctx, tdb.Pool, gone, "its worker is gone")
	require.NoError(t, err)
	require.True(t, taken)
	taken, err = db.RetakeChunk(ctx, tdb.Pool, gone, "its worker is gone")
	require.NoError(t, err)
	require.False(t, taken, "taken once")
	job, err := client.JobGet(ctx, stuck.Job.ID)
	require.NoError(t, err)
	require.Equal(t, rivertype.JobStateAvailable, job.State)
	require.Len(t, job.Errors, 1)
	require.Equal(t, "its worker is gone", job.Errors[0].Error)
	require.Equal(t, 1, job.Errors[0].Attempt)
}

// TestEndSilentLivenessEndsOnlyTheSilent: a session that holds a liveness
// lock and has said nothing for the lease (a frozen or cut-off worker) is
// ended and its lock freed; one that pings more often than the lease, one
// in the middle of a statement, and a session without a liveness lock are
// left alone.
func TestEndSilentLivenessEndsOnlyTheSilent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tdb := dbtest.New(t)
	connect := func() *pgx.Conn {
		conn, err := pgx.Connect(ctx, tdb.URL)
		require.NoError(t, err)
		t.Cleanup(func() { _ = conn.Close(context.Background()) })
		return conn
	}
	silent, pinging, busy, bystander := connect(), connect(), connect(), connect()
	for key, conn := range map[int32]*pgx.Conn{81: silent, 82: pinging, 83: busy} {
		ok, err := db.TryLivenessLock(ctx, conn, key)
		require.NoError(t, err)
		require.True(t, ok)
	}
	_, err := bystander.Exec(ctx, "SELECT pg_advisory_lock(1, 81)") // another lock space
	require.NoError(t, err)
	// busy runs a statement longer than the lease.
	busyDone := make(chan error, 1)
	go func() { _, err := busy.Exec(ctx, "SELECT pg_sleep(1.5)"); busyDone <- err }()

	const lease = 600 * time.Millisecond
	deadline := time.Now().Add(lease + 400*time.Millisecond)
	for time.Now().Before(deadline) {
		require.NoError(t, pinging.Ping(ctx))
		time.Sleep(50 * time.Millisecond)
	}
	ended, err := db.EndSilentLiveness(ctx, tdb.Pool, lease)
	require.NoError(t, err)
	require.Equal(t, []int64{81}, ended, "only the silent session's lock")

	require.Error(t, silent.Ping(ctx), "the silent session was ended")
	require.NoError(t, pinging.Ping(ctx))
	require.NoError(t, <-busyDone, "a statement longer than the lease is not silence")
	require.NoError(t, bystander.Ping(ctx))
	other := connect()
	ok, err := db.TryLivenessLock(ctx, other, 81)
	require.NoError(t, err)
	require.True(t, ok, "the ended session's lock is free")
	ended, err = db.EndSilentLiveness(ctx, tdb.Pool, time.Hour)
	require.NoError(t, err)
	require.Empty(t, ended)
}

// scriptedWorker ends an attempt of a pinArgs job as next says: "fail"
// (an error), "snooze" (river.JobSnooze, as a parked chunk does) or "ok".
// Before it ends one, it reads FailingChunks as the job runs.
type scriptedWorker struct {
	river.WorkerDefaults[pinArgs]
	next    string
	tx      pgx.Tx
	running []int64
}

func (w *scriptedWorker) Work(ctx context.Context, _ *river.Job[pinArgs]) error {
	failing, err := db.FailingChunks(ctx, w.tx, []string{pinArgs{}.Kind()}, 3)
	if err != nil {
		return err
	}
	w.running = append(w.running, failing["bulk"])
	switch w.next {
	case "fail":
		return errors.New("poison")
	case "snooze":
		return river.JobSnooze(time.Minute)
	}
	return nil
}

// TestFailingChunksAreRiversFailedAttempts: FailingChunks counts a job
// whose last three attempts River ended in an error, read as River writes
// them through its own executor (rivertest): each error with its attempt's
// number, and a snooze giving its attempt back. A job failing every
// attempt counts from its third failure on, while it waits and while its
// next attempt runs, and no longer once an attempt completes; one parked
// (snoozed) however often, or parked after a failure, never counts; a
// snooze between failures is no attempt and does not break their run, but
// an attempt that completed does (a job retried by hand in River UI after
// it completed keeps its attempt count); a job of another kind, failing
// every attempt, is not a chunk.
func TestFailingChunksAreRiversFailedAttempts(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		script []string
		// counted is FailingChunks after each step (an attempt, or a
		// retry by hand); running, while each attempt ran.
		counted, running []int64
	}{
		{"failing every attempt", []string{"fail", "fail", "fail", "fail"}, []int64{0, 0, 1, 1}, []int64{0, 0, 0, 1}},
		{"failing three times, then through", []string{"fail", "fail", "fail", "ok"}, []int64{0, 0, 1, 0}, []int64{0, 0, 0, 1}},
		{"failed once, then through", []string{"fail", "ok"}, []int64{0, 0}, []int64{0, 0}},
		{"parked every attempt", []string{"snooze", "snooze", "snooze", "snooze", "snooze"}, []int64{0, 0, 0, 0, 0}, []int64{0, 0, 0, 0, 0}},
		{"failed once, then parked", []string{"fail", "snooze", "snooze", "snooze", "snooze"}, []int64{0, 0, 0, 0, 0}, []int64{0, 0, 0, 0, 0}},
		{"failed twice, then parked", []string{"fail", "fail", "snooze", "snooze", "snooze"}, []int64{0, 0, 0, 0, 0}, []int64{0, 0, 0, 0, 0}},
		{"failing, parked between", []string{"fail", "snooze", "fail", "snooze", "fail"}, []int64{0, 0, 0, 0, 1}, []int64{0, 0, 0, 0, 0}},
		{"failing, completed between", []string{"fail", "fail", "ok", "retry", "fail", "fail", "fail"}, []int64{0, 0, 0, 0, 0, 0, 1}, []int64{0, 0, 0, 0, 0, 0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			tdb := dbtest.New(t)
			tx, err := tdb.Pool.Begin(ctx)
			require.NoError(t, err)
			t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
			client := insertOnly(t, tdb)
			res, err := client.InsertTx(ctx, tx, pinArgs{}, &river.InsertOpts{Queue: "bulk"})
			require.NoError(t, err)
			other, err := client.InsertTx(ctx, tx, otherArgs{}, &river.InsertOpts{Queue: "bulk"})
			require.NoError(t, err)
			w := &scriptedWorker{tx: tx}
			tw := rivertest.NewWorker(t, riverpgxv5.New(nil), &river.Config{Schema: db.PoolSchema(tdb.Pool)}, river.Worker[pinArgs](w))
			failOther := rivertest.NewWorker(t, riverpgxv5.New(nil), &river.Config{Schema: db.PoolSchema(tdb.Pool)}, river.Worker[otherArgs](failingWorker{}))
			var counted []int64
			for _, step := range tc.script {
				if step == "retry" {
					// An operator retries the job in River UI.
					_, err := client.JobRetryTx(ctx, tx, res.Job.ID)
					require.NoError(t, err)
				} else {
					job, err := client.JobGetTx(ctx, tx, res.Job.ID)
					require.NoError(t, err)
					w.next = step
					_, _ = tw.WorkJob(ctx, t, tx, job)
				}
				job, err := client.JobGetTx(ctx, tx, other.Job.ID)
				require.NoError(t, err)
				_, _ = failOther.WorkJob(ctx, t, tx, job)
				failing, err := db.FailingChunks(ctx, tx, []string{pinArgs{}.Kind()}, 3)
				require.NoError(t, err)
				counted = append(counted, failing["bulk"])
			}
			require.Equal(t, tc.counted, counted, "after each attempt")
			require.Equal(t, tc.running, w.running, "while each attempt ran")
		})
	}
}

// otherArgs is a job of another kind than the chunks FailingChunks is
// asked about.
type otherArgs struct{}

func (otherArgs) Kind() string { return "river_pin_other" }

// failingWorker fails every attempt of an otherArgs job.
type failingWorker struct {
	river.WorkerDefaults[otherArgs]
}

func (failingWorker) Work(context.Context, *river.Job[otherArgs]) error { return errors.New("poison") }

// TestRetryUnclosedChunksIsRiversRetry: a job River's own completer marked
// completed, whose chunk row lacks its close, is made available by
// RetryUnclosedChunks once the completion is older than the span, and River
// runs it again as after its own JobRetry: once more, on its last attempt
// too (max_attempts raised by one), with the reason among its errors. A
// completion newer than the span is left alone.
func TestRetryUnclosedChunksIsRiversRetry(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tdb := dbtest.New(t)
	w := &blockingWorker{started: make(chan struct{}, 2), release: make(chan struct{})}
	close(w.release)
	workers := river.NewWorkers()
	river.AddWorker(workers, w)
	working, err := river.NewClient(riverpgxv5.New(tdb.Pool), &river.Config{
		Schema: db.PoolSchema(tdb.Pool), Workers: workers,
		Queues: map[string]river.QueueConfig{"bulk": {MaxWorkers: 1}}, FetchCooldown: 20 * time.Millisecond, FetchPollInterval: 50 * time.Millisecond,
	})
	require.NoError(t, err)
	require.NoError(t, working.Start(ctx))
	t.Cleanup(func() { _ = working.Stop(ctx) })
	res, err := working.Insert(ctx, pinArgs{}, &river.InsertOpts{Queue: "bulk", MaxAttempts: 1})
	require.NoError(t, err)
	<-w.started
	completed := func(attempt int) *rivertype.JobRow {
		t.Helper()
		var job *rivertype.JobRow
		require.Eventually(t, func() bool {
			job, err = working.JobGet(ctx, res.Job.ID)
			return err == nil && job.State == rivertype.JobStateCompleted && job.Attempt == attempt
		}, 10*time.Second, 10*time.Millisecond, "River did not complete attempt %d", attempt)
		return job
	}
	completed(1)

	// Its message, dispatching, and its chunk, not closed.
	tx, err := tdb.Pool.Begin(ctx)
	require.NoError(t, err)
	msg := scheduledMessage(t, tx, time.Now().Add(-10*time.Minute))
	_, err = tx.Exec(ctx, `UPDATE messages SET state = 'dispatching' WHERE id = $1`, msg)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `INSERT INTO message_chunks (message_id, chunk, job_id, due_at, device_count) VALUES ($1, 3, $2, now(), 1)`, msg, res.Job.ID)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))

	none, err := db.RetryUnclosedChunks(ctx, tdb.Pool, time.Minute, "lost")
	require.NoError(t, err)
	require.Empty(t, none, "completed within the span: an attempt may still close it")
	_, err = tdb.Pool.Exec(ctx, `UPDATE river_job SET finalized_at = now() - interval '2 minutes' WHERE id = $1`, res.Job.ID)
	require.NoError(t, err)
	retried, err := db.RetryUnclosedChunks(ctx, tdb.Pool, time.Minute, "lost")
	require.NoError(t, err)
	require.Equal(t, []db.UnclosedChunk{{ID: res.Job.ID, Queue: "bulk", MessageID: msg, Chunk: 3}}, retried)
	<-w.started
	job := completed(2)
	require.Equal(t, 2, job.MaxAttempts)
	require.Len(t, job.Errors, 1)
	require.Equal(t, "lost", job.Errors[0].Error)
	require.Equal(t, 1, job.Errors[0].Attempt)

	again, err := db.RetryUnclosedChunks(ctx, tdb.Pool, time.Minute, "lost")
	require.NoError(t, err)
	require.Empty(t, again)
}
