package db

import (
	"context"
	"fmt"
	"regexp"
	"slices"

	"github.com/jackc/pgx/v5"
)

// heraldTables are the tables (and sequences of their own: an identity
// column's moves with its table), views and functions Herald's migrations
// create,
// read from their CREATE statements, so that a migration that adds one
// needs no list kept beside it; herald_migration is Migrate's own.
func heraldTables() (tables, functions []string, err error) {
	all, err := Migrations()
	if err != nil {
		return nil, nil, err
	}
	tables = []string{"herald_migration"}
	for _, m := range all {
		for _, match := range slices.Concat(createTable.FindAllStringSubmatch(m.SQL, -1), createSequence.FindAllStringSubmatch(m.SQL, -1),
			createView.FindAllStringSubmatch(m.SQL, -1)) {
			if !slices.Contains(tables, match[1]) {
				tables = append(tables, match[1])
			}
		}
		for _, match := range createFunction.FindAllStringSubmatch(m.SQL, -1) {
			if !slices.Contains(functions, match[1]) {
				functions = append(functions, match[1])
			}
		}
	}
	return tables, functions, nil
}

var (
	createTable    = regexp.MustCompile(`(?i)\bCREATE\s+(?:UNLOGGED\s+)?TABLE\s+(?:IF\s+NOT\s+EXISTS\s+)?([a-z_][a-z0-9_]*)`)
	createSequence = regexp.MustCompile(`(?i)\bCREATE\s+SEQUENCE\s+(?:IF\s+NOT\s+EXISTS\s+)?([a-z_][a-z0-9_]*)`)
	createFunction = regexp.MustCompile(`(?i)\bCREATE\s+(?:OR\s+REPLACE\s+)?FUNCTION\s+([a-z_][a-z0-9_]*)`)
	createView     = regexp.MustCompile(`(?i)\bCREATE\s+(?:OR\s+REPLACE\s+)?VIEW\s+([a-z_][a-z0-9_]*)`)
)

// moveFromPublic moves an installation made before Herald had a schema of
// its own, whose tables (Herald's and River's) are in public, into schema,
// in one transaction: ALTER ... SET SCHEMA keeps every row, index,
// constraint, identity sequence and job, and changes only the name they
// are found under. It does nothing once schema holds Herald's tables, when
// public holds none, or when schema is public.
//
// Herald's functions move with its tables. River's objects are the tables,
// types and functions of public whose names start with river_. An application that itself ran River in public,
// sharing its tables with Herald's, would find its own jobs moved with
// them; it should keep Herald in public (HERALD_DB_SCHEMA=public).
func moveFromPublic(ctx context.Context, conn *pgx.Conn, schema string) ([]string, error) {
	if legacy, err := inPublic(ctx, conn, schema); err != nil || !legacy {
		return nil, err
	}
	tables, functions, err := heraldTables()
	if err != nil {
		return nil, err
	}
	var moved []string
	err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		// Tables first (with their sequences and indexes), then River's
		// functions and Herald's, named by argument types that must still be
		// found, then River's enum type. Columns, indexes and constraints refer to types and
		// functions by identity, not by name, so nothing else changes.
		rows, err := tx.Query(ctx, `
			SELECT kind, ident, name FROM (
				SELECT 1 AS step, CASE c.relkind WHEN 'S' THEN 'SEQUENCE' WHEN 'v' THEN 'VIEW' ELSE 'TABLE' END AS kind,
				       quote_ident(c.relname) AS ident, c.relname::text AS name FROM pg_class c
				WHERE c.relnamespace = 'public'::regnamespace AND c.relkind IN ('r', 'p', 'S', 'v')
				  AND (c.relname = ANY ($1) OR c.relname LIKE 'river\_%')
				  AND NOT (c.relkind = 'S' AND EXISTS (SELECT FROM pg_depend d
				      WHERE d.classid = 'pg_class'::regclass AND d.objid = c.oid AND d.deptype IN ('a', 'i')))
				UNION ALL
				SELECT 2, 'FUNCTION', quote_ident(p.proname) || '(' || pg_get_function_identity_arguments(p.oid) || ')', p.proname::text
				FROM pg_proc p
				WHERE p.pronamespace = 'public'::regnamespace AND (p.proname LIKE 'river\_%' OR p.proname = ANY ($2))
				UNION ALL
				SELECT 3, 'TYPE', quote_ident(t.typname), t.typname::text FROM pg_type t
				WHERE t.typnamespace = 'public'::regnamespace AND t.typtype = 'e' AND t.typname LIKE 'river\_%'
			) o ORDER BY step, name`, tables, functions)
		if err != nil {
			return err
		}
		type object struct{ kind, ident, name string }
		objects, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (object, error) {
			var o object
			return o, r.Scan(&o.kind, &o.ident, &o.name)
		})
		if err != nil {
			return err
		}
		target := pgx.Identifier{schema}.Sanitize()
		for _, o := range objects {
			if _, err := tx.Exec(ctx, fmt.Sprintf("ALTER %s public.%s SET SCHEMA %s", o.kind, o.ident, target)); err != nil {
				return fmt.Errorf("move %s %s: %w", o.kind, o.name, err)
			}
			moved = append(moved, o.name)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("move Herald's tables from public to %s: %w", schema, err)
	}
	return moved, nil
}

// inPublic reports whether Herald's tables are in public while schema, where
// they belong, has none: an installation from before Herald had a schema of
// its own.
func inPublic(ctx context.Context, q DBTX, schema string) (bool, error) {
	if schema == "public" {
		return false, nil
	}
	var legacy bool
	if err := q.QueryRow(ctx, `SELECT to_regclass('public.herald_migration') IS NOT NULL
		AND to_regclass($1) IS NULL`, pgx.Identifier{schema, "herald_migration"}.Sanitize()).Scan(&legacy); err != nil {
		return false, fmt.Errorf("look for Herald's tables in public: %w", err)
	}
	return legacy, nil
}
