package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/heraldpush/herald/db"
)

// runMigrate applies River's and Herald's migrations and says what it did;
// with --status it lists them, applied or not, and with --dry-run it shows
// the SQL it would run. Neither of those changes the database.
func runMigrate(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := newFlagSet("migrate", stderr)
	status := fs.Bool("status", false, "list River's and Herald's migrations and whether each is applied; change nothing")
	dryRun := fs.Bool("dry-run", false, "print the SQL of the migrations that would be applied; change nothing")
	if help, err := parseFlags(fs, args, "herald migrate [--status | --dry-run]", migrateEnv, stdout); help || err != nil {
		return err
	}
	if *status && *dryRun {
		return fmt.Errorf("--status and --dry-run: give one")
	}
	logger, err := newLogger(getenv, stderr)
	if err != nil {
		return err
	}
	pool, cfg, err := openDatabase(ctx, getenv)
	if err != nil {
		return err
	}
	defer pool.Close()
	if *status || *dryRun {
		plan, err := db.PlanMigrations(ctx, pool)
		if err != nil {
			return fmt.Errorf("read migrations: %w", err)
		}
		if *status {
			writeMigrationStatus(stdout, plan, cfg.DBSchema)
		} else {
			writeDryRun(stdout, plan, cfg.DBSchema)
		}
		return nil
	}
	// Concurrent runs take turns on a session's advisory lock, which a
	// pooler in transaction mode would leave held on a server session.
	if err := db.CheckOwnSessions(ctx, pool); err != nil {
		return err
	}
	res, err := db.Migrate(ctx, pool, logger)
	if err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	if len(res.MovedFromPublic) > 0 {
		fmt.Fprintf(stdout, "herald migrate: moved %s from schema public to %s\n", strings.Join(res.MovedFromPublic, ", "), cfg.DBSchema)
	}
	if len(res.RiverApplied) == 0 && len(res.HeraldApplied) == 0 {
		fmt.Fprintln(stdout, "herald migrate: the database is up to date")
		return nil
	}
	fmt.Fprintf(stdout, "herald migrate: applied River migrations %v and Herald migrations %v\n", res.RiverApplied, res.HeraldApplied)
	return nil
}

// writeMigrationStatus lists every migration, a line each.
func writeMigrationStatus(w io.Writer, plan db.MigrationPlan, schema string) {
	if plan.MoveFromPublic {
		fmt.Fprintf(w, "Herald's tables are in schema public: herald migrate moves them to schema %s first\n", schema)
	}
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "LINE\tVERSION\tNAME\tSTATE")
	for _, m := range plan.Migrations {
		state := "pending"
		if m.Applied {
			state = "applied"
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\n", m.Line, m.Version, m.Name, state)
	}
	tw.Flush()
	fmt.Fprintf(w, "%d pending\n", len(plan.Pending()))
}

// writeDryRun prints the SQL herald migrate would run, in its order.
func writeDryRun(w io.Writer, plan db.MigrationPlan, schema string) {
	pending := plan.Pending()
	if len(pending) == 0 && !plan.MoveFromPublic {
		fmt.Fprintln(w, "-- herald migrate --dry-run: the database is up to date; nothing would be applied")
		return
	}
	if plan.MoveFromPublic {
		fmt.Fprintf(w, "-- first, Herald's and River's tables, types and functions move from schema public to %s\n", schema)
	}
	fmt.Fprintf(w, "-- herald migrate --dry-run: %d migrations would be applied, in schema %s, each in a transaction of its own\n", len(pending), schema)
	for _, m := range pending {
		fmt.Fprintf(w, "\n-- %s migration %d: %s\n%s\n", m.Line, m.Version, m.Name, strings.TrimSpace(m.SQL))
	}
}
