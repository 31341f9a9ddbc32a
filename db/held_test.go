package db_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/heraldpush/herald/db"
	"github.com/heraldpush/herald/db/dbtest"
)

// TestHeldDeliveriesPlanUsesThePrimaryKey: the API counts a message's
// deliveries held by quiet hours on every read of it while it is sent, so
// the count must walk each message's part of the ledger's primary key, in
// its generic plan, on a ledger of many messages: never the ledger.
func TestHeldDeliveriesPlanUsesThePrimaryKey(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tdb := dbtest.New(t)
	conn, err := tdb.Pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	_, err = conn.Exec(ctx, `
		INSERT INTO deliveries (message_id, device_id, user_id, channel, chunk, due_at, status, reason, attempt)
		SELECT m, g, 'u' || g, 'apns', g / 500, now(),
		       CASE WHEN m = 1 AND g % 10 = 0 THEN 'pending' ELSE 'cancelled' END,
		       CASE WHEN g % 10 = 0 THEN 'quiet_hours' ELSE 'opted_out' END, 0
		FROM generate_series(1, 40) m, generate_series(1, 2000) g`)
	require.NoError(t, err)
	_, err = conn.Exec(ctx, "ANALYZE deliveries")
	require.NoError(t, err)
	_, err = conn.Exec(ctx, "SET plan_cache_mode = force_generic_plan")
	require.NoError(t, err)
	_, err = conn.Exec(ctx, "PREPARE held AS "+db.HeldDeliveriesSQL)
	require.NoError(t, err)

	plan := explain(t, conn, "EXECUTE held('{1,2}')")
	require.Contains(t, plan, "deliveries_pkey", plan)
	require.Contains(t, plan, "Index Cond: (message_id = ANY ($1))", plan)
	require.NotContains(t, plan, "Seq Scan", plan)

	held, err := db.On(conn).HeldDeliveries(ctx, []int64{1, 2})
	require.NoError(t, err)
	require.Equal(t, []db.HeldDeliveriesRow{{MessageID: 1, Held: 200}}, held)
}
