package main

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/heraldpush/herald/db"
)

// runMigrate applies River's and Herald's migrations and says what it did.
func runMigrate(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := newFlagSet("migrate", stderr)
	if help, err := parseFlags(fs, args, "herald migrate", migrateEnv, stdout); help || err != nil {
		return err
	}
	cfg, err := loadConfig(getenv)
	if err != nil {
		return err
	}
	if err := cfg.requireDatabase(); err != nil {
		return err
	}
	logger, err := newLogger(getenv, stderr)
	if err != nil {
		return err
	}
	pool, err := db.Open(ctx, cfg.DatabaseURL, db.PoolConfig{MaxConns: 2, Schema: cfg.DBSchema})
	if err != nil {
		return err
	}
	defer pool.Close()
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
