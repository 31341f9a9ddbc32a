package db_test

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/heraldpush/herald/db"
	"github.com/heraldpush/herald/db/dbtest"
)

// TestAcceptedRuns holds the runs of accepted deliveries (migration 0028)
// to the promise of the rows they replace: a chunk execution's results
// written with runs leave the ledger (the view every reader's statement
// restates), the counters, the skew histogram and the webhooks' events as
// the same results written a row each; the runs hold the acceptances and
// deliveries the rest. Every delivery stays in one place whatever comes
// between two writes of one chunk: another execution's run (a takeover,
// a retry), a replaced execution's late write, or a row written meanwhile
// (a cancel of the device); a chunk that begins again does not read what a
// run accepted.
func TestAcceptedRuns(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tdb := dbtest.New(t)
	_, err := tdb.Pool.Exec(ctx, `INSERT INTO webhooks (url, events, secret)
		VALUES ('https://hooks.example.com/', '{delivery.failed,delivery.withheld}', 'whsec_AA==')`)
	require.NoError(t, err)
	var dev [8]int64
	require.NoError(t, tdb.Pool.QueryRow(ctx, `
		WITH u AS (INSERT INTO users (id) SELECT 'u' || i FROM generate_series(1, 7) i),
		d AS (INSERT INTO devices (user_id, channel, token, environment)
		      SELECT 'u' || i, (ARRAY['apns', 'fcm', 'fcm'])[1 + i % 3], 'tok-' || i, 'production'
		      FROM generate_series(1, 7) i RETURNING id)
		SELECT min(id) FROM d`).Scan(&dev[1]))
	for i := 2; i <= 7; i++ {
		dev[i] = dev[1] + int64(i-1)
	}
	channel := func(i int) string { return []string{"apns", "fcm", "fcm"}[i%3] }
	due := time.Now().Add(-time.Minute).Truncate(time.Microsecond)
	dueUs := due.UnixMicro()
	message := func() int64 { return snapshotMessage(t, tdb.Pool, due, dev[1], 7) }
	key := func(id int64, i int) db.DeliveryKey {
		return db.DeliveryKey{MessageID: id, DeviceID: dev[i], UserID: fmt.Sprintf("u%d", i), Channel: channel(i),
			DueUs: dueUs, First: true}
	}
	write := func(id, execution int64, add func(r *db.RecordResultsParams)) db.ChunkWritten {
		w := db.ChunkWrite{MessageID: id, FailureEvents: true, WithheldEvents: true}
		if execution != 0 {
			w.Executions = map[int32]int64{0: execution}
		}
		add(&w.Results)
		out, err := db.WriteChunks(ctx, tdb.Pool, []db.ChunkWrite{w})
		require.NoError(t, err)
		return out[0]
	}
	// all is one execution's results of the seven devices.
	all := func(id int64) func(r *db.RecordResultsParams) {
		return func(r *db.RecordResultsParams) {
			r.Add(key(id, 1), "accepted", "", dueUs+1_000, dueUs+1_210)
			r.Add(key(id, 2), "accepted", "", dueUs+100_000, dueUs+120_000)
			r.Add(key(id, 3), "failed", "bad_token", dueUs+30_000, 0)
			r.Add(key(id, 4), "cancelled", "opted_out", 0, 0)
			r.AddThrottled(key(id, 5), "rate_limited", dueUs+40_000, dueUs+2_000_000)
			r.Add(key(id, 6), "accepted", "", dueUs+200_000, dueUs+250_000)
			r.Add(key(id, 7), "expired", "quiet_hours", 0, 0)
		}
	}
	type state struct {
		Counters []int32
		Skews    string
		Ledger   []string
		Events   []string
	}
	read := func(id int64) state {
		var s state
		var pending, accepted, failed, expired, cancelled, optedOut, quietHours int32
		require.NoError(t, tdb.Pool.QueryRow(ctx, `
			SELECT pending_count, accepted_count, failed_count, expired_count, cancelled_count, opted_out_count,
			       quiet_hours_count, skew_histogram::text
			FROM messages WHERE id = $1`, id).Scan(&pending, &accepted, &failed, &expired, &cancelled, &optedOut,
			&quietHours, &s.Skews))
		s.Counters = []int32{pending, accepted, failed, expired, cancelled, optedOut, quietHours}
		rows, err := tdb.Pool.Query(ctx, `
			SELECT concat_ws(' ', device_id - $2 + 1, user_id, channel, status, coalesce(reason, '-'), attempt,
			                 coalesce((attempted_at - due_at)::text, '-'), coalesce((accepted_at - due_at)::text, '-'),
			                 coalesce((not_before - due_at)::text, '-'))
			FROM ledger WHERE message_id = $1 ORDER BY device_id, status`, id, dev[1])
		require.NoError(t, err)
		s.Ledger, err = pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		rows, err = tdb.Pool.Query(ctx, `
			SELECT format('%s %s %s', type, user_id, reason) FROM webhook_events
			WHERE message_id = $1 ORDER BY type, device_id`, id)
		require.NoError(t, err)
		s.Events, err = pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		return s
	}
	count := func(query string, id int64) (n int) {
		require.NoError(t, tdb.Pool.QueryRow(ctx, query, id).Scan(&n))
		return n
	}
	pendingOf := func(id int64) []int64 {
		begun, err := db.BeginChunk(ctx, tdb.Pool, db.Chunk{Snapshot: true, ChunkPendingParams: db.ChunkPendingParams{
			MessageID: id, FirstDevice: dev[1], LastDevice: dev[7]}}, 0)
		require.NoError(t, err)
		var ids []int64
		for _, p := range begun.Pending {
			ids = append(ids, p.DeviceID-dev[1]+1)
		}
		return ids
	}

	rows, runs := message(), message()
	require.Equal(t, db.ChunkWritten{Accepted: 3, Failed: 1, Expired: 1}, write(rows, 0, all(rows)))
	require.Equal(t, db.ChunkWritten{Accepted: 3, Failed: 1, Expired: 1}, write(runs, 41, all(runs)))
	want := read(rows)
	require.Equal(t, []int32{1, 3, 1, 1, 1, 1, 1}, want.Counters,
		"pending, accepted, failed, expired, cancelled, opted out, quiet hours")
	require.Equal(t, []string{
		"1 u1 fcm accepted - 1 00:00:00.001 00:00:00.00121 -",
		"2 u2 fcm accepted - 1 00:00:00.1 00:00:00.12 -",
		"3 u3 apns failed bad_token 1 00:00:00.03 - -",
		"4 u4 fcm cancelled opted_out 0 - - -",
		"5 u5 fcm pending rate_limited 1 00:00:00.04 - 00:00:02",
		"6 u6 apns accepted - 1 00:00:00.2 00:00:00.25 -",
		"7 u7 fcm expired quiet_hours 0 - - -",
	}, want.Ledger)
	require.Equal(t, want, read(runs), "written with runs")
	// The API's listing, whole, a page at a time and by status.
	list := func(id int64, status string, after int64, page int32) []db.ListDeliveriesRow {
		p := db.ListDeliveriesParams{MessageID: id, AfterDeviceID: after, PageSize: page}
		if status != "" {
			p.Status = &status
		}
		got, err := db.On(tdb.Pool).ListAllDeliveries(ctx, p)
		require.NoError(t, err)
		return got
	}
	for _, status := range []string{"", "accepted", "pending", "failed", "cancelled"} {
		require.Equal(t, list(rows, status, 0, 100), list(runs, status, 0, 100), "listed, status %q", status)
	}
	require.Len(t, list(runs, "accepted", 0, 100), 3)
	require.Equal(t, list(rows, "", dev[1], 2), list(runs, "", dev[1], 2), "a page after the first device")
	// A device moved to another user since was sent as its former owner's:
	// the ledger names that owner, a run as a row does.
	_, err = tdb.Pool.Exec(ctx, "WITH u AS (INSERT INTO users (id) VALUES ('mover')) UPDATE devices SET user_id = 'mover' WHERE id = $1", dev[1])
	require.NoError(t, err)
	require.Equal(t, list(rows, "", 0, 100), list(runs, "", 0, 100), "listed after a move")
	require.Equal(t, "u1", list(runs, "", 0, 100)[0].UserID)
	require.Equal(t, want, read(runs), "the ledger after a move")
	// Every other reader of the ledger: the waves, the per-app counts, the
	// dashboard's skews and failures, the receipts' early flag.
	q := db.On(tdb.Pool)
	readers := func(id int64) []any {
		waves, err := q.MessageWaves(ctx, id)
		require.NoError(t, err)
		apps, err := q.MessageAppCounts(ctx, id)
		require.NoError(t, err)
		skews, err := q.SkewHistogram(ctx, db.SkewHistogramParams{MessageID: id, Buckets: 10})
		require.NoError(t, err)
		failures, err := q.FailureReasons(ctx, id)
		require.NoError(t, err)
		receipts, err := q.RecordReceipts(ctx, db.RecordReceiptsParams{MessageIds: []int64{id, id, id},
			DeviceIds: []int64{dev[1], dev[5], dev[6]}, Events: []string{"delivered", "delivered", "delivered"},
			DeviceAtUs: []int64{0, 0, 0}})
		require.NoError(t, err)
		early, err := q.EarlyUnaccepted(ctx, []int64{id})
		require.NoError(t, err)
		var flags []bool
		require.NoError(t, tdb.Pool.QueryRow(ctx, "SELECT array_agg(early ORDER BY device_id) FROM receipts WHERE message_id = $1", id).Scan(&flags))
		for i := range receipts {
			receipts[i].MessageID, receipts[i].SkewMs = 0, 0
		}
		slices.SortFunc(receipts, func(a, b db.RecordReceiptsRow) int { return cmp.Compare(a.DeviceID, b.DeviceID) })
		for i := range early {
			early[i].MessageID = 0
		}
		return []any{waves, apps, skews, failures, receipts, early, flags}
	}
	seen := readers(runs)
	require.Equal(t, readers(rows), seen)
	require.Equal(t, []bool{false, true, false}, seen[6], "the throttled device's receipt alone is early")
	require.Equal(t, int32(3), seen[0].([]db.MessageWavesRow)[0].Accepted)
	require.Equal(t, 1, count("SELECT count(*) FROM accepted_runs WHERE message_id = $1", runs))
	require.Equal(t, 3, count("SELECT cardinality(devices) FROM accepted_runs WHERE message_id = $1", runs))
	require.Equal(t, 4, count("SELECT count(*) FROM deliveries WHERE message_id = $1", runs), "the acceptances have no row")
	require.Equal(t, []int64{5}, pendingOf(runs), "a chunk begun again reads the throttled delivery alone")
	// Written again as results that may exist (a write whose commit went
	// unacknowledged, jobs' ledger.lost), nothing changes.
	require.Equal(t, db.ChunkWritten{}, write(runs, 0, func(r *db.RecordResultsParams) {
		all(runs)(r)
		clear(r.First)
	}))
	again := read(runs)
	require.Equal(t, want.Counters, again.Counters, "written twice")
	require.Equal(t, want.Skews, again.Skews, "written twice")
	require.Equal(t, want.Events, again.Events, "written twice")
	require.Equal(t, slices.Delete(slices.Clone(want.Ledger), 4, 5), slices.Delete(again.Ledger, 4, 5),
		"written twice (the throttled delivery counts its attempts, as a row written twice does)")

	// A second execution of the chunk (taken over) read what the first had
	// not written yet and sent devices 1 and 2 again: its acceptances are
	// written once, as rows, the first execution's run kept.
	require.Equal(t, db.ChunkWritten{Accepted: 1}, write(runs, 42, func(r *db.RecordResultsParams) {
		r.Add(key(runs, 1), "accepted", "", dueUs+900_000, dueUs+900_500)
		throttled := key(runs, 5)
		throttled.First = false
		r.Add(throttled, "accepted", "", dueUs+2_100_000, dueUs+2_100_300)
	}), "device 1 was accepted in the first execution's run; device 5 had a row")
	after := read(runs)
	require.Equal(t, []int32{0, 4, 1, 1, 1, 1, 1}, after.Counters)
	require.Equal(t, "1 u1 fcm accepted - 1 00:00:00.001 00:00:00.00121 -", after.Ledger[0], "the first acceptance stands")
	require.Len(t, after.Ledger, 7, "each delivery once")

	// The rows' message gets the same last result; both settle with the
	// same percentiles.
	settle := func(id int64, execution int64) []any {
		w := db.ChunkWrite{MessageID: id, Settle: true}
		if execution != 0 {
			w.Executions = map[int32]int64{0: execution}
		}
		k := key(id, 5)
		k.First = false
		w.Results.Add(k, "accepted", "", dueUs+2_100_000, dueUs+2_100_300)
		_, err := db.WriteChunks(ctx, tdb.Pool, []db.ChunkWrite{w})
		require.NoError(t, err)
		var state string
		// The SLO's skew is the expired delivery's, measured to now.
		var p50, p95, p99, max float64
		require.NoError(t, tdb.Pool.QueryRow(ctx, `
			SELECT state, skew_p50_ms, skew_p95_ms, skew_p99_ms, skew_max_ms FROM messages WHERE id = $1`, id).
			Scan(&state, &p50, &p95, &p99, &max))
		return []any{state, p50, p95, p99, max}
	}
	settled := settle(rows, 0)
	require.Equal(t, "dispatched", settled[0])
	require.Equal(t, settled, settle(runs, 42), "settled alike")

	// A replaced execution's late write after a newer execution's run, and a
	// row written meanwhile (a cancel) under a run's device: each is written
	// again as the upsert, and nothing counts twice.
	late := message()
	require.Equal(t, db.ChunkWritten{Accepted: 1}, write(late, 52, func(r *db.RecordResultsParams) {
		r.Add(key(late, 2), "accepted", "", dueUs+10_000, dueUs+10_100)
	}))
	_, err = tdb.Pool.Exec(ctx, `
		WITH d AS (INSERT INTO deliveries (message_id, device_id, user_id, channel, chunk, due_at, status, reason)
		           VALUES ($1, $2, 'u3', 'apns', 0, $3, 'cancelled', 'device_deleted'))
		UPDATE messages SET pending_count = pending_count - 1, cancelled_count = cancelled_count + 1 WHERE id = $1`,
		late, dev[3], due)
	require.NoError(t, err)
	require.Equal(t, db.ChunkWritten{Accepted: 2}, write(late, 51, func(r *db.RecordResultsParams) {
		r.Add(key(late, 1), "accepted", "", dueUs+5_000, dueUs+5_100)
		r.Add(key(late, 2), "accepted", "", dueUs+6_000, dueUs+6_100)
		r.Add(key(late, 3), "accepted", "", dueUs+7_000, dueUs+7_100)
		r.Add(key(late, 4), "accepted", "", dueUs+8_000, dueUs+8_100)
	}), "device 2 is in the newer execution's run, device 3 cancelled")
	require.Equal(t, db.ChunkWritten{Accepted: 1}, write(late, 52, func(r *db.RecordResultsParams) {
		r.Add(key(late, 4), "accepted", "", dueUs+9_000, dueUs+9_100)
		r.Add(key(late, 5), "accepted", "", dueUs+9_000, dueUs+9_200)
	}), "the newer execution's device 4 was written by the late one")
	got := read(late)
	require.Equal(t, []int32{2, 4, 0, 0, 1, 0, 0}, got.Counters)
	require.Equal(t, []string{
		"1 u1 fcm accepted - 1 00:00:00.005 00:00:00.0051 -",
		"2 u2 fcm accepted - 1 00:00:00.01 00:00:00.0101 -",
		"3 u3 apns cancelled device_deleted 0 - - -",
		"4 u4 fcm accepted - 1 00:00:00.008 00:00:00.0081 -",
		"5 u5 fcm accepted - 1 00:00:00.009 00:00:00.0092 -",
		"6 u6 apns pending - 0 - - -",
		"7 u7 fcm pending - 0 - - -",
	}, got.Ledger)
	require.Equal(t, []int64{6, 7}, pendingOf(late))

	// A receipt that came before its delivery's acceptance is early until
	// a run holds the delivery.
	ahead := message()
	_, err = q.RecordReceipts(ctx, db.RecordReceiptsParams{MessageIds: []int64{ahead}, DeviceIds: []int64{dev[1]},
		Events: []string{"delivered"}, DeviceAtUs: []int64{0}})
	require.NoError(t, err)
	early, err := q.EarlyUnaccepted(ctx, []int64{ahead})
	require.NoError(t, err)
	require.Equal(t, []db.EarlyUnacceptedRow{{MessageID: ahead, Receipts: 1}}, early)
	write(ahead, 61, func(r *db.RecordResultsParams) { r.Add(key(ahead, 1), "accepted", "", dueUs+1_000, dueUs+1_100) })
	early, err = q.EarlyUnaccepted(ctx, []int64{ahead})
	require.NoError(t, err)
	require.Empty(t, early)
}

// TestRunsSettleTheirDevices: a device accepted in a run is settled for
// whatever settles what is pending: its deletion cancels nothing of it,
// even when the run was written while the cancel waited for the message's
// lock (a statement that waited reads the database as it began: the
// cancel locks first, then reads), and a stuck message's expiry counts
// only the devices neither in a run nor with a row.
func TestRunsSettleTheirDevices(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tdb := dbtest.New(t)
	var first int64
	require.NoError(t, tdb.Pool.QueryRow(ctx, `
		WITH u AS (INSERT INTO users (id) VALUES ('a')),
		d AS (INSERT INTO devices (user_id, channel, token, environment)
		      SELECT 'a', 'fcm', 'tok-' || i, 'production' FROM generate_series(1, 4) i RETURNING id)
		SELECT min(id) FROM d`).Scan(&first))
	due := time.Now().Add(-time.Minute).Truncate(time.Microsecond)
	id := snapshotMessage(t, tdb.Pool, due, first, 4)
	counters := func() (pending, accepted, cancelled, expired int) {
		require.NoError(t, tdb.Pool.QueryRow(ctx, `
			SELECT pending_count, accepted_count, cancelled_count, expired_count FROM messages WHERE id = $1`, id).
			Scan(&pending, &accepted, &cancelled, &expired))
		return
	}

	// A ledger write holds the message's lock while the first device's
	// deletion waits for it, and writes that device's run.
	writer, err := tdb.Pool.Begin(ctx)
	require.NoError(t, err)
	defer writer.Rollback(ctx) //nolint:errcheck // after the commit, a no-op
	_, err = writer.Exec(ctx, "SELECT id FROM messages WHERE id = $1 FOR UPDATE", id)
	require.NoError(t, err)
	cancelled := make(chan error, 1)
	go func() {
		tx, err := tdb.Pool.Begin(ctx)
		if err == nil {
			err = db.On(tx).CancelPendingForDevices(ctx, db.CancelPendingOfDevicesParams{
				DeviceIds: []int64{first, first + 1}, Reason: db.ReasonDeviceDeleted})
			if err == nil {
				err = tx.Commit(ctx)
			}
		}
		cancelled <- err
	}()
	require.Eventually(t, func() bool {
		var waiting bool
		require.NoError(t, tdb.Pool.QueryRow(ctx, `
			SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock')`).
			Scan(&waiting))
		return waiting
	}, 10*time.Second, 5*time.Millisecond, "the cancel waits for the message")
	_, err = writer.Exec(ctx, `
		INSERT INTO accepted_runs (message_id, chunk, execution, due_at, first_device, last_device, devices, user_ids,
		                           attempted_us, accepted_us)
		VALUES ($1, 0, 7, $2, $3, $3, ARRAY[$3::bigint], ARRAY['a'], ARRAY[1::bigint], ARRAY[2::bigint])`, id, due, first)
	require.NoError(t, err)
	_, err = writer.Exec(ctx, "UPDATE messages SET pending_count = 3, accepted_count = 1 WHERE id = $1", id)
	require.NoError(t, err)
	require.NoError(t, writer.Commit(ctx))
	require.NoError(t, <-cancelled)
	pending, accepted, cancelledN, _ := counters()
	require.Equal(t, []int{2, 1, 1}, []int{pending, accepted, cancelledN}, "the second device cancelled, the first accepted")
	var rows int
	require.NoError(t, tdb.Pool.QueryRow(ctx, "SELECT count(*) FROM ledger WHERE message_id = $1", id).Scan(&rows))
	require.Equal(t, 4, rows, "each device once")

	// The message is stuck: its expiry expires the two devices left.
	expired, err := db.On(tdb.Pool).ExpireStuckDeliveries(ctx, id)
	require.NoError(t, err)
	require.Equal(t, []db.ExpireStuckDeliveriesRow{{Channel: "fcm", Expired: 2}}, expired)
	pending, accepted, cancelledN, expiredN := counters()
	require.Equal(t, []int{0, 1, 1, 2}, []int{pending, accepted, cancelledN, expiredN})
}

// snapshotMessage schedules a message due at due to the n devices from
// first on, one chunk of a snapshot, as ExpandAudience does, and returns
// its id.
func snapshotMessage(t *testing.T, pool *pgxpool.Pool, due time.Time, first int64, n int) int64 {
	t.Helper()
	var id int64
	require.NoError(t, pool.QueryRow(context.Background(), `
		WITH p AS (INSERT INTO payloads (content) VALUES ('{}') RETURNING id),
		m AS (INSERT INTO messages (state, priority, dispatch_at, expires_at, payload_id, audience, device_count, chunk_count,
		                            pending_count)
		      SELECT 'dispatching', 'bulk', $1, $1::timestamptz + interval '1 hour', p.id, '{}', $3, 1, $3 FROM p
		      RETURNING id),
		c AS (INSERT INTO chunk_devices (message_id, chunk, due_at, first_device, last_device, devices)
		      SELECT m.id, 0, $1, $2::bigint, $2::bigint + $3 - 1,
		             ARRAY(SELECT generate_series($2::bigint, $2::bigint + $3 - 1)) FROM m),
		j AS (INSERT INTO message_chunks (message_id, chunk, job_id, due_at, device_count) SELECT m.id, 0, 1, $1, $3 FROM m)
		SELECT id FROM m`, due, first, n).Scan(&id))
	return id
}
