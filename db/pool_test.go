package db_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/heraldpush/herald/db"
	"github.com/heraldpush/herald/db/dbtest"
)

// TestPoolKeepsIdleConnections: a connection is never closed for being idle
// before it would be replaced for its age. Reminders fall due minutes apart;
// a pool that closed what had been idle for five minutes began each instant
// after a quiet spell on new backends, whose start, catalog caches and plans
// PostgreSQL paid at the instant (see Open).
func TestPoolKeepsIdleConnections(t *testing.T) {
	t.Parallel()
	cfg := openedConfig(t, dbtest.New(t).URL)
	require.Positive(t, cfg.MaxConnLifetime, "connections are replaced after a while")
	require.Positive(t, cfg.MaxConnLifetimeJitter, "and not all at once")
	require.GreaterOrEqual(t, cfg.MaxConnIdleTime, cfg.MaxConnLifetime+cfg.MaxConnLifetimeJitter,
		"an idle connection lives as long as any other")
}

// TestPoolKeepsTheURLsLifetimes: a connection string that says how long
// connections live or may stay idle is followed.
func TestPoolKeepsTheURLsLifetimes(t *testing.T) {
	t.Parallel()
	url := dbtest.New(t).URL
	sep := "?"
	if strings.Contains(url, "?") {
		sep = "&"
	}
	cfg := openedConfig(t, url+sep+"pool_max_conn_lifetime=20m&pool_max_conn_lifetime_jitter=1m&pool_max_conn_idle_time=2m")
	require.Equal(t, 20*time.Minute, cfg.MaxConnLifetime)
	require.Equal(t, time.Minute, cfg.MaxConnLifetimeJitter)
	require.Equal(t, 2*time.Minute, cfg.MaxConnIdleTime)
}

// openedConfig is the configuration of a pool db.Open opens on url.
func openedConfig(t *testing.T, url string) *pgxpool.Config {
	t.Helper()
	pool, err := db.Open(context.Background(), url, db.PoolConfig{MaxConns: 2})
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool.Config()
}

// TestPoolCompilesNothing: a statement whose estimate passes PostgreSQL's
// JIT thresholds is not compiled before it runs. SettleMessage, which every
// chunk runs, reads a message's whole ledger only when it settles; on a
// ten-million-row ledger its estimate passed them, and each call of it
// compiled code it never ran, 100-350 ms of a core (see setUpSession).
// Here every statement's estimate passes them (jit_above_cost 0).
func TestPoolCompilesNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tdb := dbtest.New(t)
	// Asked on a connection of PostgreSQL's defaults: on Herald's, JIT is
	// off, which the function counts as unavailable.
	plain, err := pgx.Connect(ctx, tdb.URL)
	require.NoError(t, err)
	var available bool
	require.NoError(t, plain.QueryRow(ctx, "SELECT pg_jit_available()").Scan(&available))
	require.NoError(t, plain.Close(ctx))
	if !available {
		t.Skip("this PostgreSQL cannot compile statements (no JIT provider)")
	}
	conn, err := tdb.Pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	_, err = conn.Exec(ctx, "SET jit_above_cost = 0")
	require.NoError(t, err)
	var plan string
	require.NoError(t, conn.QueryRow(ctx, "EXPLAIN (ANALYZE, FORMAT JSON) "+db.SettleMessageSQL, int64(1)).Scan(&plan))
	require.NotContains(t, plan, `"JIT"`, "the statement was compiled before it ran")
}

// TestPoolAfterARestartFailsOneQuery: after PostgreSQL restarts (or fails
// over), the pool's connections that were in use a moment before are
// closed at the server's end, and pgxpool checks only those idle for over a
// second before handing them out. Each of them failed the next query run on
// it: after a restart, Herald answered 503 to as many API requests as it
// had such connections (4 of 4 here). Once one connection is found closed,
// the pool checks each older one it hands out, so one query fails and those
// after it run. The server's end of each connection is ended as a restart
// ends it (pg_terminate_backend: FATAL 57P01), at once, so that every
// connection is still fresh when the queries come.
func TestPoolAfterARestartFailsOneQuery(t *testing.T) {
	t.Parallel()
	const conns = 4
	ctx := context.Background()
	tdb := dbtest.New(t)
	url := tdb.URL + "&application_name=restarted"
	if !strings.Contains(tdb.URL, "?") {
		url = tdb.URL + "?application_name=restarted"
	}
	pool, err := db.Open(ctx, url, db.PoolConfig{MaxConns: conns})
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	// Every connection in use at once, then idle.
	held := make([]*pgxpool.Conn, conns)
	for i := range held {
		held[i], err = pool.Acquire(ctx)
		require.NoError(t, err)
		_, err = held[i].Exec(ctx, "SELECT 1")
		require.NoError(t, err)
	}
	for _, conn := range held {
		conn.Release()
	}
	var ended int
	require.NoError(t, tdb.Pool.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid, 5000))
		FROM pg_stat_activity WHERE application_name = 'restarted'`).Scan(&ended))
	require.Equal(t, conns, ended)
	failed := 0
	for range conns {
		var one int
		if err := pool.QueryRow(ctx, "SELECT 1").Scan(&one); err != nil {
			require.ErrorIs(t, db.Interpret(err), db.ErrUnavailable, "%v", err)
			failed++
		}
	}
	require.LessOrEqual(t, failed, 1, "queries failed on connections the server had closed")
	t.Logf("%d of %d queries failed", failed, conns)
}
