package jobs

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/heraldpush/herald/db"
	"github.com/heraldpush/herald/db/dbtest"
	"github.com/heraldpush/herald/jobs/push"
)

// schedulerBundle is a migrated database with users, Herald's pool (in its
// schema) and an application's pool on the same database, which knows
// nothing of Herald's schema: its search_path is PostgreSQL's default.
type schedulerBundle struct {
	herald, app *pgxpool.Pool
	scheduler   *Scheduler
	users       []string
}

func setupScheduler(t testing.TB) *schedulerBundle {
	t.Helper()
	tdb := dbtest.New(t)
	app, err := pgxpool.New(context.Background(), tdb.URL)
	require.NoError(t, err)
	t.Cleanup(app.Close)
	s, err := NewScheduler(SchedulerConfig{})
	require.NoError(t, err)
	return &schedulerBundle{herald: tdb.Pool, app: app, scheduler: s, users: registerUsers(t, db.On(tdb.Pool), "s", 3)}
}

// count counts the rows of Herald's tables (and River's jobs) that a
// scheduled message leaves.
func (b *schedulerBundle) count(t *testing.T) map[string]int {
	t.Helper()
	out := map[string]int{}
	for _, table := range []string{"messages", "deliveries", "message_chunks", "payloads", "idempotency_keys", "river_job"} {
		var n int
		require.NoError(t, b.herald.QueryRow(context.Background(), "SELECT count(*) FROM "+table).Scan(&n))
		out[table] = n
	}
	return out
}

// A message scheduled in a transaction that rolls back leaves nothing: no
// message, payload, ledger row, chunk, job or idempotency key. Inside the
// transaction, before the rollback, they were all there.
func TestSchedulerRollbackLeavesNoTrace(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setupScheduler(t)
	before := b.count(t)

	tx, err := b.app.Begin(ctx)
	require.NoError(t, err)
	// A failed assertion must not leave the connection taken: the pool's
	// Close would wait for it for ever.
	defer func() { _ = tx.Rollback(ctx) }()
	receipt, err := b.scheduler.Schedule(ctx, tx, Message{
		Audience: Audience{UserIDs: b.users}, Payload: push.Content{Title: "t"}, IdempotencyKey: "k1",
	})
	require.NoError(t, err)
	require.Equal(t, int32(3), receipt.DeviceCount)
	var inside int
	require.NoError(t, tx.QueryRow(ctx, "SELECT count(*) FROM herald.ledger").Scan(&inside))
	require.Equal(t, 3, inside, "the ledger is written in the caller's transaction")
	require.NoError(t, tx.QueryRow(ctx, "SELECT count(*) FROM herald.river_job").Scan(&inside))
	require.Equal(t, 1, inside, "the chunk job is inserted in the caller's transaction")
	require.NoError(t, tx.Rollback(ctx))

	require.Equal(t, before, b.count(t))
}

// A committed message is there for the workers, with its chunk job in
// Herald's queue; the caller's own statements in the same transaction
// resolve their names as before, so the application's own table called
// messages (in public) gets the application's row and Herald's gets
// Herald's.
func TestSchedulerCommitsWithTheCallersRows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setupScheduler(t)
	_, err := b.app.Exec(ctx, "CREATE TABLE messages (id serial PRIMARY KEY, body text NOT NULL)")
	require.NoError(t, err)

	tx, err := b.app.Begin(ctx)
	require.NoError(t, err)
	// A failed assertion must not leave the connection taken: the pool's
	// Close would wait for it for ever.
	defer func() { _ = tx.Rollback(ctx) }()
	var path string
	require.NoError(t, tx.QueryRow(ctx, "SELECT current_setting('search_path')").Scan(&path))
	_, err = tx.Exec(ctx, "INSERT INTO messages (body) VALUES ('before')")
	require.NoError(t, err)
	receipt, err := b.scheduler.Schedule(ctx, tx, Message{
		Priority: PriorityUrgent, Audience: Audience{UserIDs: b.users[:2]}, Payload: push.Content{Body: "b"},
	})
	require.NoError(t, err)
	_, err = tx.Exec(ctx, "INSERT INTO messages (body) VALUES ('after')")
	require.NoError(t, err)
	var after string
	require.NoError(t, tx.QueryRow(ctx, "SELECT current_setting('search_path')").Scan(&after))
	require.Equal(t, path, after, "Schedule puts the caller's search_path back")
	require.NoError(t, tx.Commit(ctx))

	var bodies []string
	rows, err := b.app.Query(ctx, "SELECT body FROM public.messages ORDER BY id")
	require.NoError(t, err)
	bodies, err = pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Equal(t, []string{"before", "after"}, bodies)

	id, ok := push.ParseMessageID(receipt.MessageID)
	require.True(t, ok)
	msg, err := db.On(b.herald).GetMessage(ctx, id)
	require.NoError(t, err)
	require.Equal(t, StateScheduled, msg.State)
	require.Equal(t, int32(2), msg.DeviceCount)
	var queue string
	require.NoError(t, b.herald.QueryRow(ctx,
		"SELECT j.queue FROM river_job j JOIN message_chunks c ON c.job_id = j.id WHERE c.message_id = $1", id).Scan(&queue))
	require.Equal(t, QueueUrgent, queue)
}

// A message that breaks a rule is an InvalidError naming the field, and
// the caller's transaction goes on as if Schedule had not been called: its
// earlier rows are kept and it can commit.
func TestSchedulerRefusalLeavesTheTransactionUsable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setupScheduler(t)
	_, err := b.app.Exec(ctx, "CREATE TABLE appointments (id serial PRIMARY KEY)")
	require.NoError(t, err)

	cases := []struct {
		name  string
		m     Message
		field string
	}{
		{"priority", Message{Priority: "soon", Audience: Audience{UserIDs: b.users}, Payload: push.Content{Title: "t"}}, "priority"},
		{"no audience", Message{Payload: push.Content{Title: "t"}}, "audience.ids"},
		{"bad user id", Message{Audience: Audience{UserIDs: []string{"a b"}}, Payload: push.Content{Title: "t"}}, "audience.ids[0]"},
		{"empty payload", Message{Audience: Audience{UserIDs: b.users}}, "payload"},
		{"NUL in the title", Message{Audience: Audience{UserIDs: b.users}, Payload: push.Content{Title: "a\x00b"}}, "payload.title"},
		{"unknown segment", Message{Audience: Audience{SegmentID: "nobody"}, Payload: push.Content{Title: "t"}}, "audience.id"},
		{"local with dispatch_at", Message{Audience: Audience{UserIDs: b.users}, Payload: push.Content{Title: "t"},
			DispatchAt: b.now(t), Local: &LocalDelivery{Wall: b.now(t)}}, "deliver_at_local"},
		{"expired", Message{Audience: Audience{UserIDs: b.users}, Payload: push.Content{Title: "t"},
			DispatchAt: b.now(t).Add(-2 * DefaultLifetime)}, "expires_at"},
	}
	tx, err := b.app.Begin(ctx)
	require.NoError(t, err)
	// A failed assertion must not leave the connection taken: the pool's
	// Close would wait for it for ever.
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, "INSERT INTO appointments DEFAULT VALUES")
	require.NoError(t, err)
	for _, c := range cases {
		_, err := b.scheduler.Schedule(ctx, tx, c.m)
		var invalid *InvalidError
		require.ErrorAs(t, err, &invalid, c.name)
		require.Equal(t, c.field, invalid.Field, "%s: %v", c.name, err)
	}
	// An error of PostgreSQL's: a Scheduler told the wrong schema finds no
	// tables there, and its savepoint takes the failure with it.
	nowhere, err := NewScheduler(SchedulerConfig{Schema: "nowhere"})
	require.NoError(t, err)
	_, err = nowhere.Schedule(ctx, tx, Message{Audience: Audience{UserIDs: b.users}, Payload: push.Content{Title: "t"}})
	require.ErrorContains(t, err, "does not exist")
	_, err = tx.Exec(ctx, "INSERT INTO appointments DEFAULT VALUES")
	require.NoError(t, err, "the transaction is still usable")
	require.NoError(t, tx.Commit(ctx))
	var n int
	require.NoError(t, b.app.QueryRow(ctx, "SELECT count(*) FROM appointments").Scan(&n))
	require.Equal(t, 2, n)
	require.Zero(t, b.count(t)["messages"])
}

func (b *schedulerBundle) now(t *testing.T) time.Time {
	t.Helper()
	now, err := db.On(b.herald).DatabaseNow(context.Background())
	require.NoError(t, err)
	return now
}

// The same key with the same message, in a later transaction, answers the
// first receipt and schedules nothing more; with another message it is
// refused. Keys of Go callers are apart from every API key's.
func TestSchedulerIdempotency(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setupScheduler(t)
	m := Message{Audience: Audience{UserIDs: b.users}, Payload: push.Content{Title: "t"}, IdempotencyKey: "appointment-7"}
	schedule := func(m Message) (Receipt, error) {
		var r Receipt
		err := pgx.BeginFunc(ctx, b.app, func(tx pgx.Tx) error {
			var err error
			r, err = b.scheduler.Schedule(ctx, tx, m)
			return err
		})
		return r, err
	}
	first, err := schedule(m)
	require.NoError(t, err)
	again, err := schedule(m)
	require.NoError(t, err)
	require.Equal(t, first, again)
	require.Equal(t, 1, b.count(t)["messages"])

	other := m
	other.Payload.Title = "other"
	_, err = schedule(other)
	require.ErrorIs(t, err, ErrIdempotencyKeyReused)

	var scope string
	require.NoError(t, b.herald.QueryRow(ctx, "SELECT scope FROM idempotency_keys").Scan(&scope))
	require.Equal(t, GoScope, scope)
}

// BenchmarkSchedule compares a one-device message scheduled in a caller's
// transaction (Scheduler: a savepoint, search_path set and put back) with
// the API's path (Enqueuer.Schedule in a transaction of Herald's pool), each
// in a transaction of its own that commits.
func BenchmarkSchedule(b *testing.B) {
	ctx := context.Background()
	bundle := setupScheduler(b)
	m := Message{Audience: Audience{UserIDs: bundle.users[:1]}, Payload: push.Content{Title: "t"}}
	enqueuer := bundle.scheduler.enqueuer
	for _, c := range []struct {
		name string
		pool *pgxpool.Pool
		run  func(tx pgx.Tx) error
	}{
		{"scheduler", bundle.app, func(tx pgx.Tx) error { _, err := bundle.scheduler.Schedule(ctx, tx, m); return err }},
		{"enqueuer", bundle.herald, func(tx pgx.Tx) error { _, err := enqueuer.Schedule(ctx, tx, m, "bench"); return err }},
	} {
		b.Run(c.name, func(b *testing.B) {
			for b.Loop() {
				if err := pgx.BeginFunc(ctx, c.pool, c.run); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
