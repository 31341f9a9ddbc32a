package db_test

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/heraldpush/herald/db"
	"github.com/heraldpush/herald/db/dbtest"
)

// TestWriteChunk writes a two-chunk message's results: the counters move
// with the ledger, a failing write leaves nothing behind, and the last
// write settles the message with its skew.
func TestWriteChunk(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tdb := dbtest.New(t)
	due := time.Now().Add(-time.Second).Truncate(time.Microsecond)
	var id int64
	require.NoError(t, tdb.Pool.QueryRow(ctx, `
		WITH p AS (INSERT INTO payloads (content) VALUES ('{}') RETURNING id)
		INSERT INTO messages (state, priority, dispatch_at, expires_at, payload_id, audience, device_count, chunk_count, pending_count)
		SELECT 'dispatching', 'bulk', $1, $1::timestamptz + interval '1 hour', p.id, '{}', 3, 2, 3 FROM p
		RETURNING id`, due).Scan(&id))
	_, err := tdb.Pool.Exec(ctx, `
		INSERT INTO deliveries (message_id, device_id, user_id, channel, chunk, due_at)
		VALUES ($1, 1, 'a', 'apns', 0, $2), ($1, 2, 'b', 'fcm', 0, $2), ($1, 3, 'c', 'fcm', 1, $2)`, id, due)
	require.NoError(t, err)
	_, err = tdb.Pool.Exec(ctx, `
		INSERT INTO message_chunks (message_id, chunk, job_id, due_at, device_count)
		VALUES ($1, 0, 100, $2, 2), ($1, 1, 101, $2, 1)`, id, due)
	require.NoError(t, err)

	at := due.Add(150 * time.Millisecond)
	write := func(chunk int32, devices []int64, status string) (db.ChunkWritten, error) {
		w := db.ChunkWrite{
			MessageID: id,
			Chunks:    []db.RecordChunkParams{{MessageID: id, Chunk: chunk, StartedAt: &due, FinishedAt: &at}},
			Settle:    true,
		}
		for _, d := range devices {
			w.Results.Add(db.DeliveryKey{MessageID: id, DeviceID: d, UserID: "test", Channel: "apns"}, status, "", at.UnixMicro(), at.UnixMicro())
		}
		out, err := db.WriteChunks(ctx, tdb.Pool, []db.ChunkWrite{w})
		if err != nil {
			return db.ChunkWritten{}, err
		}
		return out[0], nil
	}
	counters := func() (pending, accepted int32, state string) {
		require.NoError(t, tdb.Pool.QueryRow(ctx,
			"SELECT pending_count, accepted_count, state FROM messages WHERE id = $1", id).Scan(&pending, &accepted, &state))
		return
	}
	recorded := func(chunk int) bool {
		var ok bool
		require.NoError(t, tdb.Pool.QueryRow(ctx,
			"SELECT recorded_at IS NOT NULL FROM message_chunks WHERE message_id = $1 AND chunk = $2", id, chunk).Scan(&ok))
		return ok
	}

	out, err := write(0, []int64{1, 2}, "accepted")
	require.NoError(t, err)
	require.Equal(t, int32(2), out.Accepted)
	require.Empty(t, out.Settled, "one delivery is still pending")
	pending, accepted, state := counters()
	require.Equal(t, []any{int32(1), int32(2), "dispatching"}, []any{pending, accepted, state})
	require.True(t, recorded(0))

	// A status the ledger refuses fails the last statement but one: the
	// chunk's timings, written before it, are rolled back with it.
	_, err = write(1, []int64{3}, "delivered")
	require.Error(t, err)
	require.False(t, recorded(1), "a failed write leaves nothing behind")
	pending, accepted, _ = counters()
	require.Equal(t, []any{int32(1), int32(2)}, []any{pending, accepted})

	out, err = write(1, []int64{3}, "accepted")
	require.NoError(t, err)
	require.Equal(t, "dispatched", out.Settled)
	require.Equal(t, "bulk", out.Priority)
	require.NotNil(t, out.SLOSkewMs, "the settling write carries the SLO's number")
	require.InDelta(t, 150, *out.SLOSkewMs, 0.1)
	var skewMax float64
	require.NoError(t, tdb.Pool.QueryRow(ctx, "SELECT skew_max_ms FROM messages WHERE id = $1", id).Scan(&skewMax))
	require.InDelta(t, 150, skewMax, 0.1)

	// Written again (a retried chunk), nothing moves twice.
	out, err = write(1, []int64{3}, "accepted")
	require.NoError(t, err)
	require.Zero(t, out.Accepted)
	require.Empty(t, out.Settled)
	require.Nil(t, out.SLOSkewMs, "only the write that settled a message reports it")
}

// TestSettleGradesTheSLO checks the number SettleMessage grades a message
// by: the latest of its due deliveries' answers, a refusal counting by its
// answer, and a delivery that expired unsent past the second whatever the
// rest did; a local-time delivery whose time had passed (chunk -1) was
// never due and does not count.
func TestSettleGradesTheSLO(t *testing.T) {
	t.Parallel()
	type delivery struct {
		chunk  int
		status string
		after  time.Duration
	}
	for _, tc := range []struct {
		name       string
		deliveries []delivery
		state      string
		// min and max bound slo_skew_ms; skewMax is skew_max_ms, over
		// the accepted ones only (nil: none).
		min, max float64
		skewMax  *float64
	}{
		{"the last device 3 s late", []delivery{{0, "accepted", 100 * time.Millisecond}, {0, "accepted", 3 * time.Second}},
			"dispatched", 3000, 3000, ptr(3000.0)},
		{"a refusal answered late", []delivery{{0, "accepted", 100 * time.Millisecond}, {0, "failed", 1200 * time.Millisecond}},
			"dispatched", 1200, 1200, ptr(100.0)},
		{"every device refused at once", []delivery{{0, "failed", 40 * time.Millisecond}},
			"dispatched", 40, 40, nil},
		{"one device expired unsent", []delivery{{0, "accepted", 100 * time.Millisecond}, {0, "expired", 0}},
			"dispatched", 1001, 1e9, ptr(100.0)},
		{"everything expired unsent", []delivery{{0, "expired", 0}, {0, "expired", 0}},
			"expired", 1001, 1e9, nil},
		{"a passed local time is not due", []delivery{{-1, "expired", 0}, {0, "accepted", 80 * time.Millisecond}},
			"dispatched", 80, 80, ptr(80.0)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			tdb := dbtest.New(t)
			due := time.Now().Add(-time.Hour).Truncate(time.Microsecond)
			n := len(tc.deliveries)
			var id int64
			require.NoError(t, tdb.Pool.QueryRow(ctx, `
				WITH p AS (INSERT INTO payloads (content) VALUES ('{}') RETURNING id)
				INSERT INTO messages (state, priority, dispatch_at, expires_at, payload_id, audience, device_count, chunk_count, pending_count)
				SELECT 'dispatching', 'urgent', $1, $1::timestamptz + interval '1 minute', p.id, '{}', $2, 1, $2 FROM p
				RETURNING id`, due, n).Scan(&id))
			w := db.ChunkWrite{MessageID: id, Settle: true}
			for i, d := range tc.deliveries {
				_, err := tdb.Pool.Exec(ctx, `
					INSERT INTO deliveries (message_id, device_id, user_id, channel, chunk, due_at)
					VALUES ($1, $2, 'u', 'fcm', $3, $4)`, id, i+1, d.chunk, due)
				require.NoError(t, err)
				at := due.Add(d.after).UnixMicro()
				switch d.status {
				case "accepted":
					w.Results.Add(db.DeliveryKey{MessageID: id, DeviceID: int64(i + 1), UserID: "test", Channel: "apns"}, d.status, "", at, at)
				case "failed":
					w.Results.Add(db.DeliveryKey{MessageID: id, DeviceID: int64(i + 1), UserID: "test", Channel: "apns"}, d.status, "unregistered", at, 0)
				default:
					w.Results.Add(db.DeliveryKey{MessageID: id, DeviceID: int64(i + 1), UserID: "test", Channel: "apns"}, d.status, "", 0, 0)
				}
			}
			out, err := db.WriteChunks(ctx, tdb.Pool, []db.ChunkWrite{w})
			require.NoError(t, err)
			require.Equal(t, tc.state, out[0].Settled)
			require.Equal(t, "urgent", out[0].Priority)
			require.NotNil(t, out[0].SLOSkewMs)
			require.GreaterOrEqual(t, *out[0].SLOSkewMs, tc.min)
			require.LessOrEqual(t, *out[0].SLOSkewMs, tc.max)
			var stored, skewMax *float64
			require.NoError(t, tdb.Pool.QueryRow(ctx, "SELECT slo_skew_ms, skew_max_ms FROM messages WHERE id = $1", id).Scan(&stored, &skewMax))
			require.Equal(t, out[0].SLOSkewMs, stored, "stored as reported")
			require.Equal(t, tc.skewMax, skewMax)
		})
	}
}

func ptr[T any](v T) *T { return &v }

// TestBatchIsOneTransaction checks what WriteChunks relies on: a batch sent
// outside a transaction runs as one implicit transaction, in which a local
// setting holds, and after which it is gone. (The test cluster runs with
// synchronous_commit off already, so a setting of Herald's own shows it.)
func TestBatchIsOneTransaction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tdb := dbtest.New(t)
	conn, err := tdb.Pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()

	var first, second, inside string
	b := &pgx.Batch{}
	b.Queue("SELECT set_config('herald.probe', 'set', true)")
	b.Queue("SELECT txid_current()::text").QueryRow(func(r pgx.Row) error { return r.Scan(&first) })
	b.Queue("SELECT current_setting('herald.probe', true)").QueryRow(func(r pgx.Row) error { return r.Scan(&inside) })
	b.Queue("SELECT txid_current()::text").QueryRow(func(r pgx.Row) error { return r.Scan(&second) })
	require.NoError(t, conn.SendBatch(ctx, b).Close())
	require.Equal(t, "set", inside)
	require.Equal(t, first, second, "one transaction")

	var after, txAfter string
	require.NoError(t, conn.QueryRow(ctx, "SELECT coalesce(current_setting('herald.probe', true), '')").Scan(&after))
	require.Empty(t, after, "the setting ended with the batch's transaction")
	require.NoError(t, conn.QueryRow(ctx, "SELECT txid_current()::text").Scan(&txAfter))
	require.NotEqual(t, first, txAfter)
}

// TestLedgerWritesWaitForASynchronousStandby: a ledger write commits
// without waiting for its WAL (synchronous_commit off), unless the server
// has a synchronous standby: then it waits as the server's commits do, so
// that a result acknowledged to the worker survives a failover to that
// standby. Before, it was off there too, and the results a worker wrote in
// a primary's last moments were gone on the promoted standby, some sent
// twice and some left pending under a completed chunk.
func TestLedgerWritesWaitForASynchronousStandby(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	setting := func(pool interface {
		Begin(context.Context) (pgx.Tx, error)
	}) string {
		var got string
		require.NoError(t, db.InTx(ctx, pool, func(tx pgx.Tx) error {
			if err := db.New(tx).CommitWithoutWaitingForDisk(ctx); err != nil {
				return err
			}
			return tx.QueryRow(ctx, "SHOW synchronous_commit").Scan(&got)
		}))
		return got
	}
	require.Equal(t, "off", setting(dbtest.New(t).Pool), "no standby")
	pair := dbtest.NewPair(t, true)
	require.Equal(t, "on", setting(pair.Pool()), "a synchronous standby")
}

// TestBeginChunk starts a scheduled message, finds a started one as it is,
// leaves a cancelled one alone, and reads the chunk's pending devices, with
// their tokens, and the payload in the same round trip.
func TestBeginChunk(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tdb := dbtest.New(t)
	var d1, d2, d3 int64
	require.NoError(t, tdb.Pool.QueryRow(ctx, `
		WITH u AS (INSERT INTO users (id) VALUES ('a'), ('b')),
		d AS (INSERT INTO devices (user_id, channel, token, p256dh, auth, environment)
		      VALUES ('a', 'apns', 'tok-a', NULL, NULL, 'sandbox'), ('b', 'webpush', 'https://push.example/b', 'K', 'A', 'production'),
		             ('b', 'fcm', 'tok-b', NULL, NULL, 'production')
		      RETURNING id)
		SELECT min(id), min(id) + 1, max(id) FROM d`).Scan(&d1, &d2, &d3))
	chunkOf := func(message, first, last int64) db.Chunk {
		return db.Chunk{ChunkPendingParams: db.ChunkPendingParams{MessageID: message, FirstDevice: first, LastDevice: last, Chunk: 0}}
	}
	newMessage := func(state string) (id, payload int64) {
		require.NoError(t, tdb.Pool.QueryRow(ctx, `
			WITH p AS (INSERT INTO payloads (content) VALUES ('{"title":"hi"}') RETURNING id)
			INSERT INTO messages (state, priority, dispatch_at, expires_at, payload_id, audience, device_count, chunk_count, pending_count, cancelled_count)
			SELECT $1::text, 'bulk', now(), now() + interval '1 hour', p.id, '{}', 2, 1,
			       CASE WHEN $1::text = 'cancelled' THEN 0 ELSE 2 END, CASE WHEN $1::text = 'cancelled' THEN 2 ELSE 0 END FROM p
			RETURNING id, payload_id`, state).Scan(&id, &payload))
		status := "pending"
		if state == "cancelled" {
			status = "cancelled"
		}
		// Devices 1 and 2 in chunk 0, device 3 in chunk 1.
		_, err := tdb.Pool.Exec(ctx, `
			INSERT INTO deliveries (message_id, device_id, user_id, channel, chunk, due_at, status, locale)
			VALUES ($1, $3, 'a', 'apns', 0, now(), $2, 'de'), ($1, $4, 'b', 'webpush', 0, now(), $2, NULL),
			       ($1, $5, 'b', 'fcm', 1, now(), $2, NULL)`, id, status, d1, d2, d3)
		require.NoError(t, err)
		return id, payload
	}

	id, payload := newMessage("scheduled")
	begun, err := db.BeginChunk(ctx, tdb.Pool, chunkOf(id, d1, d3), payload)
	require.NoError(t, err)
	require.Equal(t, "dispatching", begun.State)
	require.Len(t, begun.Pending, 2, "device 3 is in the range but in another chunk")
	require.Equal(t, db.ChunkPendingRow{DeviceID: d1, Channel: "apns", Locale: new("de"), Token: "tok-a", Environment: "sandbox", AppID: 1, UserID: "a", Written: true}, begun.Pending[0])
	require.Equal(t, db.ChunkPendingRow{DeviceID: d2, Channel: "webpush", Token: "https://push.example/b", P256dh: new("K"), Auth: new("A"), Environment: "production", AppID: 1, UserID: "b", Written: true}, begun.Pending[1])
	require.JSONEq(t, `{"title":"hi"}`, string(begun.Payload))
	var started bool
	require.NoError(t, tdb.Pool.QueryRow(ctx, "SELECT started_at IS NOT NULL FROM messages WHERE id = $1", id).Scan(&started))
	require.True(t, started)

	// A later chunk of it, with the payload cached: no payload read.
	begun, err = db.BeginChunk(ctx, tdb.Pool, chunkOf(id, d2, d2), 0)
	require.NoError(t, err)
	require.Equal(t, "dispatching", begun.State)
	require.Len(t, begun.Pending, 1)
	require.Nil(t, begun.Payload)

	id, payload = newMessage("cancelled")
	begun, err = db.BeginChunk(ctx, tdb.Pool, chunkOf(id, d1, d2), payload)
	require.NoError(t, err)
	require.Equal(t, "cancelled", begun.State, "a cancel that came first wins")
	require.Empty(t, begun.Pending)
}

// TestSnapshotReadDenseOrSparse reads a chunk whose snapshot holds every
// other device of its range, with one evicted, two accepted in a run and one
// throttled (a row), both ways the read finds its devices: walking the key
// over the range (dense: a third of the range's ids or more) and looking
// each up. Both read the same deliveries, and none of the range's devices
// that are not the chunk's.
func TestSnapshotReadDenseOrSparse(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tdb := dbtest.New(t)
	lifePopulation(t, tdb.Pool, 300)
	var first int64
	require.NoError(t, tdb.Pool.QueryRow(ctx, "SELECT min(id) + 100 FROM devices").Scan(&first))
	last := first + 98
	id := snapshotMessage(t, tdb.Pool, time.Now(), first, 50)
	_, err := tdb.Pool.Exec(ctx, `
		WITH c AS (UPDATE chunk_devices SET last_device = $3, devices = ARRAY(SELECT generate_series($2::bigint, $3::bigint, 2))
		           WHERE message_id = $1),
		e AS (UPDATE devices SET status = 'evicted', evicted_reason = 'unregistered', evicted_at = now() WHERE id = $2::bigint + 10),
		r AS (INSERT INTO accepted_runs (message_id, chunk, execution, due_at, first_device, last_device, devices, user_ids,
		                                 attempted_us, accepted_us)
		      SELECT $1, 0, 7, now(), $2::bigint + 2, $2::bigint + 4, ARRAY[$2::bigint + 2, $2::bigint + 4], '{user_a,user_b}',
		             '{1,1}', '{2,2}')
		INSERT INTO deliveries (message_id, device_id, user_id, channel, chunk, due_at, status, reason, attempt, not_before)
		SELECT $1, v.id, v.user_id, v.channel, 0, now(), 'pending', 'rate_limited', 1, now() + interval '1 minute'
		FROM devices v WHERE v.id = $2::bigint + 6`, id, first, last)
	require.NoError(t, err)

	read := func(devices int32) []db.ChunkPendingRow {
		var rows []db.ChunkPendingRow
		require.NoError(t, pgx.BeginFunc(ctx, tdb.Pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, "SELECT set_config('plan_cache_mode', 'force_generic_plan', true)"); err != nil {
				return err
			}
			rows, err = db.On(tx).ChunkPendingOf(ctx, db.Chunk{Snapshot: true, Devices: devices,
				ChunkPendingParams: db.ChunkPendingParams{MessageID: id, FirstDevice: first, LastDevice: last}})
			return err
		}))
		return rows
	}
	dense, sparse, unknown := read(50), read(10), read(0)
	require.Len(t, dense, 48, "the chunk's 50 devices, less the run's two")
	require.Equal(t, sparse, dense)
	require.Equal(t, unknown, dense)
	for _, r := range dense {
		require.Zero(t, (r.DeviceID-first)%2, "device %d is not the chunk's", r.DeviceID)
		require.NotContains(t, []int64{first + 2, first + 4}, r.DeviceID, "accepted in a run")
		require.Equal(t, r.DeviceID == first+10, r.Gone == "device_evicted", "device %d", r.DeviceID)
		require.Equal(t, r.DeviceID == first+6, r.Written, "device %d", r.DeviceID)
	}
}

// TestWriteChunksOfManyMessages writes three messages' results in one write,
// given out of the order of their ids: each message's counters and live
// histogram move by its own deliveries only, a message with nothing to
// write but a close is still settled or left as it is, and out[i] is
// ws[i]'s. Two writers that carry the same messages in opposite orders
// never deadlock: the rows are locked in the order of their ids.
func TestWriteChunksOfManyMessages(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tdb := dbtest.New(t)
	due := time.Now().Add(-time.Second).Truncate(time.Microsecond)
	// Message i has i+1 devices, ids 10i+1...; all pending.
	ids := make([]int64, 3)
	for i := range ids {
		require.NoError(t, tdb.Pool.QueryRow(ctx, `
			WITH p AS (INSERT INTO payloads (content) VALUES ('{}') RETURNING id),
			m AS (INSERT INTO messages (state, priority, dispatch_at, expires_at, payload_id, audience, device_count, chunk_count, pending_count)
			      SELECT 'dispatching', 'bulk', $1, $1::timestamptz + interval '1 hour', p.id, '{}', $2, 1, $2 FROM p
			      RETURNING id),
			d AS (INSERT INTO deliveries (message_id, device_id, user_id, channel, chunk, due_at)
			      SELECT m.id, $3 * 10 + g, 'u', 'fcm', 0, $1 FROM m, generate_series(1, $2) g)
			SELECT id FROM m`, due, i+1, i).Scan(&ids[i]))
	}
	at := func(ms int) int64 { return due.Add(time.Duration(ms) * time.Millisecond).UnixMicro() }
	// Message 2 (three devices): two accepted, at 50 and 500 ms, one failed.
	// Message 0 (one device): accepted at 5 ms, the last of it. Message 1:
	// only a chunk's close, with its two devices still pending.
	w2 := db.ChunkWrite{MessageID: ids[2]}
	w2.Results.Add(db.DeliveryKey{MessageID: ids[2], DeviceID: 21, UserID: "test", Channel: "apns"}, "accepted", "", at(50), at(50))
	w2.Results.Add(db.DeliveryKey{MessageID: ids[2], DeviceID: 22, UserID: "test", Channel: "apns"}, "accepted", "", at(500), at(500))
	w2.Results.Add(db.DeliveryKey{MessageID: ids[2], DeviceID: 23, UserID: "test", Channel: "apns"}, "failed", "unregistered", at(60), 0)
	w0 := db.ChunkWrite{MessageID: ids[0], Settle: true}
	w0.Results.Add(db.DeliveryKey{MessageID: ids[0], DeviceID: 1, UserID: "test", Channel: "apns"}, "accepted", "", at(5), at(5))
	w1 := db.ChunkWrite{MessageID: ids[1], Settle: true}
	out, err := db.WriteChunks(ctx, tdb.Pool, []db.ChunkWrite{w2, w0, w1})
	require.NoError(t, err)
	require.Equal(t, []db.ChunkWritten{{Accepted: 2, Failed: 1}, {Accepted: 1, Settled: "dispatched", Priority: "bulk", SLOSkewMs: ptr(5.0)}, {}}, out,
		"each write's own message; only the one it settled is graded")

	type counts struct {
		Pending, Accepted, Failed int32
		State                     string
		Histogram                 []int32
	}
	read := func(id int64) counts {
		var c counts
		require.NoError(t, tdb.Pool.QueryRow(ctx, `
			SELECT pending_count, accepted_count, failed_count, state, coalesce(skew_histogram, '{}')
			FROM messages WHERE id = $1`, id).Scan(&c.Pending, &c.Accepted, &c.Failed, &c.State, &c.Histogram))
		return c
	}
	// Bucket k holds skews from 1.1^(k-2) to 1.1^(k-1) ms.
	bucket := func(ms float64) int { return 2 + int(math.Floor(math.Log(ms)/math.Log(1.1))) }
	hist := func(skews ...float64) []int32 {
		h := make([]int32, 194)
		for _, s := range skews {
			h[bucket(s)-1]++
		}
		return h
	}
	require.Equal(t, counts{0, 1, 0, "dispatched", hist(5)}, read(ids[0]))
	require.Equal(t, counts{2, 0, 0, "dispatching", []int32{}}, read(ids[1]), "nothing of it written")
	require.Equal(t, counts{0, 2, 1, "dispatching", hist(50, 500)}, read(ids[2]))

	// Message 1's two devices, written by two writers at once, each
	// carrying both messages 1 and 2 in the opposite order; then written
	// again, which changes nothing.
	var deadlocks = func() (n int64) {
		require.NoError(t, tdb.Pool.QueryRow(ctx,
			"SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()").Scan(&n))
		return n
	}
	before := deadlocks()
	var wg sync.WaitGroup
	errs := make(chan error, 40)
	for range 20 {
		for _, device := range []int64{11, 12} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				a := db.ChunkWrite{MessageID: ids[1], Settle: true}
				a.Results.Add(db.DeliveryKey{MessageID: ids[1], DeviceID: device, UserID: "test", Channel: "apns"}, "accepted", "", at(100), at(100))
				b := db.ChunkWrite{MessageID: ids[2], Settle: true}
				ws := []db.ChunkWrite{a, b}
				if device == 12 {
					ws = []db.ChunkWrite{b, a}
				}
				_, err := db.WriteChunks(ctx, tdb.Pool, ws)
				errs <- err
			}()
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.Equal(t, counts{0, 2, 0, "dispatched", hist(100, 100)}, read(ids[1]))
	require.Equal(t, "dispatched", read(ids[2]).State)
	_, err = tdb.Pool.Exec(ctx, "SELECT pg_stat_force_next_flush()")
	require.NoError(t, err)
	require.Equal(t, before, deadlocks())
}

// TestSettleStoresExactPercentiles checks the skew percentiles a message
// keeps once settled: percentile_cont's, over its accepted deliveries
// alone, to a tenth of a millisecond, as computed here by interpolating
// between the nearest ranks.
func TestSettleStoresExactPercentiles(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tdb := dbtest.New(t)
	due := time.Now().Add(-time.Hour).Truncate(time.Second)
	const accepted = 37
	var id int64
	require.NoError(t, tdb.Pool.QueryRow(ctx, `
		WITH p AS (INSERT INTO payloads (content) VALUES ('{}') RETURNING id)
		INSERT INTO messages (state, priority, dispatch_at, expires_at, payload_id, audience, device_count, chunk_count, pending_count)
		SELECT 'dispatching', 'bulk', $1, $1::timestamptz + interval '1 minute', p.id, '{}', $2, 1, $2 FROM p
		RETURNING id`, due, accepted+1).Scan(&id))
	w := db.ChunkWrite{MessageID: id, Settle: true}
	var skews []float64
	for i := range accepted + 1 {
		_, err := tdb.Pool.Exec(ctx, `
			INSERT INTO deliveries (message_id, device_id, user_id, channel, chunk, due_at)
			VALUES ($1, $2, 'u', 'fcm', 0, $3)`, id, i+1, due)
		require.NoError(t, err)
		// Out of order, 7.3 ms apart; one refusal, latest of all.
		after := time.Duration((i*17)%accepted) * 7300 * time.Microsecond
		if i == accepted {
			w.Results.Add(db.DeliveryKey{MessageID: id, DeviceID: int64(i + 1), UserID: "test", Channel: "apns"}, "failed", "unregistered", due.Add(2*time.Second).UnixMicro(), 0)
			continue
		}
		skews = append(skews, float64(after.Microseconds())/1000)
		w.Results.Add(db.DeliveryKey{MessageID: id, DeviceID: int64(i + 1), UserID: "test", Channel: "apns"}, "accepted", "", due.Add(after).UnixMicro(), due.Add(after).UnixMicro())
	}
	_, err := db.WriteChunks(ctx, tdb.Pool, []db.ChunkWrite{w})
	require.NoError(t, err)
	slices.Sort(skews)
	percentile := func(p float64) float64 {
		pos := p * float64(len(skews)-1)
		lo := int(math.Floor(pos))
		v := skews[lo]
		if lo+1 < len(skews) {
			v += (pos - float64(lo)) * (skews[lo+1] - skews[lo])
		}
		return math.Round(v*10) / 10
	}
	var p50, p95, p99, maxSkew, slo float64
	require.NoError(t, tdb.Pool.QueryRow(ctx, `
		SELECT skew_p50_ms, skew_p95_ms, skew_p99_ms, skew_max_ms, slo_skew_ms FROM messages WHERE id = $1`, id).
		Scan(&p50, &p95, &p99, &maxSkew, &slo))
	require.Equal(t, []float64{percentile(0.5), percentile(0.95), percentile(0.99), skews[len(skews)-1], 2000},
		[]float64{p50, p95, p99, maxSkew, slo})
}

// TestFirstResultsWriteAsTheUpsert writes the same results to three
// messages whose ledgers hold the same rows: one with the results marked
// first where the chunk read no row (inserted plainly), one with none
// marked (every row through the upsert), and one with every result marked
// first, including those whose rows exist (a chunk taken over, a message
// cancelled, since the read): that write meets the rows, rolls back, and
// is made again as the upsert. Rows, counters, skew histogram and webhook
// events come out the same in all three, and a row settled before is
// neither changed nor counted again. One result is accepted 1,210 µs
// after its due time, on the edge of a histogram bucket (1.1² ms). The
// same writes again with no webhook wanting events: then the failures and
// withheld deliveries marked first are written and counted as the
// accepted ones are (InsertFirstResults, counted by db.WriteChunks), and
// must come out as the upsert's.
func TestFirstResultsWriteAsTheUpsert(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tdb := dbtest.New(t)
	_, err := tdb.Pool.Exec(ctx, `INSERT INTO webhooks (url, events, secret)
		VALUES ('https://hooks.example.com/', '{delivery.failed,delivery.withheld}', 'whsec_AA==')`)
	require.NoError(t, err)
	due := time.Now().Add(-time.Minute).Truncate(time.Microsecond)
	dueUs := due.UnixMicro()
	message := func() int64 {
		var id int64
		require.NoError(t, tdb.Pool.QueryRow(ctx, `
			WITH p AS (INSERT INTO payloads (content) VALUES ('{}') RETURNING id)
			INSERT INTO messages (state, priority, dispatch_at, expires_at, payload_id, audience, device_count, chunk_count,
			                      pending_count, accepted_count)
			SELECT 'dispatching', 'bulk', $1, $1::timestamptz + interval '1 hour', p.id, '{}', 7, 1, 6, 1 FROM p
			RETURNING id`, due).Scan(&id))
		// Device 1 was throttled (pending, its row written), device 2
		// accepted by an earlier write; 3 to 7 have no row yet.
		_, err := tdb.Pool.Exec(ctx, `
			INSERT INTO deliveries (message_id, device_id, user_id, channel, chunk, due_at, status, reason, attempt,
			                        attempted_at, accepted_at, not_before)
			VALUES ($1, 1, 'u1', 'fcm', 0, $2, 'pending', 'rate_limited', 1, $2, NULL, $2::timestamptz + interval '1 second'),
			       ($1, 2, 'u2', 'apns', 0, $2, 'accepted', NULL, 1, $2, $2::timestamptz + interval '5 milliseconds', NULL)`, id, due)
		require.NoError(t, err)
		return id
	}
	write := func(id int64, events bool, first func(device int64) bool) {
		w := db.ChunkWrite{MessageID: id, FailureEvents: events, WithheldEvents: events}
		key := func(device int64, channel string) db.DeliveryKey {
			return db.DeliveryKey{MessageID: id, DeviceID: device, UserID: fmt.Sprintf("u%d", device), Channel: channel,
				DueUs: dueUs, First: first(device)}
		}
		w.Results.Add(key(1, "fcm"), "accepted", "", dueUs+100_000, dueUs+120_000)
		w.Results.Add(key(2, "apns"), "accepted", "", dueUs+200_000, dueUs+250_000)
		w.Results.Add(key(3, "apns"), "accepted", "", dueUs+1_000, dueUs+1_210)
		w.Results.Add(key(4, "fcm"), "failed", "bad_token", dueUs+30_000, 0)
		w.Results.Add(key(5, "webpush"), "cancelled", "opted_out", 0, 0)
		w.Results.AddThrottled(key(6, "fcm"), "rate_limited", dueUs+40_000, dueUs+2_000_000)
		w.Results.Add(key(7, "webpush"), "expired", "quiet_hours", 0, 0)
		out, err := db.WriteChunks(ctx, tdb.Pool, []db.ChunkWrite{w})
		require.NoError(t, err)
		require.Equal(t, db.ChunkWritten{Accepted: 2, Failed: 1, Expired: 1}, out[0], "device 2 was settled before: not counted again")
	}
	type state struct {
		Counters []int32
		Skews    string
		Rows     []string
		Events   []string
	}
	read := func(id int64) state {
		var s state
		var pending, accepted, failed, expired, cancelled, optedOut, quietHours, capped int32
		require.NoError(t, tdb.Pool.QueryRow(ctx, `
			SELECT pending_count, accepted_count, failed_count, expired_count, cancelled_count, opted_out_count,
			       quiet_hours_count, capped_count, skew_histogram::text
			FROM messages WHERE id = $1`, id).Scan(&pending, &accepted, &failed, &expired, &cancelled, &optedOut,
			&quietHours, &capped, &s.Skews))
		s.Counters = []int32{pending, accepted, failed, expired, cancelled, optedOut, quietHours, capped}
		rows, err := tdb.Pool.Query(ctx, `
			SELECT concat_ws(' ', device_id, user_id, channel, status, coalesce(reason, '-'), attempt,
			                 coalesce((attempted_at - due_at)::text, '-'), coalesce((accepted_at - due_at)::text, '-'),
			                 coalesce((not_before - due_at)::text, '-'))
			FROM deliveries WHERE message_id = $1 ORDER BY device_id`, id)
		require.NoError(t, err)
		s.Rows, err = pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		rows, err = tdb.Pool.Query(ctx, `
			SELECT format('%s %s %s %s', type, device_id, user_id, reason) FROM webhook_events
			WHERE message_id = $1 ORDER BY type, device_id`, id)
		require.NoError(t, err)
		s.Events, err = pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		return s
	}

	marked, upsert, wrong := message(), message(), message()
	write(marked, true, func(device int64) bool { return device > 2 })
	write(upsert, true, func(int64) bool { return false })
	write(wrong, true, func(int64) bool { return true })
	want := read(upsert)
	require.Equal(t, []int32{1, 3, 1, 1, 1, 1, 1, 0}, want.Counters,
		"pending, accepted, failed, expired, cancelled, opted out, quiet hours, capped")
	require.Equal(t, []string{
		"1 u1 fcm accepted - 2 00:00:00.1 00:00:00.12 -",
		"2 u2 apns accepted - 1 00:00:00 00:00:00.005 -",
		"3 u3 apns accepted - 1 00:00:00.001 00:00:00.00121 -",
		"4 u4 fcm failed bad_token 1 00:00:00.03 - -",
		"5 u5 webpush cancelled opted_out 0 - - -",
		"6 u6 fcm pending rate_limited 1 00:00:00.04 - 00:00:02",
		"7 u7 webpush expired quiet_hours 0 - - -",
	}, want.Rows)
	require.Equal(t, []string{"delivery.failed 4 u4 bad_token", "delivery.withheld 5 u5 opted_out",
		"delivery.withheld 7 u7 quiet_hours"}, want.Events)
	require.Equal(t, want, read(marked), "the results marked first")
	require.Equal(t, want, read(wrong), "every result marked first, two of them with rows")

	// No webhook wants events: nothing routes the failure and the withheld
	// deliveries to the upsert.
	_, err = tdb.Pool.Exec(ctx, "DELETE FROM webhook_events")
	require.NoError(t, err)
	quietMarked, quietUpsert := message(), message()
	write(quietMarked, false, func(device int64) bool { return device > 2 })
	write(quietUpsert, false, func(int64) bool { return false })
	want.Events = []string{}
	require.Equal(t, want, read(quietUpsert))
	require.Equal(t, want, read(quietMarked), "the results marked first, no events wanted")
}

// TestSkewBucketIsTheDatabases holds db.WriteChunks' own count of the
// accepted results it inserts (skewBucket) to RecordResults' count in the
// database: the bucket of skew_histogram_bucket for the skew
// date_part('epoch', accepted_at - due_at) * 1000, on every bucket's edges
// (to the microsecond either side), under a millisecond, below zero and
// over a day (the interval carries its days apart).
func TestSkewBucketIsTheDatabases(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tdb := dbtest.New(t)
	skews := []int64{-90_000_000_000, -1, 0, 1, 999, 1_000, 1_001, 86_400_000_000, 86_400_000_001, 93_600_123_456,
		200 * 86_400_000_000}
	for k := 1; k <= 200; k++ {
		edge := int64(math.Round(1_000 * math.Pow(1.1, float64(k))))
		skews = append(skews, edge-1, edge, edge+1)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 2_000 {
		skews = append(skews, rng.Int64N(120_000_000))
	}
	const due = int64(1_796_000_000_000_000)
	rows, err := tdb.Pool.Query(ctx, `
		SELECT s, skew_histogram_bucket(date_part('epoch', (to_timestamp(0) + ($1::bigint + s) * interval '1 microsecond')
		                                               - (to_timestamp(0) + $1::bigint * interval '1 microsecond')) * 1000)
		FROM unnest($2::bigint[]) s`, due, skews)
	require.NoError(t, err)
	type bucketed struct {
		Skew   int64
		Bucket int32
	}
	got, err := pgx.CollectRows(rows, pgx.RowToStructByPos[bucketed])
	require.NoError(t, err)
	require.Len(t, got, len(skews))
	for _, g := range got {
		require.Equal(t, g.Bucket, db.SkewBucket(g.Skew), "a skew of %d µs", g.Skew)
	}
}
