package jobs

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/stretchr/testify/require"

	"github.com/heraldpush/herald/db"
	"github.com/heraldpush/herald/db/dbtest"
	"github.com/heraldpush/herald/jobs/push"
)

// retainBundle is a database with five users, an insert-only River client
// for making messages through the Enqueuer, and a fixed clock.
type retainBundle struct {
	t      *testing.T
	db     *dbtest.DB
	q      *db.Queries
	client *river.Client[pgx.Tx]
	users  []string
	now    time.Time
}

func setupRetain(t *testing.T) *retainBundle {
	t.Helper()
	tdb := dbtest.New(t)
	q := db.On(tdb.Pool)
	client, err := NewRiverClient(tdb.Pool, RiverConfig{Logger: discard})
	require.NoError(t, err)
	now, err := q.DatabaseNow(context.Background())
	require.NoError(t, err)
	return &retainBundle{t: t, db: tdb, q: q, client: client, users: registerUsers(t, q, "r", 5), now: now}
}

// message makes a message to every user through the Enqueuer, two devices
// a chunk, with payload as its payload when non-zero (a schedule's runs
// share the schedule's), and an idempotency key claimed created ago.
func (b *retainBundle) message(key string, created time.Duration, payload int64) db.Message {
	b.t.Helper()
	ctx := context.Background()
	var msg db.Message
	require.NoError(b.t, db.InTx(ctx, b.db.Pool, func(tx pgx.Tx) error {
		var err error
		msg, err = NewEnqueuer(b.client, 2).Create(ctx, tx, MessageSpec{
			Priority: PriorityBulk, DispatchAt: b.now.Add(time.Hour), ExpiresAt: b.now.Add(2 * time.Hour),
			Audience: Audience{UserIDs: b.users}, AudienceJSON: []byte(`{}`),
			Content: push.Content{Title: key}, PayloadID: payload,
		})
		if err != nil {
			return err
		}
		q := db.On(tx)
		if _, err := q.ClaimIdempotencyKey(ctx, db.ClaimIdempotencyKeyParams{Scope: "s", Key: key, RequestHash: []byte{1}}); err != nil {
			return err
		}
		return q.CompleteIdempotencyKey(ctx, db.CompleteIdempotencyKeyParams{Scope: "s", Key: key, MessageID: &msg.ID, Response: []byte(`{}`)})
	}))
	b.exec("UPDATE idempotency_keys SET created_at = $1 WHERE key = $2", b.now.Add(-created), key)
	return msg
}

// settle marks msg dispatched ago, every delivery accepted, as the chunk
// workers would have left it.
func (b *retainBundle) settle(msg db.Message, ago time.Duration) {
	b.t.Helper()
	b.exec(`INSERT INTO deliveries (message_id, device_id, user_id, channel, chunk, due_at, status, accepted_at)
	        SELECT message_id, device_id, user_id, channel, chunk, due_at, 'accepted', $2 FROM ledger
	        WHERE message_id = $1 AND status = 'pending'
	        ON CONFLICT (message_id, device_id) DO UPDATE SET status = 'accepted', accepted_at = excluded.accepted_at`,
		msg.ID, b.now.Add(-ago))
	b.exec(`UPDATE messages SET state = 'dispatched', settled_at = $2,
	        pending_count = 0, accepted_count = device_count WHERE id = $1`, msg.ID, b.now.Add(-ago))
}

func (b *retainBundle) exec(sql string, args ...any) {
	b.t.Helper()
	_, err := b.db.Pool.Exec(context.Background(), sql, args...)
	require.NoError(b.t, err)
}

func (b *retainBundle) count(sql string, args ...any) int {
	b.t.Helper()
	var n int
	require.NoError(b.t, b.db.Pool.QueryRow(context.Background(), sql, args...).Scan(&n))
	return n
}

// kept says what is left of msg: its row, ledger rows, chunks, payload and
// idempotency key.
func (b *retainBundle) kept(msg db.Message, key string) [5]int {
	b.t.Helper()
	return [5]int{
		b.count("SELECT count(*) FROM messages WHERE id = $1", msg.ID),
		b.count("SELECT count(*) FROM ledger WHERE message_id = $1", msg.ID),
		b.count("SELECT count(*) FROM message_chunks WHERE message_id = $1", msg.ID),
		b.count("SELECT count(*) FROM payloads WHERE id = $1", msg.PayloadID),
		b.count("SELECT count(*) FROM idempotency_keys WHERE key = $1", key),
	}
}

func TestRetainerDeletesSettledHistoryOlderThanTheRetention(t *testing.T) {
	t.Parallel()
	b := setupRetain(t)
	ctx := context.Background()
	const retention = time.Hour

	old := b.message("old", 3*time.Hour, 0)
	b.settle(old, 2*time.Hour)
	recent := b.message("recent", 3*time.Hour, 0)
	b.settle(recent, 30*time.Minute)
	// Made long ago and not settled (due far ahead): kept, with its key.
	unsettled := b.message("unsettled", 3*time.Hour, 0)
	// Two old runs of a schedule share its payload: the runs go, the
	// payload stays for the schedule's next runs.
	sched := b.message("schedule", 3*time.Hour, 0)
	b.settle(sched, 2*time.Hour)
	b.exec("INSERT INTO schedules (cron, timezone, audience, payload_id, priority, ttl_seconds) VALUES ('@daily', 'UTC', '{}', $1, 'bulk', 60)", sched.PayloadID)
	run := b.message("run", 3*time.Hour, sched.PayloadID)
	b.settle(run, 2*time.Hour)

	r := newRetainer(t, RetainerConfig{Pool: b.db.Pool, Logger: discard, Retention: retention, BatchRows: 2, BatchMessages: 1,
		Now: func(context.Context) (time.Time, error) { return b.now, nil }})
	removed, err := r.Run(ctx)
	require.NoError(t, err)
	require.Equal(t, Removed{Messages: 3, Deliveries: 15, Payloads: 1, IdempotencyKeys: 3}, removed)

	require.Equal(t, [5]int{0, 0, 0, 0, 0}, b.kept(old, "old"))
	require.Equal(t, [5]int{1, 5, 3, 1, 1}, b.kept(recent, "recent"))
	require.Equal(t, [5]int{1, 5, 3, 1, 1}, b.kept(unsettled, "unsettled"))
	require.Equal(t, [5]int{0, 0, 0, 1, 0}, b.kept(sched, "schedule"))
	require.Equal(t, [5]int{0, 0, 0, 1, 0}, b.kept(run, "run"))

	// Nothing more to do: a second run deletes nothing.
	removed, err = r.Run(ctx)
	require.NoError(t, err)
	require.Equal(t, Removed{}, removed)
}

// TestRetainerDeletesReceiptsWithTheirLedger: a message's receipts go with
// its ledger, in batches, and a message kept keeps its receipts.
func TestRetainerDeletesReceiptsWithTheirLedger(t *testing.T) {
	t.Parallel()
	b := setupRetain(t)
	ctx := context.Background()
	old := b.message("old", 3*time.Hour, 0)
	b.settle(old, 2*time.Hour)
	recent := b.message("recent", 3*time.Hour, 0)
	b.settle(recent, 30*time.Minute)
	for _, msg := range []db.Message{old, recent} {
		rows, err := b.db.Pool.Query(ctx, "SELECT device_id FROM ledger WHERE message_id = $1", msg.ID)
		require.NoError(t, err)
		devices, err := pgx.CollectRows(rows, pgx.RowTo[int64])
		require.NoError(t, err)
		var rs []db.ReceiptWrite
		for i, d := range devices {
			rs = append(rs, db.ReceiptWrite{MessageID: msg.ID, DeviceID: d, Event: "delivered"})
			if i < 2 {
				rs = append(rs, db.ReceiptWrite{MessageID: msg.ID, DeviceID: d, Event: "opened"})
			}
		}
		_, err = db.WriteReceipts(ctx, b.db.Pool, rs)
		require.NoError(t, err)
	}

	r := newRetainer(t, RetainerConfig{Pool: b.db.Pool, Logger: discard, Retention: time.Hour, BatchRows: 2, BatchMessages: 1,
		Now: func(context.Context) (time.Time, error) { return b.now, nil }})
	removed, err := r.Run(ctx)
	require.NoError(t, err)
	require.Equal(t, Removed{Messages: 1, Deliveries: 5, Receipts: 7, Payloads: 1, IdempotencyKeys: 1}, removed)
	require.Zero(t, b.count("SELECT count(*) FROM receipts WHERE message_id = $1", old.ID))
	require.Zero(t, b.count("SELECT count(*) FROM messages WHERE id = $1", old.ID))
	require.Equal(t, 7, b.count("SELECT count(*) FROM receipts WHERE message_id = $1", recent.ID))
}

// newRetainer is the Retainer of cfg, which the test expects to be valid.
func newRetainer(t *testing.T, cfg RetainerConfig) *Retainer {
	t.Helper()
	r, err := NewRetainer(&cfg)
	require.NoError(t, err)
	return r
}

func TestRetainerLeavesABacklogToTheNextRunOnceItsBudgetIsSpent(t *testing.T) {
	t.Parallel()
	b := setupRetain(t)
	msg := b.message("old", 3*time.Hour, 0)
	b.settle(msg, 2*time.Hour)

	now := func(context.Context) (time.Time, error) { return b.now, nil }
	spent := newRetainer(t, RetainerConfig{Pool: b.db.Pool, Logger: discard, Retention: time.Hour, Budget: time.Nanosecond, Now: now})
	removed, err := spent.Run(context.Background())
	require.NoError(t, err)
	require.Zero(t, removed.Messages)
	require.Equal(t, [5]int{1, 5, 3, 1, 1}, b.kept(msg, "old"))

	removed, err = newRetainer(t, RetainerConfig{Pool: b.db.Pool, Logger: discard, Retention: time.Hour, Now: now}).Run(context.Background())
	require.NoError(t, err)
	require.Equal(t, Removed{Messages: 1, Deliveries: 5, Payloads: 1, IdempotencyKeys: 1}, removed)
}

func TestRetentionSetsRiversJobCleaner(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		retention                   time.Duration
		every, completed, discarded time.Duration
	}{
		{DefaultRetention, time.Minute, 24 * time.Hour, 7 * 24 * time.Hour},
		{3 * 24 * time.Hour, time.Minute, 24 * time.Hour, 3 * 24 * time.Hour},
		{3 * time.Minute, 45 * time.Second, 3 * time.Minute, 3 * time.Minute},
	} {
		rc := &river.Config{}
		retainRiverJobs(rc, tc.retention)
		require.Equal(t, tc.completed, rc.CompletedJobRetentionPeriod, tc.retention)
		require.Equal(t, tc.completed, rc.CancelledJobRetentionPeriod, tc.retention)
		require.Equal(t, tc.discarded, rc.DiscardedJobRetentionPeriod, tc.retention)
		require.Equal(t, tc.every, retainEvery(tc.retention), tc.retention)
	}
}

// column reads a query's one text column.
func (b *retainBundle) column(sql string) []string {
	b.t.Helper()
	rows, err := b.db.Pool.Query(context.Background(), sql)
	require.NoError(b.t, err)
	values, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(b.t, err)
	return values
}

// evict marks user's devices evicted ago, as a provider's verdict on their
// tokens would have.
func (b *retainBundle) evict(user string, ago time.Duration) {
	b.t.Helper()
	b.exec("UPDATE devices SET status = 'evicted', evicted_reason = 'unregistered', evicted_at = $2 WHERE user_id = $1", user, b.now.Add(-ago))
}

func TestRetainerDeletesDevicesEvictedLongerThanTheDeviceRetention(t *testing.T) {
	t.Parallel()
	b := setupRetain(t)
	ctx := context.Background()
	// Made before the evictions and due ahead: every device's delivery is
	// pending.
	due := b.message("due", 0, 0)
	for _, user := range b.users[:3] {
		b.evict(user, 3*time.Hour)
	}
	b.evict(b.users[3], 30*time.Minute)
	// Evicted long ago, then registered again: active, and kept.
	b.evict(b.users[4], 3*time.Hour)
	reg, err := db.BeginRegistration(ctx, b.db.Pool, []db.Registration{{UserID: b.users[4], Channel: "fcm", Token: "tok-" + b.users[4], Environment: "production"}})
	require.NoError(t, err)
	_, err = reg.Write(ctx)
	require.NoError(t, err)
	devices := func() []string { return b.column("SELECT user_id FROM devices ORDER BY user_id") }

	now := func(context.Context) (time.Time, error) { return b.now, nil }
	cfg := RetainerConfig{Pool: b.db.Pool, Logger: discard, Retention: time.Hour, DeviceRetention: time.Hour, BatchRows: 2, Now: now}
	r := newRetainer(t, cfg)
	// A run whose budget is spent still deletes a batch, and no more.
	cfg.Budget = time.Nanosecond
	removed, err := newRetainer(t, cfg).Run(ctx)
	require.NoError(t, err)
	require.Equal(t, Removed{Devices: 2}, removed)
	require.Len(t, devices(), 3)

	removed, err = r.Run(ctx)
	require.NoError(t, err)
	require.Equal(t, Removed{Devices: 1}, removed)
	require.Equal(t, b.users[3:], devices(), "the recently evicted device and the active one stay")

	// Their pending deliveries were cancelled first, with the message's
	// counters, as an erasure cancels them.
	msg, err := b.q.GetMessage(ctx, due.ID)
	require.NoError(t, err)
	require.Equal(t, [2]int32{2, 3}, [2]int32{msg.PendingCount, msg.CancelledCount})
	require.Equal(t, 3, b.count("SELECT count(*) FROM ledger WHERE message_id = $1 AND status = 'cancelled' AND reason = 'device_evicted'", due.ID))

	removed, err = r.Run(ctx)
	require.NoError(t, err)
	require.Equal(t, Removed{}, removed)
}

// TestRetainerDeletesWhatDeletedDevicesWere keeps the record of a deleted
// device (migration 0025) as long as a message may name it, and no longer.
func TestRetainerDeletesWhatDeletedDevicesWere(t *testing.T) {
	t.Parallel()
	b := setupRetain(t)
	ctx := context.Background()
	b.exec("DELETE FROM devices WHERE user_id = ANY ($1)", b.users[:3])
	require.Equal(t, b.users[:3], b.column("SELECT user_id FROM deleted_devices ORDER BY user_id"),
		"a device deleted leaves its user and channel")
	b.exec("UPDATE deleted_devices SET deleted_at = $1 WHERE user_id = ANY ($2)", b.now.Add(-2*time.Hour), b.users[:2])

	now := func(context.Context) (time.Time, error) { return b.now, nil }
	cfg := RetainerConfig{Pool: b.db.Pool, Logger: discard, Retention: time.Hour, DeviceRetention: time.Hour, BatchRows: 1, Now: now}
	removed, err := newRetainer(t, cfg).Run(ctx)
	require.NoError(t, err)
	require.Equal(t, Removed{DeletedDevices: 2}, removed)
	require.Equal(t, b.users[2:3], b.column("SELECT user_id FROM deleted_devices"), "deleted within the retention: kept")
}

func TestRetainerKeepsAScheduleKeyUntilItsScheduleIsDeletedForTheRetention(t *testing.T) {
	t.Parallel()
	b := setupRetain(t)
	ctx := context.Background()
	payload, err := b.q.InsertPayload(ctx, []byte(`{"title":"t"}`))
	require.NoError(t, err)
	// schedule makes a schedule with a key claimed three hours ago, deleted
	// ago (never when zero).
	schedule := func(key string, deleted time.Duration) {
		var id int64
		require.NoError(t, b.db.Pool.QueryRow(ctx, `INSERT INTO schedules (cron, timezone, audience, payload_id, priority, ttl_seconds)
			VALUES ('@daily', 'UTC', '{}', $1, 'bulk', 60) RETURNING id`, payload).Scan(&id))
		if deleted > 0 {
			b.exec("UPDATE schedules SET deleted_at = $2 WHERE id = $1", id, b.now.Add(-deleted))
		}
		_, err := b.q.ClaimIdempotencyKey(ctx, db.ClaimIdempotencyKeyParams{Scope: "s", Key: key, RequestHash: []byte{1}})
		require.NoError(t, err)
		require.NoError(t, b.q.CompleteIdempotencyKey(ctx, db.CompleteIdempotencyKeyParams{Scope: "s", Key: key, ScheduleID: &id, Response: []byte(`{}`)}))
		b.exec("UPDATE idempotency_keys SET created_at = $1 WHERE key = $2", b.now.Add(-3*time.Hour), key)
	}
	schedule("live", 0)
	schedule("deleted long ago", 2*time.Hour)
	schedule("deleted lately", 30*time.Minute)

	r := newRetainer(t, RetainerConfig{Pool: b.db.Pool, Logger: discard, Retention: time.Hour,
		Now: func(context.Context) (time.Time, error) { return b.now, nil }})
	removed, err := r.Run(ctx)
	require.NoError(t, err)
	require.Equal(t, Removed{IdempotencyKeys: 1}, removed)
	require.Equal(t, []string{"deleted lately", "live"}, b.column("SELECT key FROM idempotency_keys ORDER BY key"),
		"a retry still finds the schedule while it lives")
}

func TestRetainerDeletesOldAuditEntriesAndEndedSessions(t *testing.T) {
	t.Parallel()
	b := setupRetain(t)
	ctx := context.Background()
	for i, age := range []time.Duration{100 * time.Hour, 50 * time.Hour, 47 * time.Hour, time.Hour} {
		b.exec(`INSERT INTO audit_log (at, key_name, method, route, target_id, status, request_id)
		        VALUES ($1, 'ops', 'DELETE', '/v1/users/{user_id}', $2, 204, 'r')`, b.now.Add(-age), fmt.Sprint(i))
	}
	// Sessions that ended two days ago (one signed out before), one that
	// ended an hour ago, and one still live.
	for i, ended := range []time.Duration{48 * time.Hour, 48 * time.Hour, time.Hour, -time.Hour} {
		b.exec(`INSERT INTO dashboard_sessions (digest, operator, expires_at, revoked_at)
		        VALUES (sha256($1::bytea), 'alice', $2::timestamptz, CASE WHEN $3::boolean THEN $2::timestamptz - interval '1 hour' END)`,
			[]byte{byte(i)}, b.now.Add(-ended), i == 1)
	}
	now := func(context.Context) (time.Time, error) { return b.now, nil }
	cfg := RetainerConfig{Pool: b.db.Pool, Logger: discard, AuditRetention: 48 * time.Hour, BatchRows: 1, Now: now}
	removed, err := newRetainer(t, cfg).Run(ctx)
	require.NoError(t, err)
	require.Equal(t, Removed{AuditEntries: 2, Sessions: 2}, removed)
	require.Equal(t, []string{"2", "3"}, b.column("SELECT target_id FROM audit_log ORDER BY at"))
	require.Equal(t, 2, b.count("SELECT count(*) FROM dashboard_sessions"))

	// Unset, the audit retention is DefaultAuditRetention: 90 days.
	cfg.AuditRetention = 0
	b.exec("UPDATE audit_log SET at = $1 WHERE target_id = '2'", b.now.Add(-DefaultAuditRetention-time.Minute))
	removed, err = newRetainer(t, cfg).Run(ctx)
	require.NoError(t, err)
	require.Equal(t, Removed{AuditEntries: 1}, removed)
}

// TestRetainerDeletesWebhookEventsOfBatchesGivenUp: a batch given up keeps
// its events WebhookEventRetention, for a retry from River UI, then they
// go; younger ones stay.
func TestRetainerDeletesWebhookEventsOfBatchesGivenUp(t *testing.T) {
	t.Parallel()
	b := setupRetain(t)
	for i, age := range []time.Duration{WebhookEventRetention + time.Hour, WebhookEventRetention + time.Minute, time.Hour} {
		b.exec(`INSERT INTO webhook_events (webhook_id, message_id, type, device_id, at, batch_id, created_at)
		        VALUES (1, 1, 'delivery.failed', $1, $2, 7, $2)`, i, b.now.Add(-age))
	}
	now := func(context.Context) (time.Time, error) { return b.now, nil }
	removed, err := newRetainer(t, RetainerConfig{Pool: b.db.Pool, Logger: discard, BatchRows: 1, Now: now}).Run(context.Background())
	require.NoError(t, err)
	require.Equal(t, Removed{WebhookEvents: 2}, removed)
	require.Equal(t, []string{"2"}, b.column("SELECT device_id::text FROM webhook_events"))
}

// TestRetainerSweepsCapHistoriesARangeAtATime deletes the cap histories
// that count for nothing (migration 0026: found by reading the table, not
// an index) a few pages a run, resuming where the previous run stopped and
// starting again at the first page after the last, and keeps the others.
func TestRetainerSweepsCapHistoriesARangeAtATime(t *testing.T) {
	t.Parallel()
	b := setupRetain(t)
	ctx := context.Background()
	_, err := b.q.PutCategory(ctx, db.PutCategoryParams{Name: "promo", CapCount: new(int32(3)), CapPeriodS: new(int32(3600))})
	require.NoError(t, err)
	// 600 users, every other one's history stale (its last message two
	// hours old), over some twenty pages.
	b.exec(`INSERT INTO users (id) SELECT 'cap' || i FROM generate_series(1, 600) i`)
	b.exec(`INSERT INTO frequency_caps (user_id, category, message_ids, sent_at, last_at)
	        SELECT 'cap' || i, 'promo', ARRAY[i::bigint], ARRAY[now()], now() - CASE WHEN i % 2 = 0 THEN interval '2 hours' ELSE interval '0' END
	        FROM generate_series(1, 600) i`)
	blocks, err := b.q.FrequencyCapBlocks(ctx)
	require.NoError(t, err)
	require.Greater(t, blocks, int64(8))

	now := func(context.Context) (time.Time, error) { return b.now, nil }
	r := newRetainer(t, RetainerConfig{Pool: b.db.Pool, Logger: discard, Retention: time.Hour, Now: now})
	r.capSweep, r.capSweepRun = 2, 4
	left := func() int {
		return b.count("SELECT count(*) FROM frequency_caps WHERE last_at < now() - interval '1 hour'")
	}
	var runs int
	for left() > 0 {
		before := left()
		removed, err := r.Run(ctx)
		require.NoError(t, err)
		runs++
		require.Positive(t, removed.CapHistories, "run %d", runs)
		require.Equal(t, before-int(removed.CapHistories), left())
		require.LessOrEqual(t, runs, int(blocks+3)/4, "each run reads four pages on from the last")
	}
	require.Equal(t, 300, b.count("SELECT count(*) FROM frequency_caps"), "the histories that count are kept")
	// The sweep goes on from the first page after the last: a history
	// that goes stale is found within a sweep of the table.
	b.exec(`UPDATE frequency_caps SET last_at = now() - interval '2 hours' WHERE user_id = 'cap1'`)
	for range (blocks + 3) / 4 {
		_, err := r.Run(ctx)
		require.NoError(t, err)
	}
	require.Equal(t, 299, b.count("SELECT count(*) FROM frequency_caps"))
}

// TestRetainerRebuildsTheLedgerKeyALargeMessageEmptied: once the retention
// has deleted a large message and autovacuum has been through the ledger,
// the next run finds the ledger's primary key mostly emptied pages and
// rebuilds it (db.CompactLedgerKey), giving the space back.
func TestRetainerRebuildsTheLedgerKeyALargeMessageEmptied(t *testing.T) {
	t.Parallel()
	b := setupRetain(t)
	ctx := context.Background()
	msg := b.message("large", 3*time.Hour, 0)
	b.settle(msg, 2*time.Hour)
	b.exec(`INSERT INTO deliveries (message_id, device_id, user_id, channel, chunk, due_at, status, accepted_at)
	        SELECT $1, 1000000 + g, 'many', 'fcm', 1 + g / 500, now(), 'accepted', now() FROM generate_series(1, 200000) g`, msg.ID)
	b.exec(`VACUUM (ANALYZE) deliveries`)
	size := func() int64 {
		s, err := db.ReadLedgerKeySize(ctx, b.db.Pool)
		require.NoError(t, err)
		return s.Bytes
	}
	before := size()
	require.Greater(t, before, int64(4<<20))

	now := func(context.Context) (time.Time, error) { return b.now, nil }
	r := newRetainer(t, RetainerConfig{Pool: b.db.Pool, Logger: discard, Retention: time.Hour, Now: now, CompactAbove: 1 << 20})
	first, err := r.Run(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 1, first.Messages)
	require.EqualValues(t, 200_005, first.Deliveries)
	// What autovacuum does after a mass delete; then the next run.
	b.exec(`VACUUM (ANALYZE) deliveries`)
	second, err := r.Run(ctx)
	require.NoError(t, err)
	freed := first.LedgerKeyFreed + second.LedgerKeyFreed
	after := size()
	require.Equal(t, before-after, freed)
	require.Less(t, after, int64(1<<20), "the ledger's key kept %d bytes of %d", after, before)
}
