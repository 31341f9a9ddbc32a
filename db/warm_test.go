package db_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"testing"

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
