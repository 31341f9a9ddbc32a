package db

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// PoolConfig tunes the connection pool. Zero values take the defaults.
type PoolConfig struct {
	// MaxConns caps the pool. Default 20: the API, the River client and the
	// chunk workers share it, and chunk workers hold a connection only for
	// their ledger reads and writes.
	MaxConns int32
	// MinConns are kept open however idle the pool is, so that the first
	// query after a quiet spell does not wait for a connection to be made.
	MinConns int32
	// Schema is where Herald's tables and River's are (DefaultSchema when
	// empty): every connection of the pool looks there first.
	Schema string
}

// Open connects a pool to url, working in cfg.Schema, and checks that the
// database answers.
func Open(ctx context.Context, url string, cfg PoolConfig) (*pgxpool.Pool, error) {
	pc, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("parse database url: %w", err)
	}
	schema := cmp.Or(cfg.Schema, DefaultSchema)
	if err := CheckSchema(schema); err != nil {
		return nil, err
	}
	// Only the schema: a table Herald names that is missing from it is an
	// error, never the application's table of that name in public.
	// Functions and types of pg_catalog are found all the same. The
	// config records it (PoolSchema), but a connection sets it with SET
	// once connected rather than as a startup parameter, which PgBouncer
	// (before 1.20, Debian bookworm's 1.18) refuses: "unsupported startup
	// parameter: search_path" (docs/operations.md, Poolers).
	pc.ConnConfig.RuntimeParams["search_path"] = schema
	new(staleConns).install(pc, setUpSession(schema))
	pc.BeforeConnect = func(_ context.Context, cc *pgx.ConnConfig) error {
		delete(cc.RuntimeParams, "search_path")
		return nil
	}
	pc.MaxConns = 20
	if cfg.MaxConns > 0 {
		pc.MaxConns = cfg.MaxConns
	}
	pc.MinConns = min(cfg.MinConns, pc.MaxConns)
	// A connection is kept while it lives, idle or not: pgxpool replaces it
	// after an hour, and the jitter spreads the replacements. Reminders fall
	// due minutes apart, and a connection opened for an instant costs
	// PostgreSQL a backend's start, its catalog caches and a plan of every
	// statement it runs, at the instant, when the machine is busiest. They
	// were closed after five minutes idle, so an instant after a quiet
	// spell opened those it needed beyond the few the process's loops kept
	// in use (one to four in herald bench's runs, a cost within the runs'
	// spread: docs/performance.md). The pool's size bounds what is kept.
	//
	// A connection string's pool_max_conn_lifetime_jitter and
	// pool_max_conn_idle_time are followed (pgxpool reads them, and
	// pool_max_conn_lifetime, itself); only their absence takes these.
	if !strings.Contains(url, "pool_max_conn_lifetime_jitter") {
		pc.MaxConnLifetimeJitter = 10 * time.Minute
	}
	if !strings.Contains(url, "pool_max_conn_idle_time") {
		pc.MaxConnIdleTime = pc.MaxConnLifetime + pc.MaxConnLifetimeJitter
	}
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, fmt.Errorf("open database pool: %w", err)
	}
	pingCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := pool.Ping(pingCtx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("connect to database: %w", err)
	}
	return pool, nil
}

// TxBeginner is what InTx needs: a pool, or a transaction for a nested one.
type TxBeginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// InTx runs fn in a transaction that commits when fn returns nil and rolls
// back otherwise. Its error is interpreted like the queries' (ErrNotFound,
// ErrConflict). fn gets the transaction itself, not only its queries, so
// that River jobs can be inserted in it too.
//
// A transaction PostgreSQL aborted as a deadlock victim or a serialization
// failure is run again, up to three times in all: fn must do nothing but
// database work through tx, so that running it again is safe.
func InTx(ctx context.Context, b TxBeginner, fn func(tx pgx.Tx) error) error {
	return retryConflicts(func() error { return pgx.BeginFunc(ctx, b, fn) })
}

// retryConflicts runs a transaction again, up to three times in all, while
// PostgreSQL aborts it as a deadlock victim or a serialization failure, and
// interprets its last error.
func retryConflicts(run func() error) error {
	var err error
	for attempt := 0; attempt < 3; attempt++ {
		err = run()
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || (pgErr.Code != "40P01" && pgErr.Code != "40001") {
			break
		}
	}
	return interpretError(err)
}

// WithDatabase returns url pointed at another database on the same server,
// keeping every other setting (TLS, password, socket directory). It takes
// both URL and keyword/value forms.
func WithDatabase(raw, name string) (string, error) {
	if strings.HasPrefix(raw, "postgres://") || strings.HasPrefix(raw, "postgresql://") {
		u, err := url.Parse(raw)
		if err != nil {
			return "", fmt.Errorf("parse database url: %w", err)
		}
		u.Path = "/" + name
		return u.String(), nil
	}
	// Keyword/value form: a later keyword overrides an earlier one.
	return raw + " dbname=" + name, nil
}
