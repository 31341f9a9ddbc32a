package db

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"regexp"
	"sort"
	"strconv"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"

	"github.com/heraldpush/herald/migrations"
)

// migrationLockID is the advisory lock key that serialises `herald migrate`
// runs, so that two processes migrating at once take turns instead of
// colliding on the same DDL. The value is arbitrary but fixed.
const migrationLockID = 0x4865_7261_6c64 // "Herald"

var migrationName = regexp.MustCompile(`^(\d{4})_[a-z0-9_]+\.sql$`)

// Migration is one of Herald's schema migrations.
type Migration struct {
	Version int
	Name    string
	SQL     string
}

// Migrations returns Herald's embedded migrations in version order.
func Migrations() ([]Migration, error) {
	entries, err := fs.ReadDir(migrations.FS, ".")
	if err != nil {
		return nil, fmt.Errorf("read migrations: %w", err)
	}
	var out []Migration
	for _, e := range entries {
		m := migrationName.FindStringSubmatch(e.Name())
		if m == nil {
			return nil, fmt.Errorf("migration file %q is not named NNNN_name.sql", e.Name())
		}
		body, err := fs.ReadFile(migrations.FS, e.Name())
		if err != nil {
			return nil, fmt.Errorf("read migration %s: %w", e.Name(), err)
		}
		version, _ := strconv.Atoi(m[1])
		out = append(out, Migration{Version: version, Name: e.Name(), SQL: string(body)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Version < out[j].Version })
	for i, m := range out {
		if m.Version != i+1 {
			return nil, fmt.Errorf("migration %s: versions must run 1, 2, 3... without gaps", m.Name)
		}
	}
	return out, nil
}

// MigrateResult says what a Migrate call applied.
type MigrateResult struct {
	RiverApplied  []int
	HeraldApplied []string
	// MovedFromPublic lists the tables, types and functions moved from the
	// public schema into Herald's: an installation from before Herald had a
	// schema of its own.
	MovedFromPublic []string
}

// Migrate applies River's migrations and then Herald's, each at most once,
// in the pool's schema (PoolSchema), which it creates if need be. An
// installation whose tables are still in public, from before Herald had a
// schema of its own, is first moved there (moveFromPublic). It holds an
// advisory lock for the whole run, so concurrent callers wait for one
// another and then find nothing left to do.
func Migrate(ctx context.Context, pool *pgxpool.Pool, logger *slog.Logger) (MigrateResult, error) {
	var res MigrateResult
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return res, fmt.Errorf("acquire connection: %w", err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1)", migrationLockID); err != nil {
		return res, fmt.Errorf("take migration lock: %w", err)
	}
	defer func() {
		// A fresh context: the lock must be released even when ctx is done.
		_, _ = conn.Exec(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock($1)", migrationLockID)
	}()

	schema, err := schemaOf(pool)
	if err != nil {
		return res, err
	}
	if _, err := conn.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+pgx.Identifier{schema}.Sanitize()); err != nil {
		return res, fmt.Errorf("create schema %s: %w", schema, err)
	}
	if res.MovedFromPublic, err = moveFromPublic(ctx, conn.Conn(), schema); err != nil {
		return res, err
	}
	migrator, err := rivermigrate.New(riverpgxv5.New(pool), &rivermigrate.Config{Logger: logger, Schema: schema})
	if err != nil {
		return res, fmt.Errorf("river migrator: %w", err)
	}
	riverRes, err := migrator.Migrate(ctx, rivermigrate.DirectionUp, nil)
	if err != nil {
		return res, fmt.Errorf("river migrations: %w", err)
	}
	for _, v := range riverRes.Versions {
		res.RiverApplied = append(res.RiverApplied, v.Version)
	}

	all, err := Migrations()
	if err != nil {
		return res, err
	}
	if _, err := conn.Exec(ctx, `CREATE TABLE IF NOT EXISTS herald_migration (
		version    integer PRIMARY KEY,
		name       text NOT NULL,
		applied_at timestamptz NOT NULL DEFAULT now()
	)`); err != nil {
		return res, fmt.Errorf("create herald_migration: %w", err)
	}
	applied, err := appliedVersions(ctx, conn.Conn())
	if err != nil {
		return res, err
	}
	for _, m := range all {
		if applied[m.Version] {
			continue
		}
		err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, m.SQL); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, "INSERT INTO herald_migration (version, name) VALUES ($1, $2)", m.Version, m.Name)
			return err
		})
		if err != nil {
			return res, fmt.Errorf("migration %s: %w", m.Name, err)
		}
		res.HeraldApplied = append(res.HeraldApplied, m.Name)
	}
	return res, nil
}

// ErrNotMigrated is returned by CheckMigrated when migrations are missing.
var ErrNotMigrated = errors.New("database is not migrated")

// CheckMigrated returns nil when every River and Herald migration this binary
// knows has been applied, and an error wrapping ErrNotMigrated that says what
// is missing otherwise.
func CheckMigrated(ctx context.Context, pool *pgxpool.Pool) error {
	schema, err := schemaOf(pool)
	if err != nil {
		return err
	}
	if inPublic, err := inPublic(ctx, pool, schema); err != nil {
		return err
	} else if inPublic {
		return fmt.Errorf("%w: Herald's tables are in schema public; `herald migrate` moves them into schema %s", ErrNotMigrated, schema)
	}
	migrator, err := rivermigrate.New(riverpgxv5.New(pool), &rivermigrate.Config{Schema: schema})
	if err != nil {
		return fmt.Errorf("river migrator: %w", err)
	}
	val, err := migrator.Validate(ctx, nil)
	if err != nil {
		return fmt.Errorf("check river migrations: %w", err)
	}
	if !val.OK {
		return fmt.Errorf("%w: river: %v", ErrNotMigrated, val.Messages)
	}
	all, err := Migrations()
	if err != nil {
		return err
	}
	var exists bool
	if err := pool.QueryRow(ctx, "SELECT to_regclass('herald_migration') IS NOT NULL").Scan(&exists); err != nil {
		return fmt.Errorf("check herald migrations: %w", err)
	}
	if !exists {
		return fmt.Errorf("%w: none of Herald's %d migrations has been applied", ErrNotMigrated, len(all))
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("acquire connection: %w", err)
	}
	defer conn.Release()
	applied, err := appliedVersions(ctx, conn.Conn())
	if err != nil {
		return err
	}
	for _, m := range all {
		if !applied[m.Version] {
			return fmt.Errorf("%w: Herald migration %s is missing", ErrNotMigrated, m.Name)
		}
	}
	return nil
}

func appliedVersions(ctx context.Context, conn *pgx.Conn) (map[int]bool, error) {
	rows, err := conn.Query(ctx, "SELECT version FROM herald_migration")
	if err != nil {
		return nil, fmt.Errorf("read herald_migration: %w", err)
	}
	versions, err := pgx.CollectRows(rows, pgx.RowTo[int])
	if err != nil {
		return nil, fmt.Errorf("read herald_migration: %w", err)
	}
	applied := make(map[int]bool, len(versions))
	for _, v := range versions {
		applied[v] = true
	}
	return applied, nil
}
