package main

import (
	"bytes"
	"context"
	"maps"
	"net/http"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/heraldpush/herald/api/client"
	"github.com/heraldpush/herald/db/dbtest"
	"github.com/heraldpush/herald/jobs"
	"github.com/heraldpush/herald/jobs/push"
)

// An application sharing Herald's database schedules reminders in its own
// transactions, on its own pool (PostgreSQL's default search_path), next to
// its own table called messages. What it commits, the running Herald sends
// through fakepush; what it rolls back, Herald never sees.
func TestSchedulesInTheCallersTransaction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := startE2E(t, nil)
	e.register("pat", false)

	app, err := pgxpool.New(ctx, e.vars["DATABASE_URL"])
	require.NoError(t, err)
	defer app.Close()
	_, err = app.Exec(ctx, `CREATE TABLE messages (id serial PRIMARY KEY, body text NOT NULL);
		CREATE TABLE appointments (id serial PRIMARY KEY, reminder text NOT NULL)`)
	require.NoError(t, err, "the application's own messages table does not meet Herald's")
	scheduler, err := jobs.NewScheduler(jobs.SchedulerConfig{})
	require.NoError(t, err)

	book := func(commit bool) string {
		tx, err := app.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(ctx) }()
		receipt, err := scheduler.Schedule(ctx, tx, jobs.Message{
			Priority: jobs.PriorityUrgent,
			Audience: jobs.Audience{UserIDs: []string{"pat"}},
			Payload:  push.Content{Title: "Dentist", Body: "tomorrow at nine"},
		})
		require.NoError(t, err)
		_, err = tx.Exec(ctx, "INSERT INTO appointments (reminder) VALUES ($1)", receipt.MessageID)
		require.NoError(t, err)
		_, err = tx.Exec(ctx, "INSERT INTO messages (body) VALUES ('booked')")
		require.NoError(t, err)
		if commit {
			require.NoError(t, tx.Commit(ctx))
		}
		return receipt.MessageID
	}

	gone := book(false)
	kept := book(true)

	st := e.settle(kept, 30*time.Second)
	require.Equal(t, client.MessageStateDispatched, st.State)
	require.Equal(t, 3, st.Deliveries.Accepted)
	require.Len(t, e.fake.Receipts(kept), 3, "fakepush took the committed reminder on every device")

	res, err := e.api.GetMessageWithResponse(ctx, gone)
	answered(t, http.StatusNotFound, res, err)
	require.Empty(t, e.fake.Receipts(gone))
	var appointments, appMessages int
	require.NoError(t, app.QueryRow(ctx, "SELECT (SELECT count(*) FROM appointments), (SELECT count(*) FROM public.messages)").Scan(&appointments, &appMessages))
	require.Equal(t, 1, appointments)
	require.Equal(t, 1, appMessages)
}

// An installation from before Herald had a schema of its own (its tables and
// River's in public, a message scheduled and not yet sent) is refused by the
// new Herald until `herald migrate` moves it; then the same message is sent,
// its devices are still there, and new messages work.
func TestMigrateMovesAnInstallationFromPublic(t *testing.T) {
	t.Parallel()
	fp, tdb, vars := e2eEnvOn(t, dbtest.NewEmpty(t))

	// The old layout: everything in public.
	old := maps.Clone(vars)
	old["HERALD_DB_SCHEMA"] = "public"
	base, stop := startServe(t, old, "--migrate")
	e := &e2e{t: t, fake: fp, base: base, stop: stop, vars: old, db: tdb, api: newAPIClient(t, base, testAPIKey)}
	ctx := context.Background()
	e.register("lee", false)
	seg, err := e.api.CreateSegmentWithResponse(ctx, "seg_old", client.SegmentUpdate{Name: new("old")})
	answered(t, http.StatusCreated, seg, err)
	added, err := e.api.AddSegmentMembersWithResponse(ctx, "seg_old", client.MemberIDs{UserIDs: []string{"lee"}})
	answered(t, http.StatusOK, added, err)
	pending := e.send(client.NewMessage{
		DispatchAt: new(time.Now().Add(4 * time.Second)),
		Audience:   client.Audience{Type: client.AudienceTypeSegment, ID: new("seg_old")},
		Payload:    titled("before the move"),
	}).MessageID
	require.NoError(t, stop())

	var stdout, stderr bytes.Buffer
	err = run(context.Background(), []string{"herald", "serve", "--addr", "127.0.0.1:0"}, env(vars), &stdout, &stderr)
	require.ErrorContains(t, err, "Herald's tables are in schema public; `herald migrate` moves them into schema herald")

	require.NoError(t, run(context.Background(), []string{"herald", "migrate"}, env(vars), &stdout, &stderr), stderr.String())
	require.Contains(t, stdout.String(), "moved ")
	require.Contains(t, stdout.String(), "river_job")
	var left int
	require.NoError(t, tdb.Pool.QueryRow(context.Background(), `SELECT
		(SELECT count(*) FROM pg_class WHERE relnamespace = 'public'::regnamespace) +
		(SELECT count(*) FROM pg_type WHERE typnamespace = 'public'::regnamespace) +
		(SELECT count(*) FROM pg_proc WHERE pronamespace = 'public'::regnamespace)`).Scan(&left))
	require.Zero(t, left, "nothing of Herald's or River's is left in public")

	base, stop = startServe(t, vars)
	e = &e2e{t: t, fake: fp, base: base, stop: stop, vars: vars, db: tdb, api: newAPIClient(t, base, testAPIKey)}
	st := e.settle(pending, 30*time.Second)
	require.Equal(t, client.MessageStateDispatched, st.State)
	require.Len(t, fp.Receipts(pending), 3, "the message scheduled before the move is sent after it")
	got, err := e.api.GetSegmentWithResponse(ctx, "seg_old")
	require.Equal(t, 1, answered(t, http.StatusOK, got, err).JSON200.MemberCount)

	urgent := client.PriorityUrgent
	fresh := e.send(client.NewMessage{Priority: &urgent, Audience: toUsers("lee"), Payload: titled("after the move")}).MessageID
	require.Equal(t, client.MessageStateDispatched, e.settle(fresh, 30*time.Second).State)
	require.Len(t, fp.Receipts(fresh), 3)
	require.NotEqual(t, pending, fresh, "ids go on from the moved sequences")
	var inHerald bool
	require.NoError(t, tdb.Pool.QueryRow(context.Background(), "SELECT to_regclass('herald.river_job') IS NOT NULL").Scan(&inHerald))
	require.True(t, inHerald)
}
