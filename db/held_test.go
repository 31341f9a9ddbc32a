package db_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/heraldpush/herald/db"
	"github.com/heraldpush/herald/db/dbtest"
)

// TestHeldDeliveriesNeverReadTheLedger: the API counts a message's
// deliveries held by quiet hours on every read of it while it is sent, a
// status read every second of a million-device message among them, so the
// count is the sum its chunks' attempts wrote (message_chunks.held), found
// through their primary key in the generic plan: never a walk of the
// message's ledger.
func TestHeldDeliveriesNeverReadTheLedger(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tdb := dbtest.New(t)
	conn, err := tdb.Pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	// The chunks alone, without their messages' rows: the foreign key is
	// not what this is about.
	_, err = conn.Exec(ctx, "SET session_replication_role = replica")
	require.NoError(t, err)
	_, err = conn.Exec(ctx, `
		INSERT INTO message_chunks (message_id, chunk, job_id, due_at, device_count, held)
		SELECT m, c, m * 1000 + c, now(), 500, CASE WHEN m = 1 THEN c ELSE 0 END
		FROM generate_series(1, 40) m, generate_series(0, 49) c`)
	require.NoError(t, err)
	_, err = conn.Exec(ctx, "ANALYZE message_chunks")
	require.NoError(t, err)
	_, err = conn.Exec(ctx, "SET plan_cache_mode = force_generic_plan")
	require.NoError(t, err)
	_, err = conn.Exec(ctx, "PREPARE held AS "+db.HeldDeliveriesSQL)
	require.NoError(t, err)

	plan := explain(t, conn, "EXECUTE held('{1,2}')")
	require.Contains(t, plan, "message_chunks_pkey", plan)
	require.NotContains(t, plan, "deliveries", plan)
	require.NotContains(t, plan, "Seq Scan", plan)

	held, err := db.On(conn).HeldDeliveries(ctx, []int64{1, 2})
	require.NoError(t, err)
	require.ElementsMatch(t, []db.HeldDeliveriesRow{{MessageID: 1, Held: 49 * 50 / 2}, {MessageID: 2, Held: 0}}, held)
}
