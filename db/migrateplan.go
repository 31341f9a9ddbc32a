package db

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
)

// MigrationState is one migration this binary knows, River's or Herald's,
// and whether the database has it.
type MigrationState struct {
	// Line is "river" or "herald".
	Line    string
	Version int
	Name    string
	Applied bool
	// SQL is what applying it runs.
	SQL string
}

// MigrationPlan is what Migrate would do to a database, found without
// changing it: `herald migrate --status` and `--dry-run` show it.
type MigrationPlan struct {
	// MoveFromPublic is set when Herald's tables are still in schema
	// public, from before Herald had a schema of its own: Migrate moves
	// them first.
	MoveFromPublic bool
	// Migrations are River's, then Herald's, each in version order.
	Migrations []MigrationState
}

// Pending returns the migrations not applied yet, in the order Migrate
// applies them.
func (p MigrationPlan) Pending() []MigrationState {
	var out []MigrationState
	for _, m := range p.Migrations {
		if !m.Applied {
			out = append(out, m)
		}
	}
	return out
}

// PlanMigrations reads which of River's and Herald's migrations the pool's
// schema has, and writes nothing: a schema that does not exist yet has none.
func PlanMigrations(ctx context.Context, pool *pgxpool.Pool) (MigrationPlan, error) {
	var plan MigrationPlan
	schema, err := schemaOf(pool)
	if err != nil {
		return plan, err
	}
	if plan.MoveFromPublic, err = inPublic(ctx, pool, schema); err != nil {
		return plan, err
	}
	migrator, err := rivermigrate.New(riverpgxv5.New(pool), &rivermigrate.Config{Schema: schema})
	if err != nil {
		return plan, fmt.Errorf("river migrator: %w", err)
	}
	// Before a move, River's tables are still in public, and so is what
	// was applied of them; the move keeps it.
	riverSchemaOf := migrator
	if plan.MoveFromPublic {
		if riverSchemaOf, err = rivermigrate.New(riverpgxv5.New(pool), &rivermigrate.Config{Schema: "public"}); err != nil {
			return plan, fmt.Errorf("river migrator: %w", err)
		}
	}
	existing, err := riverSchemaOf.ExistingVersions(ctx)
	if err != nil {
		return plan, fmt.Errorf("read river migrations: %w", err)
	}
	riverApplied := map[int]bool{}
	for _, m := range existing {
		riverApplied[m.Version] = true
	}
	for _, m := range migrator.AllVersions() {
		plan.Migrations = append(plan.Migrations, MigrationState{
			Line: "river", Version: m.Version, Name: m.Name, Applied: riverApplied[m.Version], SQL: m.SQLUp,
		})
	}

	all, err := Migrations()
	if err != nil {
		return plan, err
	}
	table := pgx.Identifier{schema, "herald_migration"}
	if plan.MoveFromPublic {
		table = pgx.Identifier{"public", "herald_migration"}
	}
	heraldApplied := map[int]bool{}
	var exists bool
	if err := pool.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", table.Sanitize()).Scan(&exists); err != nil {
		return plan, fmt.Errorf("look for herald_migration: %w", err)
	}
	if exists {
		rows, err := pool.Query(ctx, "SELECT version FROM "+table.Sanitize())
		if err != nil {
			return plan, fmt.Errorf("read herald_migration: %w", err)
		}
		versions, err := pgx.CollectRows(rows, pgx.RowTo[int])
		if err != nil {
			return plan, fmt.Errorf("read herald_migration: %w", err)
		}
		for _, v := range versions {
			heraldApplied[v] = true
		}
	}
	for _, m := range all {
		plan.Migrations = append(plan.Migrations, MigrationState{
			Line: "herald", Version: m.Version, Name: m.Name, Applied: heraldApplied[m.Version], SQL: m.SQL,
		})
	}
	return plan, nil
}
