package db_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
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
