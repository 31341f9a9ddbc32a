package db_test

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/heraldpush/herald/db"
	"github.com/heraldpush/herald/db/dbtest"
)

// TestQueriesInterpretErrors checks that the queries db.On returns, on a
// pool and in a transaction, report a missing row and a unique violation
// as the package's errors for errors.Is, through any wrapping, while the
// driver's error stays reachable; and that other errors pass unchanged.
func TestQueriesInterpretErrors(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tdb := dbtest.New(t)

	t.Run("missing row", func(t *testing.T) {
		t.Parallel()
		_, err := db.On(tdb.Pool).GetMessage(ctx, 1<<40)
		require.ErrorIs(t, err, db.ErrNotFound)
		require.ErrorIs(t, err, pgx.ErrNoRows)
		require.ErrorIs(t, fmt.Errorf("read message: %w", err), db.ErrNotFound)
		require.NotErrorIs(t, err, db.ErrConflict)
	})

	t.Run("missing row in a transaction", func(t *testing.T) {
		t.Parallel()
		var inside error
		err := db.InTx(ctx, tdb.Pool, func(tx pgx.Tx) error {
			_, inside = db.On(tx).GetMessage(ctx, 1<<40)
			return fmt.Errorf("read message: %w", inside)
		})
		require.ErrorIs(t, inside, db.ErrNotFound)
		require.ErrorIs(t, err, db.ErrNotFound)
	})

	t.Run("a transaction's own query", func(t *testing.T) {
		t.Parallel()
		// InTx interprets what fn returns even when fn used the driver
		// directly.
		err := db.InTx(ctx, tdb.Pool, func(tx pgx.Tx) error {
			var n int
			return tx.QueryRow(ctx, "SELECT 1 WHERE false").Scan(&n)
		})
		require.ErrorIs(t, err, db.ErrNotFound)
		require.ErrorIs(t, err, pgx.ErrNoRows)
	})

	t.Run("unique violation", func(t *testing.T) {
		t.Parallel()
		var id int64
		require.NoError(t, tdb.Pool.QueryRow(ctx, `
			WITH p AS (INSERT INTO payloads (content) VALUES ('{}') RETURNING id)
			INSERT INTO messages (state, priority, dispatch_at, expires_at, payload_id, audience, device_count, chunk_count, pending_count)
			SELECT 'scheduled', 'bulk', now(), now() + interval '1 hour', p.id, '{}', 1, 1, 1 FROM p
			RETURNING id`).Scan(&id))
		chunk := db.InsertMessageChunksParams{
			MessageID: id, Chunks: []int32{0}, JobIds: []int64{1}, DueAts: []time.Time{time.Now()}, DeviceCounts: []int32{1},
		}
		q := db.On(tdb.Pool)
		require.NoError(t, q.InsertMessageChunks(ctx, chunk))
		err := q.InsertMessageChunks(ctx, chunk)
		require.ErrorIs(t, err, db.ErrConflict)
		require.NotErrorIs(t, err, db.ErrNotFound)
		var pgErr *pgconn.PgError
		require.ErrorAs(t, fmt.Errorf("insert chunks: %w", err), &pgErr)
		require.Equal(t, "23505", pgErr.Code)
	})

	t.Run("database unavailable", func(t *testing.T) {
		t.Parallel()
		proxy := dbtest.NewProxy(t, tdb.URL)
		pool, err := db.Open(ctx, proxy.URL, db.PoolConfig{MaxConns: 1})
		require.NoError(t, err)
		defer pool.Close()
		q := db.On(pool)
		_, err = q.GetMessage(ctx, 1<<40)
		require.ErrorIs(t, err, db.ErrNotFound)
		// The connection breaks under the pool, and then none can be made.
		proxy.Down()
		for range 2 {
			_, err = q.GetMessage(ctx, 1<<40)
			require.ErrorIs(t, err, db.ErrUnavailable)
			require.NotErrorIs(t, err, db.ErrNotFound)
		}
		err = db.InTx(ctx, pool, func(tx pgx.Tx) error { return nil })
		require.ErrorIs(t, err, db.ErrUnavailable)
		proxy.Up()
		_, err = q.GetMessage(ctx, 1<<40)
		require.ErrorIs(t, err, db.ErrNotFound, "the pool recovers by itself")
	})

	t.Run("other errors unchanged", func(t *testing.T) {
		t.Parallel()
		cancelled, cancel := context.WithCancel(ctx)
		cancel()
		_, err := db.On(tdb.Pool).GetMessage(cancelled, 1)
		require.ErrorIs(t, err, context.Canceled)
		require.NotErrorIs(t, err, db.ErrNotFound)
		require.NotErrorIs(t, err, db.ErrConflict)
	})
}

// TestQueriesOnlyThroughOn checks that no code outside this package builds
// Queries with sqlc's New or WithTx, whose errors are the driver's as they
// are: a check like errors.Is(err, db.ErrNotFound) on them is silently
// never true.
func TestQueriesOnlyThroughOn(t *testing.T) {
	t.Parallel()
	uninterpreted := regexp.MustCompile(`\bdb\.New\(|\.WithTx\(`)
	root, err := filepath.Abs("..")
	require.NoError(t, err)
	var found []string
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if d.IsDir() {
			if rel == "db" || strings.HasPrefix(d.Name(), ".") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for i, line := range strings.Split(string(src), "\n") {
			if uninterpreted.MatchString(line) {
				found = append(found, fmt.Sprintf("%s:%d: %s", rel, i+1, strings.TrimSpace(line)))
			}
		}
		return nil
	})
	require.NoError(t, err)
	require.Empty(t, found, "use db.On, whose queries interpret the driver's errors")
}
