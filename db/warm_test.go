package db_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/heraldpush/herald/db"
	"github.com/heraldpush/herald/db/dbtest"
)

// TestWarmChunkLeavesTheBeginNothingToRead restarts PostgreSQL, so that its
// buffers are empty as after a restart or on a server whose cache went to
// other work, and reads a chunk's pending deliveries as BeginChunk does:
// cold, the read goes below PostgreSQL's buffers; after WarmChunk, every
// page it needs is in them.
func TestWarmChunkLeavesTheBeginNothingToRead(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := dbtest.NewCluster(t)
	pool := c.Pool()
	_, err := db.Migrate(ctx, pool, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `
		INSERT INTO users (id) SELECT 'u' || g FROM generate_series(1, 4000) g;
		INSERT INTO devices (user_id, channel, token) SELECT 'u' || g, 'apns', md5(g::text) || md5(g::text) FROM generate_series(1, 4000) g;
		INSERT INTO deliveries (message_id, device_id, user_id, channel, chunk, due_at)
		SELECT 1, g, 'u' || g, 'apns', (g - 1) / 500, now() FROM generate_series(1, 4000) g;
		CHECKPOINT`)
	require.NoError(t, err)
	chunk := db.ChunkPendingParams{MessageID: 1, FirstDevice: 1001, LastDevice: 1500, Chunk: 2}

	c.Restart()
	require.Positive(t, chunkReads(t, c.Pool(), chunk), "a chunk read on a restarted server finds its pages in the buffers: the test shows nothing")

	c.Restart()
	pool = c.Pool()
	_, pending, err := db.WarmChunk(ctx, pool, db.Chunk{ChunkPendingParams: chunk}, 0)
	require.NoError(t, err)
	require.Len(t, pending, 500)
	require.Zero(t, chunkReads(t, pool, chunk), "after the warm-up the chunk's read went below PostgreSQL's buffers")
}

// chunkReads runs the chunk's read as BeginChunk does (the generic plan of
// ChunkPending) and returns the blocks it read from outside PostgreSQL's
// buffers.
func chunkReads(t *testing.T, pool *pgxpool.Pool, c db.ChunkPendingParams) int {
	ctx := context.Background()
	conn, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	_, err = conn.Exec(ctx, "SET plan_cache_mode = force_generic_plan")
	require.NoError(t, err)
	_, err = conn.Exec(ctx, "PREPARE chunk_pending AS "+db.ChunkPendingSQL)
	require.NoError(t, err)
	var out []byte
	require.NoError(t, conn.QueryRow(ctx, fmt.Sprintf("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE chunk_pending(%d, %d, %d, %d)",
		c.MessageID, c.FirstDevice, c.LastDevice, c.Chunk)).Scan(&out))
	var plans []struct {
		Plan struct {
			Read int `json:"Shared Read Blocks"`
			Rows int `json:"Actual Rows"`
		}
	}
	require.NoError(t, json.Unmarshal(out, &plans))
	require.Len(t, plans, 1)
	require.Equal(t, int(c.LastDevice-c.FirstDevice+1), plans[0].Plan.Rows)
	return plans[0].Plan.Read
}

// TestPrimedConnectionParsesNothingAtTheInstant runs a chunk's whole life
// (its beginning, its cap's claim, a provider quota's claim, its ledger
// write with results first and not, its settling) on a connection that
// PrimeIdle primed, and finds that it prepared no statement PrimeIdle had
// not: at the instant, nothing is parsed or planned anew. The primes
// themselves changed nothing.
func TestPrimedConnectionParsesNothingAtTheInstant(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tdb := dbtest.New(t)
	var message int64
	require.NoError(t, tdb.Pool.QueryRow(ctx, `
		WITH u AS (INSERT INTO users (id) SELECT 'u' || g FROM generate_series(1, 4) g),
		d AS (INSERT INTO devices (id, user_id, channel, token) OVERRIDING SYSTEM VALUE SELECT g, 'u' || g, 'fcm', 'tok-' || g FROM generate_series(1, 4) g),
		c AS (INSERT INTO categories (name, cap_count, cap_period_s) VALUES ('news', 2, 3600)),
		p AS (INSERT INTO payloads (content) VALUES ('{"title":"hi"}') RETURNING id)
		INSERT INTO messages (state, priority, dispatch_at, expires_at, payload_id, audience, device_count, chunk_count, pending_count, category)
		SELECT 'scheduled', 'bulk', now(), now() + interval '1 hour', p.id, '{}', 4, 1, 4, 'news' FROM p
		RETURNING id`).Scan(&message))
	for _, sql := range []string{
		`INSERT INTO chunk_devices (message_id, chunk, due_at, first_device, last_device, devices)
		 VALUES ($1, 0, now(), 1, 4, '{1,2,3,4}')`,
		`INSERT INTO message_chunks (message_id, chunk, job_id, due_at, device_count) VALUES ($1, 0, 1, now(), 4)`,
		// Device 4 was throttled by an earlier attempt: its row exists.
		`INSERT INTO deliveries (message_id, device_id, user_id, channel, chunk, due_at, status, reason, attempt)
		 VALUES ($1, 4, 'u4', 'fcm', 0, now(), 'pending', 'rate_limited', 1)`,
	} {
		_, err := tdb.Pool.Exec(ctx, sql, message)
		require.NoError(t, err)
	}
	before := tableRows(t, tdb.Pool)

	pool, err := db.Open(ctx, tdb.URL, db.PoolConfig{MaxConns: 1})
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	require.NoError(t, db.PrimeIdle(ctx, pool))
	require.Equal(t, before, tableRows(t, tdb.Pool), "a prime changed a table")
	primed := preparedStatements(t, pool)

	chunk := db.Chunk{ChunkPendingParams: db.ChunkPendingParams{MessageID: message, FirstDevice: 1, LastDevice: 4}, Snapshot: true}
	begun, err := db.BeginChunk(ctx, pool, chunk, 0)
	require.NoError(t, err)
	require.Equal(t, "dispatching", begun.State)
	require.Len(t, begun.Pending, 4)
	capped, err := db.ClaimFrequencyCaps(ctx, pool, db.CategoryCap{Category: "news", Count: 2, PeriodS: 3600}, message, []string{"u1", "u2", "u3", "u4"})
	require.NoError(t, err)
	require.Empty(t, capped)
	granted, _, err := db.ClaimQuota(ctx, pool, db.QuotaClaim{Key: "fcm:test", Rate: 10, Capacity: 10, Want: 4})
	require.NoError(t, err)
	require.Equal(t, 4, granted)
	now := time.Now()
	w := db.ChunkWrite{MessageID: message, Settle: true,
		Chunks: []db.RecordChunkParams{{StartedAt: &now, FinishedAt: &now, MessageID: message}}}
	for _, r := range begun.Pending {
		key := db.DeliveryKey{MessageID: message, DeviceID: r.DeviceID, UserID: r.UserID, Channel: r.Channel, DueUs: now.UnixMicro(), First: !r.Written}
		w.Results.Add(key, "accepted", "", now.UnixMicro(), now.UnixMicro())
	}
	out, err := db.WriteChunks(ctx, pool, []db.ChunkWrite{w})
	require.NoError(t, err)
	require.Equal(t, db.ChunkWritten{Accepted: 4, Settled: "dispatched", Priority: "bulk", SLOSkewMs: out[0].SLOSkewMs}, out[0])

	for name, sql := range preparedStatements(t, pool) {
		_, ok := primed[name]
		require.True(t, ok, "prepared at the instant, not primed: %s", sql)
	}
}

// tableRows counts the rows of the tables a chunk's life writes.
func tableRows(t *testing.T, pool *pgxpool.Pool) []int {
	var n []int
	require.NoError(t, pool.QueryRow(context.Background(), `
		SELECT ARRAY[(SELECT count(*) FROM messages WHERE started_at IS NOT NULL), (SELECT count(*) FROM deliveries),
		             (SELECT count(*) FROM frequency_caps), (SELECT count(*) FROM provider_quotas),
		             (SELECT count(*) FROM message_chunks WHERE recorded_at IS NOT NULL),
		             (SELECT count(*) FROM messages WHERE settled_at IS NOT NULL)]::int[]`).Scan(&n))
	return n
}

// preparedStatements are the statements prepared on pool's one connection,
// by name.
func preparedStatements(t *testing.T, pool *pgxpool.Pool) map[string]string {
	rows, err := pool.Query(context.Background(), "SELECT name, statement FROM pg_prepared_statements")
	require.NoError(t, err)
	out := map[string]string{}
	for rows.Next() {
		var name, sql string
		require.NoError(t, rows.Scan(&name, &sql))
		out[name] = sql
	}
	require.NoError(t, rows.Err())
	return out
}
