package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"runtime/pprof"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/riverqueue/river"

	"github.com/heraldpush/herald/api"
	"github.com/heraldpush/herald/db"
	"github.com/heraldpush/herald/jobs"
)

// shutdownGrace bounds how long in-flight requests and chunks may take to
// finish after a signal; a chunk still running then is cancelled and River
// retries it later (its settled deliveries are skipped).
const shutdownGrace = 15 * time.Second

// runServe runs the API and the chunk workers (or one of them, by --role)
// until ctx is cancelled, then shuts down in order: stop accepting requests,
// let running chunks finish, close the providers and the pool.
func runServe(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	// A configuration error is reported after the flags are parsed, so that
	// --help answers whatever the environment holds.
	cfg, cfgErr := loadConfig(getenv)
	fs := newFlagSet("serve", stderr)
	role := fs.String("role", "all", "what this process does: all, api or worker")
	migrate := fs.Bool("migrate", false, "apply migrations before serving")
	fs.StringVar(&cfg.Addr, "addr", cfg.Addr, "listen address (HERALD_ADDR)")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of the whole run to this file")
	memProfile := fs.String("memprofile", "", "write a heap profile to this file at shutdown")
	if help, err := parseFlags(fs, args, "herald serve [flags]", serveEnv, stdout); help || err != nil {
		return err
	}
	if cfgErr != nil {
		return cfgErr
	}
	stopProfiles, err := startProfiles(*cpuProfile, *memProfile)
	if err != nil {
		return err
	}
	defer stopProfiles()
	switch *role {
	case "all", "api", "worker":
	default:
		return fmt.Errorf("--role %q is not one of all, api, worker", *role)
	}
	works := *role != "api"
	if err := cfg.requireDatabase(); err != nil {
		return err
	}
	if err := cfg.validateAPIKeys(); err != nil {
		return err
	}
	if err := cfg.validateAdminPassword(); err != nil {
		return err
	}
	logger, err := newLogger(getenv, stderr)
	if err != nil {
		return err
	}
	// The address first, before anything starts: a port that is taken is
	// said at once, with the setting to change, and no River client has
	// begun working chunks in a process that cannot serve.
	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return fmt.Errorf("listen on %s: %w (set HERALD_ADDR or --addr to a free address)", cfg.Addr, err)
	}
	defer ln.Close()

	pool, err := db.Open(ctx, cfg.DatabaseURL, db.PoolConfig{MaxConns: cfg.poolSize()})
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

	if *role != "worker" && len(cfg.APIKeys) == 0 {
		logger.Warn("HERALD_API_KEYS is empty: every /v1 request will be refused with 401")
	}
	if cfg.AdminPassword == "" {
		logger.Warn("HERALD_ADMIN_PASSWORD is empty: the dashboard and River UI are disabled")
	}

	// One registry for the process's metrics, served at /metrics.
	registry := prometheus.NewRegistry()
	registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	jobs.RegisterMessageMetrics(registry, pool)

	// Background loops run until stop() and are waited for at shutdown.
	bgCtx, stopBackground := context.WithCancel(context.WithoutCancel(ctx))
	defer stopBackground()
	var background []func()
	goBackground := func(f func(context.Context)) {
		done := make(chan struct{})
		go func() { defer close(done); f(bgCtx) }()
		background = append(background, func() { <-done })
	}

	riverCfg := jobs.RiverConfig{
		Logger: logger, UrgentWorkers: cfg.UrgentWorkers, BulkWorkers: cfg.BulkWorkers,
		FetchPollInterval: cfg.FetchPollInterval,
		ChunkTimeout:      cfg.ChunkTimeout, RescueAfter: cfg.RescueAfter,
		MaterializeEvery: cfg.MaterializeEvery, Retention: cfg.Retention,
	}
	// A worker's clock on the database and dispatch metrics.
	var (
		clock   *jobs.Clock
		metrics *jobs.Metrics
	)
	if works {
		metrics = jobs.NewMetrics(registry)
		roots, err := rootCAs(cfg.CertFile)
		if err != nil {
			return err
		}
		logDisabledChannels(ctx, cfg, logger)
		// Each lane sends through provider clients of its own, and the
		// urgent lane's chunks read and write through connections of their
		// own, kept open: a bulk fan-out takes every shared connection at
		// its due instant.
		var bulk, urgent *providers
		var urgentPool *pgxpool.Pool
		if cfg.Lanes.Bulk {
			if bulk, err = buildProviders(ctx, cfg, roots, logger, "bulk"); err != nil {
				return err
			}
			defer bulk.close()
		}
		if cfg.Lanes.Urgent {
			if urgent, err = buildProviders(ctx, cfg, roots, logger, "urgent"); err != nil {
				return err
			}
			defer urgent.close()
			if urgentPool, err = db.Open(ctx, cfg.DatabaseURL, db.PoolConfig{MaxConns: cfg.urgentPoolSize(), MinConns: 2}); err != nil {
				return err
			}
			defer urgentPool.Close()
		}
		clock = jobs.NewClock(pool, logger)
		if err := clock.Measure(ctx); err != nil {
			return fmt.Errorf("measure the database clock: %w", err)
		}
		logger.Info("database clock offset measured", "offset", clock.Offset())
		workers := river.NewWorkers()
		materializer := &jobs.Materializer{
			Pool: pool, Logger: logger, Lead: cfg.ScheduleLead, ChunkSize: cfg.ChunkSize, Limits: cfg.ScheduleLimits,
		}
		fanOut := jobs.FanOutConfig{
			Pool: pool, UrgentPool: urgentPool, Logger: logger, Clock: clock, Timeout: cfg.ChunkTimeout,
			Metrics: metrics,
		}
		var configured []string
		for _, ch := range jobs.Channels {
			if cfg.enabled(ch) {
				configured = append(configured, ch)
			}
		}
		fanOut.Breakers = jobs.NewBreakers(jobs.BreakerConfig{
			Cooldown: cfg.BreakerCooldown, MaxCooldown: max(30*time.Second, cfg.BreakerCooldown),
		}, configured...)
		if bulk != nil {
			fanOut.Providers = bulk.byChannel
		}
		if urgent != nil {
			fanOut.UrgentProviders = urgent.byChannel
		}
		worker := jobs.Register(workers, fanOut, materializer, &jobs.Retainer{Pool: pool, Logger: logger, Retention: cfg.Retention})
		riverCfg.Workers = workers
		riverCfg.UrgentPool = urgentPool
		riverCfg.Lanes = cfg.Lanes
		jobs.RegisterProcessMetrics(registry, worker.Breakers(), clock)
		goBackground(func(ctx context.Context) { clock.Run(ctx, 30*time.Second) })
		goBackground((&jobs.Promoter{Pool: pool, Logger: logger}).Run)
		goBackground((&jobs.StatusReporter{
			Pool: pool, Logger: logger, ProcessID: processID(), Breakers: worker.Breakers(),
		}).Run)
	}
	riverClient, err := jobs.NewRiverClient(pool, riverCfg)
	if err != nil {
		return err
	}
	// A worker's urgent lane has a River client of its own, on the urgent
	// lane's connections. Each lane is woken at its chunks' due instants
	// through the client that serves it, so that the urgent lane's wake
	// never waits for a connection behind the bulk lane's chunks either.
	riverClients := []*river.Client[pgx.Tx]{riverClient}
	wake := map[string]func(context.Context) error{}
	if works && cfg.Lanes.Bulk {
		wake[jobs.QueueBulk] = jobs.RiverNotify(riverClient.Driver(), jobs.QueueBulk)
	}
	if works && cfg.Lanes.Urgent {
		urgentClient, err := jobs.NewUrgentRiverClient(riverCfg)
		if err != nil {
			return err
		}
		riverClients = append(riverClients, urgentClient)
		wake[jobs.QueueUrgent] = jobs.RiverNotify(urgentClient.Driver(), jobs.QueueUrgent)
	}
	if works {
		for _, c := range riverClients {
			if err := c.Start(ctx); err != nil {
				return fmt.Errorf("start River: %w", err)
			}
		}
		goBackground((&jobs.Waker{Pool: pool, Clock: clock, Logger: logger, Lanes: wake, Metrics: metrics}).Run)
	}

	// River UI serves where the API does, behind the dashboard's login.
	var riverUI http.Handler
	if cfg.AdminPassword != "" && *role != "worker" {
		if riverUI, err = startRiverUI(bgCtx, riverClient, logger); err != nil {
			return err
		}
	}

	server, err := api.NewServer(api.Config{
		Metrics:    promhttp.HandlerFor(registry, promhttp.HandlerOpts{ErrorLog: slog.NewLogLogger(logger.Handler(), slog.LevelWarn)}),
		Logger:     logger,
		Pool:       pool,
		APIKeys:    cfg.APIKeys,
		River:      riverClient,
		ChunkSize:  cfg.ChunkSize,
		Configured: map[string]bool{jobs.ChannelAPNs: cfg.enabled(jobs.ChannelAPNs), jobs.ChannelFCM: cfg.enabled(jobs.ChannelFCM), jobs.ChannelWebPush: cfg.enabled(jobs.ChannelWebPush)},
		WorkerOnly: *role == "worker",
		Ready: func(ctx context.Context) error {
			if err := pool.Ping(ctx); err != nil {
				return fmt.Errorf("database unreachable: %w", err)
			}
			return db.CheckMigrated(ctx, pool)
		},
		AdminPassword:  cfg.AdminPassword,
		RiverUI:        riverUI,
		TrustedProxies: cfg.TrustedProxies,
		SecureCookies:  cfg.SecureCookies,
		WebPushEgress:  cfg.WebPushEgress,

		RateLimit:         float64(cfg.RateLimit),
		RateBurst:         cfg.RateBurst,
		MaxDevicesPerUser: cfg.MaxDevicesPerUser,
		ScheduleLimits:    cfg.ScheduleLimits,
		ScheduleLead:      cfg.ScheduleLead,
	})
	if err != nil {
		return err
	}

	// Every phase of a connection has a deadline, so that a client that
	// sends slowly, stops halfway or never reads its answer holds a
	// connection and its goroutine for a bounded time. Headers are small:
	// they get ten seconds at most, less when the whole read has less.
	httpServer := &http.Server{
		Handler:           server,
		ReadHeaderTimeout: min(10*time.Second, cfg.ReadTimeout),
		ReadTimeout:       cfg.ReadTimeout,
		WriteTimeout:      cfg.WriteTimeout,
		IdleTimeout:       cfg.IdleTimeout,
	}
	serving := []any{"addr", ln.Addr().String(), "role", *role, "version", version}
	if works {
		serving = append(serving, "lanes", cfg.Lanes.String())
	}
	logger.Info("herald serving", serving...)
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
	var errs []error
	if err := httpServer.Shutdown(shutdownCtx); err != nil {
		errs = append(errs, fmt.Errorf("shutdown http: %w", err))
	}
	if works {
		var wg sync.WaitGroup
		for _, c := range riverClients {
			wg.Go(func() { stopRiver(shutdownCtx, c, logger) })
		}
		wg.Wait()
	}
	stopBackground()
	for _, wait := range background {
		wait()
	}
	logger.Info("stopped")
	return errors.Join(errs...)
}

// startProfiles starts a CPU profile and returns the function that stops
// it and writes the heap profile, for `herald bench --profile`.
func startProfiles(cpuFile, memFile string) (func(), error) {
	var cpu *os.File
	if cpuFile != "" {
		f, err := os.Create(cpuFile)
		if err != nil {
			return nil, fmt.Errorf("cpu profile: %w", err)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			f.Close()
			return nil, fmt.Errorf("cpu profile: %w", err)
		}
		cpu = f
	}
	return func() {
		if cpu != nil {
			pprof.StopCPUProfile()
			cpu.Close()
		}
		if memFile != "" {
			if f, err := os.Create(memFile); err == nil {
				_ = pprof.WriteHeapProfile(f)
				f.Close()
			}
		}
	}, nil
}

// stopRiver lets running chunks finish within the grace period, then
// cancels what is left: River retries a cancelled chunk, and its settled
// deliveries are skipped.
func stopRiver(ctx context.Context, client *river.Client[pgx.Tx], logger *slog.Logger) {
	if err := client.Stop(ctx); err != nil {
		logger.Warn("chunks still running at the end of the grace period; cancelling them", "error", err)
		cancelCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := client.StopAndCancel(cancelCtx); err != nil {
			logger.Error("River did not stop", "error", err)
		}
	}
}

// processID names this process in provider status reports: host and pid,
// plus a random suffix so that a restarted process is a new reporter.
func processID() string {
	host, _ := os.Hostname()
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	return fmt.Sprintf("%s/%d/%s", host, os.Getpid(), hex.EncodeToString(b))
}
