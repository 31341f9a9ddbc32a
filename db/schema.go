package db

import (
	"context"
	"fmt"
	"regexp"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// DefaultSchema is the PostgreSQL schema Herald's tables and River's live in
// unless configured otherwise (HERALD_DB_SCHEMA). A schema of their own keeps
// them apart from the tables of an application that shares the database, so
// that its `messages` or `users` never meet Herald's.
const DefaultSchema = "herald"

// schemaName is what a schema may be called: a lower-case identifier that
// needs no quoting, so that it reads the same in search_path, in River's
// qualified names (which River writes unquoted) and in its notification
// topics. River's own limit on the length leaves room for its longest topic.
var schemaName = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,45}$`)

// CheckSchema reports whether name can be Herald's schema.
func CheckSchema(name string) error {
	if !schemaName.MatchString(name) {
		return fmt.Errorf("schema %q: a schema for Herald is 1 to 46 lower-case letters, digits and underscores, not starting with a digit", name)
	}
	if name == "information_schema" || strings.HasPrefix(name, "pg_") {
		return fmt.Errorf("schema %q is reserved by PostgreSQL", name)
	}
	return nil
}

// PoolSchema is the schema a pool opened by Open works in ("" for a pool
// opened otherwise). Herald's River clients and migrations read it here, so
// that they cannot disagree with the pool about where the tables are.
func PoolSchema(pool *pgxpool.Pool) string {
	return pool.Config().ConnConfig.RuntimeParams["search_path"]
}

// schemaOf is PoolSchema for code that needs one: a pool that was not opened
// by Open would put Herald's tables wherever its search_path says.
func schemaOf(pool *pgxpool.Pool) (string, error) {
	s := PoolSchema(pool)
	if s == "" {
		return "", fmt.Errorf("db: the pool has no schema of Herald's; open it with db.Open")
	}
	return s, nil
}

// UseSchema makes schema the first place unqualified names are looked up
// for the rest of tx, and returns the function that puts back what was
// there: Herald's queries name their tables unqualified, and a caller's
// transaction (jobs.Scheduler) comes from a connection that looks in its
// own schemas. Both changes are SET LOCAL, so whatever happens the setting
// ends with the transaction, and a savepoint rolled back undoes them too.
func UseSchema(ctx context.Context, tx pgx.Tx, schema string) (restore func(context.Context) error, err error) {
	if err := CheckSchema(schema); err != nil {
		return nil, err
	}
	var previous string
	// The CTE reads the setting before the outer row sets it.
	if err := tx.QueryRow(ctx, `WITH previous AS MATERIALIZED (SELECT current_setting('search_path') AS p)
		SELECT p, set_config('search_path', $1, true) FROM previous`,
		pgx.Identifier{schema}.Sanitize()).Scan(&previous, new(string)); err != nil {
		return nil, fmt.Errorf("set search_path: %w", err)
	}
	return func(ctx context.Context) error {
		if _, err := tx.Exec(ctx, "SELECT set_config('search_path', $1, true)", previous); err != nil {
			return fmt.Errorf("restore search_path: %w", err)
		}
		return nil
	}, nil
}
