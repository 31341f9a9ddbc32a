// Package api is Herald's HTTP surface: the /v1 REST API, health and
// readiness, and the operators' dashboard and River UI behind a login. It
// validates requests, runs each in one database transaction and maps every
// error to JSON in one place (errors.go).
package api

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/labstack/echo/v4"
	"github.com/labstack/echo/v4/middleware"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"

	"github.com/heraldpush/herald/jobs"
	"github.com/heraldpush/herald/jobs/apps"
	"github.com/heraldpush/herald/jobs/preferences"
	"github.com/heraldpush/herald/jobs/push"
	"github.com/heraldpush/herald/jobs/receipt"
	"github.com/heraldpush/herald/jobs/webhook"
)

// Config holds what the server needs.
type Config struct {
	Logger *slog.Logger
	Pool   *pgxpool.Pool
	// APIKeys are HERALD_API_KEYS: bearer tokens accepted on /v1/* with
	// scope admin, besides the keys stored in the database (Refresh).
	APIKeys []string
	// River enqueues and cancels chunk jobs in the API's transactions; an
	// insert-only client is enough.
	River riverClient
	// ChunkSize is the number of devices per chunk job (jobs.DefaultChunkSize
	// when zero).
	ChunkSize int
	// Configured says which channels this process has credentials for.
	Configured map[string]bool
	// Apps is the process's view of the apps and their credentials
	// (jobs/apps), for the Web Push keys a registration answers with;
	// AppStore changes them (the /v1/apps routes). Nil: one app, the
	// default, and no /v1/apps.
	Apps     *apps.Registry
	AppStore *apps.Store
	// Metrics serves GET /metrics (Prometheus); nil serves none.
	Metrics http.Handler
	// Registerer takes the HTTP metrics (requests by route and status, and
	// their latency); nil keeps none.
	Registerer prometheus.Registerer
	// WorkerOnly serves only health, readiness and metrics: the process
	// works chunks and takes no API calls.
	WorkerOnly bool
	// AdminPassword is the password of operator admin on the dashboard and
	// River UI, besides the named operators stored in the database. Empty:
	// only those can sign in.
	AdminPassword string
	// RiverUI serves River UI under /riverui/ (a started riverui.Handler
	// whose prefix is /riverui), behind the dashboard's login. Nil answers
	// 503.
	RiverUI http.Handler
	// WebPushEgress is the policy a Web Push subscription's endpoint must
	// pass to be registered (HERALD_WEBPUSH_HOSTS); the workers send under
	// the same one. Nil: push.DefaultEgressPolicy().
	WebPushEgress *push.EgressPolicy
	// WebhookEgress is the policy a webhook's URL must pass to be made
	// (HERALD_WEBHOOK_HOSTS); the workers post under the same one. Nil:
	// public https hosts only.
	WebhookEgress *webhook.Policy
	// Ready reports whether the process can serve: the database answers and
	// is migrated. Nil means always ready. Its error is logged, never shown.
	Ready func(ctx context.Context) error
	// TrustedProxies are the networks whose X-Forwarded-For, X-Real-IP and
	// X-Forwarded-Proto headers are believed. Empty: no one's are, and the
	// client is whoever opened the connection.
	TrustedProxies []*net.IPNet
	// SecureCookies marks the session cookie Secure on every response, for
	// deployments behind a proxy that terminates TLS without saying so.
	// Otherwise it is Secure when the request came over TLS, directly or as
	// a trusted proxy says.
	SecureCookies bool
	// BodyBudget is how many bytes of request bodies the process reads at
	// once (DefaultBodyBudget when zero); a body beyond it is refused with
	// 503 and Retry-After before it is read.
	BodyBudget int64
	// RateLimit is the requests a second each caller (API key, or the
	// dashboard) may make of this process once its burst of RateBurst is
	// spent (DefaultRateLimit and DefaultRateBurst when zero).
	RateLimit float64
	RateBurst int
	// ReceiptRateLimit is the receipt requests a second each client address
	// may make of this process once its burst of ReceiptRateBurst is spent
	// (DefaultReceiptRateLimit and DefaultReceiptRateBurst when zero).
	ReceiptRateLimit float64
	ReceiptRateBurst int
	// MaxDevicesPerUser is how many active devices one user may have
	// (DefaultMaxDevicesPerUser when zero).
	MaxDevicesPerUser int
	// ScheduleLimits bound how often a schedule may run and how many of its
	// runs may be made ahead; ScheduleLead is how far ahead the
	// materializer makes runs (jobs.DefaultScheduleLead when zero), which
	// with them decides how many runs a schedule would have waiting.
	ScheduleLimits jobs.ScheduleLimits
	ScheduleLead   time.Duration
	// PublicURL is the base URL devices reach Herald at
	// (HERALD_PUBLIC_URL: the public listener as the internet sees it,
	// https://push.example.com), under which a link to a user's own
	// preferences form is made. Empty: the scheme and host of the request
	// that asks for the link.
	PublicURL string
}

// riverClient is what the API needs of River.
type riverClient interface {
	InsertManyTx(ctx context.Context, tx pgx.Tx, params []river.InsertManyParams) ([]*rivertype.JobInsertResult, error)
	JobCancelTx(ctx context.Context, tx pgx.Tx, jobID int64) (*rivertype.JobRow, error)
	JobDeleteTx(ctx context.Context, tx pgx.Tx, jobID int64) (*rivertype.JobRow, error)
}

func (c *Config) validate() error {
	if c.Logger == nil {
		return errors.New("api: Config.Logger is required")
	}
	if c.Pool == nil {
		return errors.New("api: Config.Pool is required")
	}
	if c.River == nil {
		return errors.New("api: Config.River is required")
	}
	if c.WebPushEgress == nil {
		c.WebPushEgress = push.DefaultEgressPolicy()
	}
	if c.WebhookEgress == nil {
		c.WebhookEgress, _ = webhook.NewPolicy(nil) // Trusting nothing cannot fail.
	}
	if c.Ready == nil {
		c.Ready = func(context.Context) error { return nil }
	}
	c.BodyBudget = cmp.Or(c.BodyBudget, DefaultBodyBudget)
	c.RateLimit = cmp.Or(c.RateLimit, DefaultRateLimit)
	c.RateBurst = cmp.Or(c.RateBurst, DefaultRateBurst)
	c.ReceiptRateLimit = cmp.Or(c.ReceiptRateLimit, DefaultReceiptRateLimit)
	c.ReceiptRateBurst = cmp.Or(c.ReceiptRateBurst, DefaultReceiptRateBurst)
	c.MaxDevicesPerUser = cmp.Or(c.MaxDevicesPerUser, DefaultMaxDevicesPerUser)
	c.ScheduleLimits = c.ScheduleLimits.WithDefaults()
	c.ScheduleLead = cmp.Or(c.ScheduleLead, jobs.DefaultScheduleLead)
	c.PublicURL = strings.TrimRight(c.PublicURL, "/")
	switch {
	case c.RateLimit < 0:
		return fmt.Errorf("api: Config.RateLimit is %g; it must be positive", c.RateLimit)
	case c.RateBurst < 1:
		return fmt.Errorf("api: Config.RateBurst is %d; it must be at least 1", c.RateBurst)
	case c.ReceiptRateLimit < 0:
		return fmt.Errorf("api: Config.ReceiptRateLimit is %g; it must be positive", c.ReceiptRateLimit)
	case c.ReceiptRateBurst < 1:
		return fmt.Errorf("api: Config.ReceiptRateBurst is %d; it must be at least 1", c.ReceiptRateBurst)
	case c.MaxDevicesPerUser < 1:
		return fmt.Errorf("api: Config.MaxDevicesPerUser is %d; it must be at least 1", c.MaxDevicesPerUser)
	}
	return c.ScheduleLimits.Validate()
}

// Server serves Herald's HTTP API.
type Server struct {
	cfg      Config
	pool     *pgxpool.Pool
	keys     *keyring
	enqueuer *jobs.Enqueuer
	echo     *echo.Echo
	// public serves the device routes alone (public.go), for a listener
	// of its own that faces the internet.
	public    *echo.Echo
	sessions  *sessions
	dashboard *dashboard
	limiter   *rateLimiter
	// bodyBudget bounds the request bodies read at once (budget.go).
	bodyBudget *bodyBudget
	// ready is cfg.Ready, run at most once a second (recentCheck).
	ready *recentCheck

	// Receipts (receipts.go): the signer of their tokens, once its key is
	// read (Refresh); the limiter by client address; the group commit.
	receiptSigner  atomic.Pointer[receipt.Signer]
	receiptLimiter *rateLimiter
	receipts       *receiptWriter
	receiptMetrics *receiptMetrics

	// linkSigner signs and checks the links to users' own preferences
	// forms (preferenceform.go), once its key is read (Refresh).
	linkSigner atomic.Pointer[preferences.LinkSigner]
}

// NewServer returns the server with every route in place.
func NewServer(cfg Config) (*Server, error) {
	err := cfg.validate()
	if err != nil {
		return nil, err
	}
	s := &Server{
		cfg: cfg, pool: cfg.Pool, keys: newKeyring(cfg.Pool, cfg.Logger, cfg.APIKeys),
		enqueuer: jobs.NewEnqueuer(cfg.River, cfg.ChunkSize),
		limiter:  newRateLimiter(cfg.RateLimit, cfg.RateBurst, time.Now),
		ready:    newRecentCheck(cfg.Ready),
		sessions: newSessions(cfg.Pool, cfg.AdminPassword),
		// One budget for both listeners: it bounds the process's memory.
		bodyBudget: newBodyBudget(cfg.BodyBudget),

		receiptLimiter: newRateLimiter(cfg.ReceiptRateLimit, cfg.ReceiptRateBurst, time.Now),
		receiptMetrics: newReceiptMetrics(cfg.Registerer),
	}
	s.receipts = newReceiptWriter(cfg.Pool, s.receiptMetrics)
	if s.dashboard, err = newDashboard(); err != nil {
		return nil, err
	}
	// Both listeners' servers log, count and guard every request alike;
	// the HTTP metrics are made once, for both.
	metrics := newHTTPMetrics(cfg.Registerer)
	s.echo, s.public = s.newEcho(metrics), s.newEcho(metrics)
	s.routes()
	s.publicRoutes()
	return s, nil
}

// newEcho is an Echo server with the middleware every request passes
// through, in order: the request id, the log line and metrics, the body
// budget and the recovery from a handler's panic.
func (s *Server) newEcho(metrics *httpMetrics) *echo.Echo {
	cfg := s.cfg
	e := echo.New()
	e.HideBanner, e.HidePort = true, true
	forwardedHeaders(e, cfg.TrustedProxies)
	e.HTTPErrorHandler = errorHandler(cfg.Logger)
	e.Use(requestID())
	e.Use(requestLogger(cfg.Logger, metrics))
	e.Use(s.bodyBudget.middleware)
	e.Use(middleware.RecoverWithConfig(middleware.RecoverConfig{
		LogErrorFunc: func(c echo.Context, err error, stack []byte) error {
			cfg.Logger.ErrorContext(c.Request().Context(), "panic in handler",
				"request_id", c.Response().Header().Get(echo.HeaderXRequestID),
				"error", err, "stack", string(stack))
			return err
		},
	}))
	return e
}

// Refresh reads the API keys stored in the database, and the keys that sign
// dashboard sessions, receipt tokens and links to users' preferences
// forms. A process calls it once before it serves, so that it starts with
// them; Run calls it again every second.
func (s *Server) Refresh(ctx context.Context) error {
	if err := s.sessions.loadKey(ctx); err != nil {
		return err
	}
	if err := s.loadReceiptKey(ctx); err != nil {
		return err
	}
	if err := s.loadLinkKey(ctx); err != nil {
		return err
	}
	return s.keys.refresh(ctx)
}

// Run keeps the server's API keys fresh until ctx ends: it reads them every
// second, so that a key made, revoked or expired anywhere counts here within
// about a second, and writes when each was last used every minute. A failed
// read keeps the keys last read, and is logged.
func (s *Server) Run(ctx context.Context) { s.keys.run(ctx) }

// ServeHTTP makes the server an http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.echo.ServeHTTP(w, r) }

// requestLogger logs one structured line per request, with its id, at a level
// that follows the status: health checks stay quiet, server errors stand out.
// It counts the request in metrics too (nil counts nothing).
func requestLogger(logger *slog.Logger, metrics *httpMetrics) echo.MiddlewareFunc {
	return middleware.RequestLoggerWithConfig(middleware.RequestLoggerConfig{
		LogStatus: true, LogMethod: true, LogRoutePath: true, LogURIPath: true,
		LogLatency: true, LogRequestID: true, LogError: true, HandleError: true,
		LogValuesFunc: func(c echo.Context, v middleware.RequestLoggerValues) error {
			metrics.observe(v.RoutePath, v.Method, v.Status, v.Latency)
			level := slog.LevelInfo
			switch {
			case v.Status >= 500:
				level = slog.LevelError
			case v.URIPath == "/healthz" || v.URIPath == "/readyz":
				level = slog.LevelDebug
			}
			attrs := []slog.Attr{
				slog.String("method", v.Method), slog.String("path", v.URIPath),
				slog.String("route", v.RoutePath), slog.Int("status", v.Status),
				slog.Duration("latency", v.Latency), slog.String("request_id", v.RequestID),
			}
			// Who made the call, once authentication has said.
			switch who := callerOf(c.Request().Context()); {
			case who.key != "":
				attrs = append(attrs, slog.String("key", who.key))
			case who.operator != "":
				attrs = append(attrs, slog.String("operator", who.operator))
			}
			if v.Error != nil && v.Status >= 500 {
				attrs = append(attrs, slog.String("error", v.Error.Error()))
			}
			logger.LogAttrs(c.Request().Context(), level, "request", attrs...)
			return nil
		},
	})
}

func (s *Server) healthz(c echo.Context) error {
	return c.JSON(http.StatusOK, map[string]string{"status": "ok"})
}

func (s *Server) readyz(c echo.Context) error {
	if err := s.ready.result(); err != nil {
		// The error names the database, its address and what it said: the
		// operator reads it in the log, an anonymous caller learns only that
		// the process is not ready.
		s.cfg.Logger.WarnContext(c.Request().Context(), "not ready", "error", err,
			"request_id", c.Response().Header().Get(echo.HeaderXRequestID))
		return &Error{Status: http.StatusServiceUnavailable, Code: "not_ready",
			Message: "not ready: the database cannot be used yet; the server log says why"}
	}
	return c.JSON(http.StatusOK, map[string]string{"status": "ready"})
}
