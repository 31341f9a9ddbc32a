// Package dbtest gives each test its own real PostgreSQL database, cloned from
// a template that is migrated once, so that database tests run in parallel
// without seeing one another's rows.
//
// The server comes from DATABASE_URL (`make test` starts one in RAM and sets
// it); the role must be allowed to create databases.
package dbtest

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/heraldpush/herald/db"
)

// templateLockID serialises template creation across test binaries, which
// `go test ./...` runs in parallel.
const templateLockID = 0x4865_7261_6c65 // arbitrary, fixed

var template struct {
	once sync.Once
	name string
	err  error
}

// DB is one test's database.
type DB struct {
	// Pool is connected to the test's own database.
	Pool *pgxpool.Pool
	// URL connects to the same database, for code under test that opens its
	// own pool (run, subprocesses).
	URL string
}

// New returns a fresh, migrated database that is dropped when the test ends.
func New(tb testing.TB) *DB {
	tb.Helper()
	return clone(tb, true)
}

// NewEmpty returns a fresh database with no migrations applied, for tests of
// migration itself.
func NewEmpty(tb testing.TB) *DB {
	tb.Helper()
	return clone(tb, false)
}

// AdminURL is the server tests run on (DATABASE_URL), for a test that makes
// databases of its own there.
func AdminURL(tb testing.TB) string {
	url := os.Getenv("DATABASE_URL")
	if url == "" {
		tb.Fatal("dbtest: DATABASE_URL is unset; run the tests with `make test`, which starts a PostgreSQL for them")
	}
	return url
}

func clone(tb testing.TB, migrated bool) *DB {
	tb.Helper()
	ctx := context.Background()
	admin := AdminURL(tb)

	source := "template0"
	if migrated {
		template.once.Do(func() { template.name, template.err = ensureTemplate(ctx, admin) })
		if template.err != nil {
			tb.Fatalf("dbtest: template database: %v", template.err)
		}
		source = template.name
	}

	name := "herald_test_" + randomHex(8)
	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		tb.Fatalf("dbtest: connect to %s: %v", admin, err)
	}
	defer conn.Close(ctx)
	// FILE_COPY copies the template's files instead of writing every page to
	// the WAL; for a small template on a RAM disk it is several times faster.
	if _, err := conn.Exec(ctx, fmt.Sprintf("CREATE DATABASE %s TEMPLATE %s STRATEGY FILE_COPY",
		pgx.Identifier{name}.Sanitize(), pgx.Identifier{source}.Sanitize())); err != nil {
		tb.Fatalf("dbtest: create database: %v", err)
	}

	url, err := db.WithDatabase(admin, name)
	if err != nil {
		tb.Fatalf("dbtest: %v", err)
	}
	pool, err := db.Open(ctx, url, db.PoolConfig{MaxConns: 10})
	if err != nil {
		tb.Fatalf("dbtest: %v", err)
	}
	tb.Cleanup(func() {
		pool.Close()
		conn, err := pgx.Connect(ctx, admin)
		if err != nil {
			tb.Logf("dbtest: drop %s: %v", name, err)
			return
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, fmt.Sprintf("DROP DATABASE IF EXISTS %s WITH (FORCE)", pgx.Identifier{name}.Sanitize())); err != nil {
			tb.Logf("dbtest: drop %s: %v", name, err)
		}
	})
	return &DB{Pool: pool, URL: url}
}

// ensureTemplate creates the migrated template database once per migration
// set. It is named after a digest of the migrations and the schema, so a
// changed migration gets a new template rather than a stale one.
func ensureTemplate(ctx context.Context, admin string) (string, error) {
	all, err := db.Migrations()
	if err != nil {
		return "", err
	}
	h := sha256.New()
	// The schema is part of the layout: a template made when Herald's tables
	// were in public must not serve tests that look for them in DefaultSchema.
	fmt.Fprintf(h, "schema:%s\n", db.DefaultSchema) // a hash's Write never fails
	for _, m := range all {
		fmt.Fprint(h, m.Name, m.SQL)
	}
	name := "herald_template_" + hex.EncodeToString(h.Sum(nil))[:16]

	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		return "", fmt.Errorf("connect: %w", err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1)", templateLockID); err != nil {
		return "", fmt.Errorf("lock: %w", err)
	}
	// Closing the connection releases the lock too, should the unlock fail.
	defer func() { _, _ = conn.Exec(ctx, "SELECT pg_advisory_unlock($1)", templateLockID) }()

	var exists bool
	if err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)", name).Scan(&exists); err != nil {
		return "", err
	}
	if exists {
		return name, nil
	}

	// Build under a scratch name and rename when complete, so that a run
	// killed halfway never leaves a half-migrated template behind.
	scratch := name + "_building"
	if _, err := conn.Exec(ctx, fmt.Sprintf("DROP DATABASE IF EXISTS %s WITH (FORCE)", pgx.Identifier{scratch}.Sanitize())); err != nil {
		return "", err
	}
	if _, err := conn.Exec(ctx, fmt.Sprintf("CREATE DATABASE %s TEMPLATE template0", pgx.Identifier{scratch}.Sanitize())); err != nil {
		return "", err
	}
	url, err := db.WithDatabase(admin, scratch)
	if err != nil {
		return "", err
	}
	pool, err := db.Open(ctx, url, db.PoolConfig{MaxConns: 2})
	if err != nil {
		return "", err
	}
	_, err = db.Migrate(ctx, pool, slog.New(slog.NewTextHandler(io.Discard, nil)))
	pool.Close()
	if err != nil {
		return "", fmt.Errorf("migrate: %w", err)
	}
	if _, err := conn.Exec(ctx, fmt.Sprintf("ALTER DATABASE %s RENAME TO %s",
		pgx.Identifier{scratch}.Sanitize(), pgx.Identifier{name}.Sanitize())); err != nil {
		return "", err
	}
	return name, nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
