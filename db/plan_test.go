package db_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/heraldpush/herald/db"
	"github.com/heraldpush/herald/db/dbtest"
)

// TestLedgerPlansUseThePrimaryKey checks the generic plans of the two
// queries every chunk runs against the ledger, on the statistics a young
// table has (analyzed while empty, as after a deployment) and on those of a
// ledger with history (analyzed when nearly every row had settled): the rows
// must be found through the primary key on both its columns, never by
// scanning a message's deliveries or ANDing the pending index in, and the
// chunk must not be joined by a nested loop that compares every row with
// every row. Such plans cost 70 ms a write instead of 5 at 500 devices a
// chunk, and 700 ms on a ledger of 5 M settled rows.
func TestLedgerPlansUseThePrimaryKey(t *testing.T) {
	t.Parallel()
	for name, stats := range map[string]struct{ settled, pending int }{
		"young":   {0, 0},
		"history": {40, 0},
		// As the bench's: analyzed when only the messages being sent, each
		// to devices of its own, were in the ledger.
		"pending": {0, 5},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			testLedgerPlans(t, stats.settled, stats.pending)
		})
	}
}

// testLedgerPlans analyzes a ledger of settled messages of 2,000 rows each
// and of pending messages of 10,000 devices of their own, then adds a
// pending message and checks the plans.
func testLedgerPlans(t *testing.T, settled, pending int) {
	ctx := context.Background()
	tdb := dbtest.New(t)
	conn, err := tdb.Pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	_, err = conn.Exec(ctx, `
		INSERT INTO deliveries (message_id, device_id, user_id, channel, chunk, due_at, status, attempt, accepted_at)
		SELECT m, g, 'u' || g, 'apns', g / 500, now(), 'accepted', 1, now()
		FROM generate_series(2, $1::integer + 1) m, generate_series(1, 2000) g`, settled)
	require.NoError(t, err)
	_, err = conn.Exec(ctx, `
		INSERT INTO deliveries (message_id, device_id, user_id, channel, chunk, due_at)
		SELECT -m, m * 100000 + g, 'u' || g, 'apns', g / 500, now()
		FROM generate_series(1, $1::integer) m, generate_series(1, 10000) g`, pending)
	require.NoError(t, err)
	_, err = conn.Exec(ctx, "ANALYZE deliveries")
	require.NoError(t, err)
	_, err = conn.Exec(ctx, `
		INSERT INTO deliveries (message_id, device_id, user_id, channel, chunk, due_at)
		SELECT 1, g, 'u' || g, 'apns', g / 500, now() FROM generate_series(1, 20000) g`)
	require.NoError(t, err)
	_, err = conn.Exec(ctx, "SET plan_cache_mode = force_generic_plan")
	require.NoError(t, err)

	for name, query := range map[string]string{"RecordResults": db.RecordResultsSQL, "ChunkPending": db.ChunkPendingSQL,
		"ChunkSnapshotPending": db.ChunkSnapshotPendingSQL} {
		_, err := conn.Exec(ctx, fmt.Sprintf("PREPARE %s AS %s", strings.ToLower(name), query))
		require.NoError(t, err)
		// RecordResults finds a chunk's rows by their ids (the insert's
		// arbiter), ChunkPending by the chunk's range of them,
		// ChunkSnapshotPending each of its snapshot's devices' rows by its
		// id.
		args, cond := "1, 1, 500, 0", "(message_id = $1) AND (device_id >= $2) AND (device_id <= $3)"
		switch name {
		case "RecordResults":
			args = `'{1,1,1}', '{1,2,3}', '{u1,u2,u3}', '{apns,apns,apns}', '{0,0,0}', '{1,1,1}', '{accepted,accepted,failed}', '{"","",bad_token}', '{1,1,1}', '{1,1,0}', '{0,0,0}', '{f,f,f}', true, true, '{1}', '{accepted}', '{1}', '{""}', '{1}'`
			cond = "Conflict Arbiter Indexes: deliveries_pkey"
		case "ChunkSnapshotPending":
			args = "1, true, 1, 500, 0"
			cond = "(message_id = $1) AND (device_id >= $3) AND (device_id <= $4)"
		}
		p := explain(t, conn, fmt.Sprintf("EXECUTE %s(%s)", strings.ToLower(name), args))
		require.Contains(t, p, "deliveries_pkey", "%s:\n%s", name, p)
		require.Contains(t, p, cond, "%s: the primary key on both columns:\n%s", name, p)
		require.NotContains(t, p, "deliveries_pending_device_idx", "%s:\n%s", name, p)
		require.NotRegexp(t, `Join Filter: .*device_id`, p, "%s: a nested loop comparing every row:\n%s", name, p)
		require.NotContains(t, p, "Seq Scan on deliveries", "%s:\n%s", name, p)
	}
}

// TestCancelForDevicesFindsPendingByMessage checks the generic plan of the
// cancel that erasing a device runs, on a ledger of settled messages with
// one still dispatching: without an index on the status, the pending
// deliveries must be found through the messages that have not settled and
// the primary key on both its columns, never by scanning the ledger.
func TestCancelForDevicesFindsPendingByMessage(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tdb := dbtest.New(t)
	conn, err := tdb.Pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	_, err = conn.Exec(ctx, `
		WITH p AS (INSERT INTO payloads (content) VALUES ('{}') RETURNING id)
		INSERT INTO messages (state, priority, dispatch_at, expires_at, payload_id, audience,
		                      device_count, chunk_count, pending_count, accepted_count)
		SELECT CASE WHEN m = 41 THEN 'dispatching' ELSE 'dispatched' END, 'bulk', now(), now() + interval '1 hour',
		       p.id, '{}', 2000, 4, CASE WHEN m = 41 THEN 2000 ELSE 0 END, CASE WHEN m = 41 THEN 0 ELSE 2000 END
		FROM p, generate_series(1, 41) m`)
	require.NoError(t, err)
	_, err = conn.Exec(ctx, `
		INSERT INTO deliveries (message_id, device_id, user_id, channel, chunk, due_at, status, attempt, accepted_at)
		SELECT m.id, g, 'u' || g, 'apns', g / 500, now(),
		       CASE WHEN m.state = 'dispatching' THEN 'pending' ELSE 'accepted' END, 1, now()
		FROM messages m, generate_series(1, 2000) g`)
	require.NoError(t, err)
	_, err = conn.Exec(ctx, "ANALYZE deliveries, messages")
	require.NoError(t, err)
	_, err = conn.Exec(ctx, "SET plan_cache_mode = force_generic_plan")
	require.NoError(t, err)
	_, err = conn.Exec(ctx, "PREPARE cancel AS "+db.CancelPendingForDevicesSQL)
	require.NoError(t, err)
	p := explain(t, conn, "EXECUTE cancel('{1,2,3}', '{}', 'device_deleted', false)")
	require.Contains(t, p, "deliveries_pkey", p)
	require.Regexp(t, `\(message_id = m(_\d+)?\.id\) AND \(device_id = ANY \(\$1\)\)`, p, "the primary key on both columns:\n%s", p)
	require.NotContains(t, p, "Seq Scan on deliveries", p)
}

// explain returns the plan of stmt on conn, one line a node.
func explain(t *testing.T, conn *pgxpool.Conn, stmt string) string {
	rows, err := conn.Query(context.Background(), "EXPLAIN "+stmt)
	require.NoError(t, err)
	var plan strings.Builder
	for rows.Next() {
		var line string
		require.NoError(t, rows.Scan(&line))
		plan.WriteString(line + "\n")
	}
	require.NoError(t, rows.Err())
	return plan.String()
}

// TestChunkStatementsReadOnlyTheChunk runs a message's chunk starts and
// result writes as the fan-out does, through the pool's prepared
// statements, on a ledger whose statistics come from settled messages only
// (as they do in service: ANALYZE never saw the message being sent), and
// counts the primary-key entries PostgreSQL read. A custom plan expected
// one row of the unknown message and read all of the message's entries for
// every chunk; the generic plans (UseLedgerPlans) read the chunk's.
func TestChunkStatementsReadOnlyTheChunk(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := oneConnection(t)
	_, err := pool.Exec(ctx, `
		INSERT INTO deliveries (message_id, device_id, user_id, channel, chunk, due_at, status, attempt, accepted_at)
		SELECT -m, g, 'u' || g, 'apns', g / 500, now(), 'accepted', 1, now()
		FROM generate_series(1, 40) m, generate_series(1, 2000) g`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, "ANALYZE deliveries")
	require.NoError(t, err)
	const devices = 4000
	lifePopulation(t, pool, devices)
	id, payload := scheduleLifeMessage(t, pool, devices, false)
	read := func() int64 {
		var n int64
		_, err := pool.Exec(ctx, "SELECT pg_stat_force_next_flush()")
		require.NoError(t, err)
		require.NoError(t, pool.QueryRow(ctx,
			"SELECT idx_tup_read FROM pg_stat_user_indexes WHERE indexrelname = 'deliveries_pkey'").Scan(&n))
		return n
	}
	before := read()
	fanOutLifeMessage(t, pool, func() time.Duration { return 0 }, id, payload, devices, false, false)
	// Each chunk's devices are read at its start, twice by its write
	// (the insert's check for the row, then the row it updates: these are
	// pending rows) and the message's once more when it settles (its
	// skew): 4 x 4,000. Plans that scan the message read all 4,000 in each
	// of its writes (a start reads its chunk's range of the primary key on
	// any plan).
	require.LessOrEqual(t, read()-before, int64(4*devices))
}

// TestChunkReadLooksUpPreferencesOnlyWhenAny reads a chunk's devices, as
// its start does, first while no user has preferences and then while every
// user has: without any, the read looks at user_preferences once (whether
// it holds a row), not once a device (a seq scan of the empty table for
// each, a system call apiece); with them, each device's user is looked up
// through the primary key, never by reading the table for each. Both
// reads of a snapshot chunk and of one written with rows.
func TestChunkReadLooksUpPreferencesOnlyWhenAny(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := oneConnection(t)
	const devices = 1000
	lifePopulation(t, pool, devices)
	scans := func() (seq, idx int64) {
		_, err := pool.Exec(ctx, "SELECT pg_stat_force_next_flush()")
		require.NoError(t, err)
		require.NoError(t, pool.QueryRow(ctx, `
			SELECT seq_scan, coalesce(idx_scan, 0) FROM pg_stat_user_tables WHERE relname = 'user_preferences'`).Scan(&seq, &idx))
		return seq, idx
	}
	for _, snapshot := range []bool{true, false} {
		id, _ := scheduleLifeMessage(t, pool, devices, snapshot)
		chunk := db.Chunk{Snapshot: snapshot, ChunkPendingParams: db.ChunkPendingParams{
			MessageID: id, Chunk: 1, FirstDevice: lifeChunkSize + 1, LastDevice: 2 * lifeChunkSize}}
		read := func() (seq, idx int64) {
			seq0, idx0 := scans()
			// On the generic plan, as a chunk's start reads it.
			require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				if _, err := tx.Exec(ctx, "SELECT set_config('plan_cache_mode', 'force_generic_plan', true)"); err != nil {
					return err
				}
				pending, err := db.On(tx).ChunkPendingOf(ctx, chunk)
				require.Len(t, pending, lifeChunkSize)
				return err
			}))
			seq1, idx1 := scans()
			return seq1 - seq0, idx1 - idx0
		}
		_, err := pool.Exec(ctx, "TRUNCATE user_preferences")
		require.NoError(t, err)
		seq, idx := read()
		require.LessOrEqual(t, seq+idx, int64(1), "snapshot %v, no preferences: the table looked at for each device", snapshot)

		_, err = pool.Exec(ctx, `INSERT INTO user_preferences (user_id, opt_outs) SELECT id, '{marketing}' FROM users`)
		require.NoError(t, err)
		_, err = pool.Exec(ctx, "ANALYZE user_preferences")
		require.NoError(t, err)
		seq, idx = read()
		require.LessOrEqual(t, seq, int64(1), "snapshot %v: the preferences read whole for the devices", snapshot)
		require.GreaterOrEqual(t, idx, int64(lifeChunkSize), "snapshot %v: each device's user looked up by the key", snapshot)
	}
}

// TestLedgerWritesReadByKeyAsTheLedgerGrows writes a chunk's acceptances
// as runs while the ledger is empty, as at a young installation's first
// instant, where a plan made then finds scanning the ledger cheapest, then
// has the ledger grow (a message's withheld deliveries) and writes another
// chunk on the same connection, whose cached plans are those made while it
// was empty: they must still find rows through the keys. The runs' check
// scanned the whole ledger for each chunk a write held, a third of a
// preferences run's ledger writes.
func TestLedgerWritesReadByKeyAsTheLedgerGrows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := oneConnection(t)
	lifePopulation(t, pool, 20)
	var first int64
	require.NoError(t, pool.QueryRow(ctx, "SELECT min(id) FROM devices").Scan(&first))
	due := time.Now().Truncate(time.Microsecond)
	write := func(id int64) {
		w := db.ChunkWrite{MessageID: id, Executions: map[int32]int64{0: 7}}
		for i := range int64(10) {
			w.Results.Add(db.DeliveryKey{MessageID: id, DeviceID: first + i, UserID: fmt.Sprintf("user_%d", i), Channel: "apns",
				DueUs: due.UnixMicro(), First: true}, "accepted", "", due.UnixMicro()+10, due.UnixMicro()+20)
		}
		_, err := db.WriteChunks(ctx, pool, []db.ChunkWrite{w})
		require.NoError(t, err)
	}
	_, err := pool.Exec(ctx, "ANALYZE deliveries")
	require.NoError(t, err)
	write(snapshotMessage(t, pool, due, first, 10))
	_, err = pool.Exec(ctx, `
		INSERT INTO deliveries (message_id, device_id, user_id, channel, chunk, due_at, status, reason)
		SELECT -1, g, 'u' || g, 'apns', 0, now(), 'cancelled', 'opted_out' FROM generate_series(1, 5000) g`)
	require.NoError(t, err)
	seqScans := func() int64 {
		var n int64
		_, err := pool.Exec(ctx, "SELECT pg_stat_force_next_flush()")
		require.NoError(t, err)
		require.NoError(t, pool.QueryRow(ctx, "SELECT seq_scan FROM pg_stat_user_tables WHERE relname = 'deliveries'").Scan(&n))
		return n
	}
	before := seqScans()
	write(snapshotMessage(t, pool, due, first, 10))
	require.Equal(t, before, seqScans(), "the ledger scanned whole")
}

// oneConnection is a pool of one connection to a database of the test's
// own, so that the statistics a test flushes are its statements'.
func oneConnection(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pool, err := db.Open(context.Background(), dbtest.New(t).URL, db.PoolConfig{MaxConns: 1})
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}
