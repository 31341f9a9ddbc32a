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
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/riverqueue/river"

	"github.com/heraldpush/herald/api"
	"github.com/heraldpush/herald/db"
	"github.com/heraldpush/herald/jobs"
	"github.com/heraldpush/herald/jobs/apps"
	"github.com/heraldpush/herald/jobs/receipt"
)

// runServe runs the API and the chunk workers (or one of them, by --role)
// until ctx is cancelled, then shuts down in order: stop accepting requests,
// let running chunks finish, close the providers and the pool.
func runServe(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	opts, help, err := parseServe(args, getenv, stdout, stderr)
	if help || err != nil {
		return err
	}
	stopProfiles, err := startProfiles(opts.cpuProfile, opts.memProfile)
	if err != nil {
		return err
	}
	defer stopProfiles()
	p, err := openProcess(ctx, opts, getenv, stderr)
	if err != nil {
		return err
	}
	defer p.close()
	var w *worker
	if opts.works() {
		if w, err = startChunkWorker(ctx, p); err != nil {
			return err
		}
		defer w.close()
	}
	handler, err := p.handler(ctx, w)
	if err != nil {
		return err
	}
	return p.serve(ctx, handler, w, stdout)
}

// serveOptions are `herald serve`'s configuration and flags.
type serveOptions struct {
	cfg                    config
	role                   string
	migrate                bool
	cpuProfile, memProfile string
}

// works reports whether the process works chunks (roles all and worker).
func (o serveOptions) works() bool { return o.role != "api" }

// parseServe reads the environment and the flags and checks them. A
// configuration error is reported after the flags are parsed, so that
// --help answers whatever the environment holds.
func parseServe(args []string, getenv func(string) string, stdout, stderr io.Writer) (serveOptions, bool, error) {
	cfg, cfgErr := loadConfig(getenv)
	o := serveOptions{cfg: cfg}
	fs := newFlagSet("serve", stderr)
	fs.StringVar(&o.role, "role", "all", "what this process does: all, api or worker")
	fs.BoolVar(&o.migrate, "migrate", false, "apply migrations before serving")
	fs.StringVar(&o.cfg.Addr, "addr", cfg.Addr, "listen address (HERALD_ADDR)")
	fs.StringVar(&o.cpuProfile, "cpuprofile", "", "write a CPU profile of the whole run to this file")
	fs.StringVar(&o.memProfile, "memprofile", "", "write a heap profile to this file at shutdown")
	if help, err := parseFlags(fs, args, "herald serve [flags]", serveEnv, stdout); help || err != nil {
		return o, help, err
	}
	if cfgErr != nil {
		return o, false, cfgErr
	}
	switch o.role {
	case "all", "api", "worker":
	default:
		return o, false, fmt.Errorf("--role %q is not one of all, api, worker", o.role)
	}
	if o.role == "worker" && o.cfg.PublicAddr != "" {
		return o, false, errors.New("HERALD_PUBLIC_ADDR: a worker serves no device routes; set it on the processes of role all or api")
	}
	for _, check := range []func() error{o.cfg.requireDatabase, o.cfg.validateAPIKeys, o.cfg.validateAdminPassword} {
		if err := check(); err != nil {
			return o, false, err
		}
	}
	return o, false, nil
}

// process is what every role of `herald serve` has: its listener, its
// connections, its metrics and its background loops.
type process struct {
	serveOptions
	logger *slog.Logger
	ln     net.Listener
	// adminLn is HERALD_ADMIN_ADDR's listener, nil when it is unset.
	adminLn net.Listener
	// publicLn is HERALD_PUBLIC_ADDR's listener (public.go), nil when it
	// is unset.
	publicLn net.Listener
	pool     *pgxpool.Pool
	registry *prometheus.Registry
	// pools exports the statistics of the process's connection pools.
	pools *jobs.PoolMetrics
	// apps is the process's view of the apps and their credentials, with
	// the lanes' clients in a worker.
	apps *apps.Registry
	// Background loops run until stopBackground and are waited for at
	// shutdown.
	bgCtx          context.Context
	stopBackground context.CancelFunc
	background     []func()
}

// openProcess binds the address, opens the pool and checks (or applies) the
// migrations. The address comes first, before anything starts: a port that
// is taken is said at once, with the setting to change, and no River client
// has begun working chunks in a process that cannot serve.
func openProcess(ctx context.Context, o serveOptions, getenv func(string) string, stderr io.Writer) (_ *process, err error) {
	p := &process{serveOptions: o}
	if p.logger, err = newLogger(getenv, stderr); err != nil {
		return nil, err
	}
	if p.ln, err = net.Listen("tcp", o.cfg.Addr); err != nil {
		return nil, fmt.Errorf("listen on %s: %w (set HERALD_ADDR or --addr to a free address)", o.cfg.Addr, err)
	}
	if p.adminLn, err = listenAdmin(o.cfg.AdminAddr); err != nil {
		p.ln.Close()
		return nil, err
	}
	if p.publicLn, err = listenPublic(o.cfg.PublicAddr); err != nil {
		p.ln.Close()
		if p.adminLn != nil {
			p.adminLn.Close()
		}
		return nil, err
	}
	p.bgCtx, p.stopBackground = context.WithCancel(context.WithoutCancel(ctx))
	defer func() {
		if err != nil {
			p.close()
		}
	}()
	if p.pool, err = db.Open(ctx, o.cfg.DatabaseURL, db.PoolConfig{MaxConns: o.cfg.poolSize(), Schema: o.cfg.DBSchema}); err != nil {
		return nil, err
	}
	// Before anything takes a session's lock or listens: through a pooler
	// in transaction mode neither would hold (docs/operations.md, Poolers).
	if err := db.CheckOwnSessions(ctx, p.pool); err != nil {
		return nil, err
	}
	p.logger.Info("database sessions are the process's own (a direct connection, or a pooler in session mode): River listens for its notifications, and a worker holds its liveness lock")
	if o.migrate {
		if _, err := db.Migrate(ctx, p.pool, p.logger); err != nil {
			return nil, fmt.Errorf("migrate: %w", err)
		}
	} else if err := db.CheckMigrated(ctx, p.pool); err != nil {
		if errors.Is(err, db.ErrNotMigrated) {
			return nil, fmt.Errorf("%w; run `herald migrate` first, or start with `herald serve --migrate`", err)
		}
		return nil, err
	}
	if o.role != "worker" && len(o.cfg.APIKeys) == 0 {
		p.logger.Info("HERALD_API_KEYS is empty: /v1 takes only the keys made with `herald keys create`")
	}
	if o.role != "worker" && o.cfg.AdminPassword == "" {
		p.logger.Info("HERALD_ADMIN_PASSWORD is empty: only the operators made with `herald operators create` can sign in to the dashboard")
	}
	// One registry for the process's metrics, served at /metrics.
	p.registry = prometheus.NewRegistry()
	p.registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	readBuildInfo().register(p.registry)
	p.pools = jobs.NewPoolMetrics(p.registry)
	p.pools.Add("main", p.pool)
	// Every role reads the database's gauges (the queues' depth, the
	// unsettled messages), on its own schedule, never per scrape.
	p.goBackground(jobs.NewDatabaseGauges(p.registry, p.pool, p.logger).Run)
	return p, nil
}

// goBackground runs f until shutdown.
func (p *process) goBackground(f func(context.Context)) {
	done := make(chan struct{})
	go func() { defer close(done); f(p.bgCtx) }()
	p.background = append(p.background, func() { <-done })
}

// stopBackgroundLoops stops the background loops and waits for them.
func (p *process) stopBackgroundLoops() {
	p.stopBackground()
	for _, wait := range p.background {
		wait()
	}
	p.background = nil
}

func (p *process) close() {
	p.stopBackgroundLoops()
	if p.pool != nil {
		p.pool.Close()
	}
	p.ln.Close()
	for _, ln := range []net.Listener{p.adminLn, p.publicLn} {
		if ln != nil {
			ln.Close()
		}
	}
}

// riverConfig is the River clients' configuration of this process.
func (p *process) riverConfig() jobs.RiverConfig {
	c := p.cfg
	return jobs.RiverConfig{
		Logger: p.logger, FetchPollInterval: c.FetchPollInterval, Lookahead: c.Lookahead,
		ChunkTimeout: c.ChunkTimeout, RescueAfter: c.RescueAfter, MaterializeEvery: c.MaterializeEvery,
		Retention: c.Retention, ShutdownTimeout: c.ShutdownTimeout,
	}
}

// worker is a process's chunk work: its lanes, its River clients and the
// loops that keep chunks on time.
type worker struct {
	lanes   *lanes
	clients *jobs.RiverClients
	fanOut  *jobs.FanOutWorker
}

// startChunkWorker builds the lanes, measures the database's clock, and starts
// the River clients and the loops beside them: the clock, the Promoter, the
// provider status reports and the Waker.
func startChunkWorker(ctx context.Context, p *process) (_ *worker, err error) {
	cfg, logger := p.cfg, p.logger
	metrics := jobs.NewMetrics(p.registry)
	logDisabledChannels(ctx, cfg, logger)
	w := &worker{}
	// The providers' quotas are shared by every process: their turns are
	// claimed from the database.
	var shared *quotas
	if w.lanes, shared, err = buildLanes(ctx, cfg, logger, p.pool); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			w.lanes.close()
		}
	}()
	// The apps' clients: each stored credential's, and the environment's
	// for the default app, read before the first chunk is.
	roots, err := rootCAs(cfg.CertFile)
	if err != nil {
		return nil, err
	}
	p.apps = apps.NewRegistry(apps.RegistryConfig{
		Pool: p.pool, Sealer: cfg.Sealer, Logger: logger, Lanes: cfg.Lanes,
		Build: credentialClients(cfg, roots, shared), Env: w.lanes.env, EnvWebPush: cfg.envWebPush(),
	})
	if err := p.apps.Refresh(ctx); err != nil {
		return nil, fmt.Errorf("read apps: %w", err)
	}
	p.goBackground(p.apps.Run)
	for i := range w.lanes.lanes {
		w.lanes.lanes[i].Apps = p.apps
	}
	clock := jobs.NewClock(p.pool, logger)
	if err := clock.Measure(ctx); err != nil {
		return nil, fmt.Errorf("measure the database clock: %w", err)
	}
	logger.Info("database clock offset measured", "offset", clock.Offset())

	materializer, err := jobs.NewMaterializer(&jobs.MaterializerConfig{
		Pool: p.pool, Logger: logger, Lead: cfg.ScheduleLead, ChunkSize: cfg.ChunkSize, Limits: cfg.ScheduleLimits,
	})
	if err != nil {
		return nil, err
	}
	retainer, err := jobs.NewRetainer(&jobs.RetainerConfig{
		Pool: p.pool, Logger: logger, Retention: cfg.Retention, DeviceRetention: cfg.DeviceRetention, AuditRetention: cfg.AuditRetention,
	})
	if err != nil {
		return nil, err
	}
	// The liveness lock is taken before any chunk is: a chunk of this
	// process's is never seen running without it (Takeover).
	liveness, err := jobs.NewLiveness(&jobs.LivenessConfig{ConnConfig: db.ConnConfig(p.pool), Logger: logger})
	if err != nil {
		return nil, err
	}
	livenessConn, err := liveness.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	p.goBackground(func(ctx context.Context) { liveness.Run(ctx, livenessConn) })
	signer, err := receiptSigner(ctx, p.pool, cfg.Receipts)
	if err != nil {
		return nil, err
	}
	workers := river.NewWorkers()
	// Whether some webhook wants the ledger's failures, read before the
	// first chunk's write and every second after.
	webhookTypes := jobs.NewWebhookTypes(p.pool, logger)
	if err := webhookTypes.Refresh(ctx); err != nil {
		return nil, err
	}
	p.goBackground(webhookTypes.Run)
	if w.fanOut, err = jobs.Register(workers, jobs.FanOutConfig{
		Pool: p.pool, Lanes: w.lanes.lanes, Logger: logger, Clock: clock, Timeout: cfg.ChunkTimeout, Metrics: metrics,
		// Every channel has breakers: an app's credentials may give any
		// of them a client.
		Breakers: jobs.NewBreakers(jobs.BreakerConfig{Cooldown: cfg.BreakerCooldown}, jobs.Channels...),
		Lease:    liveness,
		Webhooks: webhookTypes,
		Receipts: signer, ReceiptWindow: cfg.ReceiptWindow,
	}, materializer, retainer); err != nil {
		return nil, err
	}
	webhooks, err := jobs.NewWebhookWorker(jobs.WebhookConfig{Pool: p.pool, Logger: logger, Policy: cfg.WebhookEgress, Metrics: metrics})
	if err != nil {
		return nil, err
	}
	river.AddWorker(workers, webhooks)
	riverCfg := p.riverConfig()
	riverCfg.Workers, riverCfg.Lanes, riverCfg.ClientID = workers, w.lanes.lanes, liveness.ClientID
	if w.clients, err = jobs.NewRiverClients(p.pool, riverCfg); err != nil {
		return nil, err
	}
	// The loops beside the clients are built before anything starts, so
	// that a setting they refuse stops the process before it works chunks.
	promoter, err := jobs.NewPromoter(&jobs.PromoterConfig{Pool: p.pool, Logger: logger, Lookahead: cfg.Lookahead})
	if err != nil {
		return nil, err
	}
	status, err := jobs.NewStatusReporter(&jobs.StatusReporterConfig{
		Pool: p.pool, Logger: logger, ProcessID: processID(), Breakers: w.fanOut.Breakers(), Apps: p.apps,
	})
	if err != nil {
		return nil, err
	}
	waker, err := jobs.NewWaker(&jobs.WakerConfig{Pool: p.pool, Clock: clock, Logger: logger, Lanes: w.clients.Wakers(), Metrics: metrics,
		Warm: w.fanOut.Warm, Due: w.fanOut.Due})
	if err != nil {
		return nil, err
	}
	dispatcher, err := jobs.NewWebhookDispatcher(&jobs.WebhookDispatcherConfig{Pool: p.pool, Logger: logger, River: w.clients.Main})
	if err != nil {
		return nil, err
	}
	takeover, err := jobs.NewTakeover(&jobs.TakeoverConfig{
		Pool: p.pool, Logger: logger, Metrics: metrics,
		Wake: func(ctx context.Context, queue string) {
			if err := jobs.RiverNotify(p.pool, queue)(ctx); err != nil {
				logger.Warn("wake a lane after a takeover", "queue", queue, "error", err)
			}
		},
	})
	if err != nil {
		return nil, err
	}
	jobs.RegisterProcessMetrics(p.registry, w.fanOut.Breakers(), clock, p.apps.Name)
	w.fanOut.Breakers().SetNames(p.apps.Name)
	registerPacingMetrics(p.registry, w.lanes.lanes)
	for _, l := range w.lanes.lanes {
		if l.Pool != nil && l.Pool != p.pool {
			p.pools.Add(l.Queue, l.Pool)
		}
	}
	if err := w.clients.Start(ctx); err != nil {
		return nil, err
	}
	p.goBackground(func(ctx context.Context) { clock.Run(ctx, 30*time.Second) })
	p.goBackground(promoter.Run)
	p.goBackground(status.Run)
	p.goBackground(waker.Run)
	p.goBackground(takeover.Run)
	p.goBackground(dispatcher.Run)
	return w, nil
}

// close closes the lanes' providers and connections, once the River
// clients have stopped.
func (w *worker) close() { w.lanes.close() }

// handler is the HTTP API, with River UI behind the dashboard's login. It
// reads the stored API keys before it returns, and keeps them fresh in the
// background.
func (p *process) handler(ctx context.Context, w *worker) (*api.Server, error) {
	cfg := p.cfg
	// The API enqueues through the worker's main client, or through an
	// insert-only one in the api role.
	var riverClient *river.Client[pgx.Tx]
	if w != nil {
		riverClient = w.clients.Main
	} else {
		var err error
		if riverClient, err = jobs.NewRiverClient(p.pool, p.riverConfig()); err != nil {
			return nil, err
		}
	}
	var riverUI http.Handler
	if p.role != "worker" {
		var err error
		if riverUI, err = startRiverUI(p.bgCtx, riverClient, p.logger); err != nil {
			return nil, err
		}
	}
	configured := map[string]bool{}
	for _, ch := range jobs.Channels {
		configured[ch] = cfg.enabled(ch)
	}
	if p.apps == nil {
		// An API process: the apps and their public keys, no clients.
		p.apps = apps.NewRegistry(apps.RegistryConfig{Pool: p.pool, Sealer: cfg.Sealer, Logger: p.logger, EnvWebPush: cfg.envWebPush()})
		if err := p.apps.Refresh(ctx); err != nil {
			return nil, fmt.Errorf("read apps: %w", err)
		}
		p.goBackground(p.apps.Run)
	}
	// /metrics is on the public port unless the admin listener has it.
	var metrics http.Handler
	if p.adminLn == nil {
		metrics = p.metricsHandler()
	}
	srv, err := api.NewServer(api.Config{
		Metrics:    metrics,
		Registerer: p.registry,
		Logger:     p.logger,
		Pool:       p.pool,
		APIKeys:    cfg.APIKeys,
		River:      riverClient,
		ChunkSize:  cfg.ChunkSize,
		Configured: configured,
		Apps:       p.apps,
		AppStore:   &apps.Store{Pool: p.pool, Sealer: cfg.Sealer, EnvChannels: cfg.configuredChannels()},
		WorkerOnly: p.role == "worker",
		Ready: func(ctx context.Context) error {
			if err := p.pool.Ping(ctx); err != nil {
				return fmt.Errorf("database unreachable: %w", err)
			}
			return db.CheckMigrated(ctx, p.pool)
		},
		AdminPassword:  cfg.AdminPassword,
		RiverUI:        riverUI,
		TrustedProxies: cfg.TrustedProxies,
		SecureCookies:  cfg.SecureCookies,
		WebPushEgress:  cfg.WebPushEgress,
		WebhookEgress:  cfg.WebhookEgress,

		BodyBudget:        int64(cfg.BodyBudgetMB) << 20,
		RateLimit:         float64(cfg.RateLimit),
		RateBurst:         cfg.RateBurst,
		ReceiptRateLimit:  float64(cfg.ReceiptRateLimit),
		ReceiptRateBurst:  cfg.ReceiptRateBurst,
		MaxDevicesPerUser: cfg.MaxDevicesPerUser,
		ScheduleLimits:    cfg.ScheduleLimits,
		ScheduleLead:      cfg.ScheduleLead,
		PublicURL:         cfg.PublicURL,
	})
	if err != nil {
		return nil, err
	}
	if p.role != "worker" {
		if err := srv.Refresh(ctx); err != nil {
			return nil, err
		}
		p.goBackground(srv.Run)
	}
	return srv, nil
}

// serve answers requests until ctx is cancelled, then shuts down in order:
// stop fetching chunks and accepting requests, let the running chunks and
// requests finish (within HERALD_SHUTDOWN_TIMEOUT; River then cancels the
// chunks still running, which hand themselves back), stop the background
// loops.
func (p *process) serve(ctx context.Context, handler *api.Server, w *worker, stdout io.Writer) error {
	cfg := p.cfg
	// Every phase of a connection has a deadline, so that a client that
	// sends slowly, stops halfway or never reads its answer holds a
	// connection and its goroutine for a bounded time. Headers are small:
	// they get ten seconds at most, less when the whole read has less.
	httpServer := &http.Server{
		Handler:           handler,
		ReadHeaderTimeout: min(10*time.Second, cfg.ReadTimeout),
		ReadTimeout:       cfg.ReadTimeout,
		WriteTimeout:      cfg.WriteTimeout,
		IdleTimeout:       cfg.IdleTimeout,
	}
	serving := []any{"addr", p.ln.Addr().String(), "role", p.role, "version", version}
	if w != nil {
		serving = append(serving, "lanes", strings.Join(cfg.Lanes, ","))
	}
	p.logger.Info("herald serving", serving...)
	fmt.Fprintf(stdout, "herald: listening on http://%s\n", p.ln.Addr())

	admin := p.adminServer(stdout)
	limited := api.LimitListener(p.ln, api.ConnLimits{
		MaxTotal: cfg.MaxConnections, MaxPerClient: cfg.MaxConnectionsPerClient, TrustedProxies: cfg.TrustedProxies,
	})
	httpServer.ConnState = limited.ConnState
	registerConnMetrics(p.registry, limited)
	serveErr := make(chan error, 2)
	go func() { serveErr <- httpServer.Serve(limited) }()
	public := p.publicServer(handler.PublicHandler(), httpServer, stdout, serveErr)
	var errs []error
	select {
	case err := <-serveErr:
		errs = append(errs, fmt.Errorf("serve: %w", err))
	case <-ctx.Done():
	}
	p.logger.Info("shutting down")
	// The chunks were told to stop by ctx itself (River's soft stop, as
	// the clients were started with it) and stop together with the HTTP
	// server; the chunks still running at the timeout are cancelled by
	// River and given a little longer to write their answers.
	shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cfg.ShutdownTimeout)
	defer cancel()
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		if w != nil {
			chunksCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cfg.ShutdownTimeout+10*time.Second)
			defer cancel()
			w.clients.Stop(chunksCtx, p.logger)
		}
	}()
	if err := httpServer.Shutdown(shutdownCtx); err != nil {
		errs = append(errs, fmt.Errorf("shutdown http: %w", err))
	}
	if public != nil {
		if err := public.Shutdown(shutdownCtx); err != nil {
			errs = append(errs, fmt.Errorf("shutdown public listener: %w", err))
		}
	}
	<-stopped
	// The admin listener goes last, so that the stop can be watched.
	if admin != nil {
		if err := admin.Shutdown(shutdownCtx); err != nil {
			errs = append(errs, fmt.Errorf("shutdown admin listener: %w", err))
		}
	}
	p.stopBackgroundLoops()
	p.logger.Info("stopped")
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

// processID names this process in provider status reports: host and pid,
// plus a random suffix so that a restarted process is a new reporter.
func processID() string {
	host, _ := os.Hostname()
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	return fmt.Sprintf("%s/%d/%s", host, os.Getpid(), hex.EncodeToString(b))
}

// receiptSigner is the signer of the receipt tokens this worker puts in its
// pushes, under the key every process shares, drawn by the first to ask;
// nil when receipts are off, and the pushes carry none.
func receiptSigner(ctx context.Context, pool *pgxpool.Pool, on bool) (*receipt.Signer, error) {
	if !on {
		return nil, nil
	}
	return receipt.Shared(ctx, pool)
}
