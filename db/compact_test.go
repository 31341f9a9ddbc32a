package db_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/heraldpush/herald/db"
	"github.com/heraldpush/herald/db/dbtest"
)

// ledgerRows writes n settled ledger rows of a message of their own, as a
// sent message leaves them, and returns the message's id.
func ledgerRows(t *testing.T, pool *pgxpool.Pool, n int) int64 {
	t.Helper()
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	id := scheduledMessage(t, tx, time.Now().Add(-time.Hour))
	_, err = tx.Exec(ctx, `
		INSERT INTO deliveries (message_id, device_id, user_id, channel, chunk, due_at, status, attempt, attempted_at, accepted_at)
		SELECT $1, g, 'u' || g, 'fcm', g / 500, now(), 'accepted', 1, now(), now()
		FROM generate_series(1, $2::integer) g`, id, n)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	return id
}

// TestCompactLedgerKeyGivesBackARetainedMessage: a ledger whose largest
// message was deleted keeps its primary key's size, mostly emptied pages,
// until CompactLedgerKey rebuilds it to the size of the rows left, which
// are all still found through it. A full key, an empty one under the size
// given, and a compaction another process is doing are left alone; an
// unfinished rebuild left behind is dropped.
func TestCompactLedgerKeyGivesBackARetainedMessage(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tdb := dbtest.New(t)
	pool := tdb.Pool
	const above = 1 << 20
	kept := ledgerRows(t, pool, 10_000)
	big := ledgerRows(t, pool, 300_000)
	_, err := pool.Exec(ctx, `VACUUM (ANALYZE) deliveries`)
	require.NoError(t, err)

	full, err := db.CompactLedgerKey(ctx, pool, above)
	require.NoError(t, err)
	require.False(t, full.Rebuilt, "a key its rows fill is not rebuilt: %+v", full.Before)
	require.Greater(t, full.Before.Bytes, int64(8<<20))

	_, err = pool.Exec(ctx, `DELETE FROM deliveries WHERE message_id = $1`, big)
	require.NoError(t, err)
	// What autovacuum does after a mass delete, at once.
	_, err = pool.Exec(ctx, `VACUUM (ANALYZE) deliveries`)
	require.NoError(t, err)
	emptied, err := db.ReadLedgerKeySize(ctx, pool)
	require.NoError(t, err)
	require.Equal(t, full.Before.Bytes, emptied.Bytes, "vacuum shrank the key by itself: nothing to show")
	require.True(t, emptied.Slack(above))

	// Another process compacting: this one does nothing.
	other, err := pool.Acquire(ctx)
	require.NoError(t, err)
	_, err = other.Exec(ctx, `SELECT pg_advisory_lock(hashtextextended('herald:compact-ledger', 0))`)
	require.NoError(t, err)
	busy, err := db.CompactLedgerKey(ctx, pool, above)
	require.NoError(t, err)
	require.Equal(t, db.Compacted{}, busy)
	_, err = other.Exec(ctx, `SELECT pg_advisory_unlock(hashtextextended('herald:compact-ledger', 0))`)
	require.NoError(t, err)
	other.Release()

	// Too small to be worth it.
	small, err := db.CompactLedgerKey(ctx, pool, full.Before.Bytes)
	require.NoError(t, err)
	require.False(t, small.Rebuilt)

	// A rebuild cut short leaves an invalid index (here one that failed on
	// its unique check, as REINDEX CONCURRENTLY's leaves it).
	_, err = pool.Exec(ctx, `CREATE UNIQUE INDEX CONCURRENTLY deliveries_pkey_ccnew ON deliveries (message_id)`)
	require.Error(t, err)
	require.Equal(t, 1, invalidIndexes(t, pool))

	done, err := db.CompactLedgerKey(ctx, pool, above)
	require.NoError(t, err)
	require.True(t, done.Rebuilt)
	require.Equal(t, 1, done.Dropped)
	require.Zero(t, invalidIndexes(t, pool))
	require.Less(t, done.After.Bytes, done.Before.Bytes/8, "%+v", done)
	require.Less(t, done.After.Bytes, int64(1<<20))

	// The rows left are found through the new key, which is still the
	// primary key.
	var n int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM deliveries WHERE message_id = $1 AND device_id BETWEEN 100 AND 199`, kept).Scan(&n))
	require.Equal(t, 100, n)
	var primary bool
	require.NoError(t, pool.QueryRow(ctx, `SELECT indisprimary AND indisvalid FROM pg_index WHERE indexrelid = 'deliveries_pkey'::regclass`).Scan(&primary))
	require.True(t, primary)
	_, err = pool.Exec(ctx, `INSERT INTO deliveries (message_id, device_id, user_id, channel, chunk, due_at, status) VALUES ($1, 100, 'u', 'fcm', 0, now(), 'pending')`, kept)
	require.Error(t, err, "the rebuilt key no longer refuses a second row of a delivery")

	again, err := db.CompactLedgerKey(ctx, pool, above)
	require.NoError(t, err)
	require.False(t, again.Rebuilt)
}

// invalidIndexes counts the ledger's invalid indexes.
func invalidIndexes(t *testing.T, pool *pgxpool.Pool) int {
	t.Helper()
	var n int
	require.NoError(t, pool.QueryRow(context.Background(),
		`SELECT count(*) FROM pg_index WHERE indrelid = 'deliveries'::regclass AND NOT indisvalid`).Scan(&n))
	return n
}
