package db

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// ErrSessionsShared is CheckOwnSessions' answer when a connection's
// statements run in more than one database session: a pooler in
// transaction (or statement) mode between Herald and PostgreSQL.
var ErrSessionsShared = errors.New("herald needs PgBouncer in session mode, or a direct connection: " +
	"this connection's statements run in database sessions other connections use too (a pooler in transaction or statement mode), " +
	"which would lose the worker's liveness lock, River's LISTEN and the prepared statements")

// setUpSession is a connection's AfterConnect: it points search_path at
// schema (checked by CheckSchema, so it needs no quoting), and turns JIT
// compilation off.
//
// PostgreSQL compiles a statement whose estimated cost passes
// jit_above_cost before it runs, however little of the plan then runs.
// Herald's statements are short and many, and some plans carry a costly
// branch that rarely runs: SettleMessage, which every chunk runs, reads a
// message's whole ledger only when it settles, and on a ledger of ten
// million rows its estimate passed the thresholds, so each call spent
// 100-350 ms compiling and optimizing code it never ran. A
// ten-million-device message was sent at 2,100 devices a second instead of
// 8,500, its settles taking a core.
func setUpSession(schema string) func(context.Context, *pgconn.PgConn) error {
	return func(ctx context.Context, conn *pgconn.PgConn) error {
		if _, err := conn.Exec(ctx, "SET search_path TO "+schema+"; SET jit = off").ReadAll(); err != nil {
			return fmt.Errorf("set up the session: %w", err)
		}
		return nil
	}
}

// ConnConfig is how to open a connection of its own to the pool's database
// (a worker's liveness lock), as the pool opens its connections: in the
// pool's schema, set once connected.
func ConnConfig(pool *pgxpool.Pool) *pgx.ConnConfig {
	cc := pool.Config().ConnConfig
	delete(cc.RuntimeParams, "search_path")
	return cc
}

// CheckOwnSessions checks that a connection to the pool's database keeps
// one database session of its own from statement to statement, as Herald
// needs: a worker's liveness lock is a session's advisory lock, River
// listens for its notifications on a connection of its own, `herald
// migrate` serialises on a session lock, and pgx prepares its statements
// once a connection. A direct connection does, and so does PgBouncer in
// session mode; in transaction mode a connection's next statement runs on
// whichever server session is free, and another client's may run on the
// one it used: ErrSessionsShared.
//
// It opens two connections, a and b, and three times: a reads its
// session's backend; b, in a transaction (which keeps its session from
// being given to anyone else), reads its own; a reads its own again. Apart
// sessions never meet. A transaction pooler hands b the session a just
// used (PgBouncer reuses the last freed one first), or moves a, or, pooling
// round robin, soon does either. The statements go by the simple protocol,
// so that the probe meets no prepared statement of another session's.
func CheckOwnSessions(ctx context.Context, pool *pgxpool.Pool) error {
	cc := ConnConfig(pool)
	a, err := pgx.ConnectConfig(ctx, cc)
	if err != nil {
		return fmt.Errorf("check the database session: %w", err)
	}
	defer a.Close(context.WithoutCancel(ctx))
	b, err := pgx.ConnectConfig(ctx, cc)
	if err != nil {
		return fmt.Errorf("check the database session: %w", err)
	}
	defer b.Close(context.WithoutCancel(ctx))
	backend := func(q interface {
		QueryRow(context.Context, string, ...any) pgx.Row
	}) (pid int32, err error) {
		err = q.QueryRow(ctx, "SELECT pg_backend_pid()", pgx.QueryExecModeSimpleProtocol).Scan(&pid)
		return pid, err
	}
	for range 3 {
		first, err := backend(a)
		if err != nil {
			return fmt.Errorf("check the database session: %w", err)
		}
		shared, err := func() (bool, error) {
			tx, err := b.Begin(ctx)
			if err != nil {
				return false, err
			}
			defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
			other, err := backend(tx)
			if err != nil || other == first {
				return other == first, err
			}
			again, err := backend(a)
			return again != first, err
		}()
		if err != nil {
			return fmt.Errorf("check the database session: %w", err)
		}
		if shared {
			return ErrSessionsShared
		}
	}
	return nil
}
