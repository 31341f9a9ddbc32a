package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/heraldpush/herald/api"
	"github.com/heraldpush/herald/db"
	"github.com/heraldpush/herald/jobs"
)

// shutdownGrace bounds how long in-flight requests may take to finish after
// a signal.
const shutdownGrace = 15 * time.Second

// runServe runs the API (and, as later parts land, the workers) until ctx is
// cancelled, then shuts down in order: stop accepting, finish requests,
// close the pool.
func runServe(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	cfg, err := loadConfig(getenv)
	if err != nil {
		return err
	}
	fs := newFlagSet("serve", stderr)
	role := fs.String("role", "all", "what this process does: all, api or worker")
	migrate := fs.Bool("migrate", false, "apply migrations before serving")
	fs.StringVar(&cfg.Addr, "addr", cfg.Addr, "listen address (HERALD_ADDR)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	switch *role {
	case "all", "api", "worker":
	default:
		return fmt.Errorf("--role %q is not one of all, api, worker", *role)
	}
	if err := cfg.requireDatabase(); err != nil {
		return err
	}
	if err := cfg.validateAPIKeys(); err != nil {
		return err
	}
	logger, err := newLogger(getenv, stderr)
	if err != nil {
		return err
	}

	pool, err := db.Open(ctx, cfg.DatabaseURL, db.PoolConfig{})
	if err != nil {
		return err
	}
	defer pool.Close()

	if *migrate {
		if _, err := db.Migrate(ctx, pool, logger); err != nil {
			return fmt.Errorf("migrate: %w", err)
		}
	} else if err := db.CheckMigrated(ctx, pool); err != nil {
		if errors.Is(err, db.ErrNotMigrated) {
			return fmt.Errorf("%w; run `herald migrate` first, or start with `herald serve --migrate`", err)
		}
		return err
	}

	if len(cfg.APIKeys) == 0 {
		logger.Warn("HERALD_API_KEYS is empty: every /v1 request will be refused with 401")
	}
	if cfg.AdminPassword == "" {
		logger.Warn("HERALD_ADMIN_PASSWORD is empty: the dashboard and River UI are disabled")
	}

	riverClient, err := jobs.NewRiverClient(pool, jobs.RiverConfig{Logger: logger})
	if err != nil {
		return err
	}

	server, err := api.NewServer(api.Config{
		Logger:  logger,
		Pool:    pool,
		APIKeys: cfg.APIKeys,
		River:   riverClient,
		Ready: func(ctx context.Context) error {
			if err := pool.Ping(ctx); err != nil {
				return fmt.Errorf("database unreachable: %w", err)
			}
			return db.CheckMigrated(ctx, pool)
		},
	})
	if err != nil {
		return err
	}

	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", cfg.Addr, err)
	}
	httpServer := &http.Server{
		Handler:           server,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
	}
	logger.Info("herald serving", "addr", ln.Addr().String(), "role", *role, "version", version)
	fmt.Fprintf(stdout, "herald: listening on http://%s\n", ln.Addr())

	serveErr := make(chan error, 1)
	go func() { serveErr <- httpServer.Serve(ln) }()

	select {
	case err := <-serveErr:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	logger.Info("shutting down")
	shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownGrace)
	defer cancel()
	if err := httpServer.Shutdown(shutdownCtx); err != nil {
		return fmt.Errorf("shutdown: %w", err)
	}
	logger.Info("stopped")
	return nil
}
