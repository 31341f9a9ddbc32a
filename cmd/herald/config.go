package main

import (
	"cmp"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unicode/utf8"

	"github.com/heraldpush/herald/api"
	"github.com/heraldpush/herald/db"
	"github.com/heraldpush/herald/jobs"
	"github.com/heraldpush/herald/jobs/apps"
	"github.com/heraldpush/herald/jobs/push"
	"github.com/heraldpush/herald/jobs/quota"
	"github.com/heraldpush/herald/jobs/webhook"
)

// config is the environment's configuration of a Herald process
// (docs/configuration.md). Flags may override some fields after it is read.
type config struct {
	DatabaseURL string
	// DBSchema is the PostgreSQL schema of Herald's tables and River's
	// (HERALD_DB_SCHEMA).
	DBSchema string
	Addr     string
	// AdminAddr is the optional operators' listener (/metrics, pprof).
	AdminAddr string
	// PublicAddr is the optional listener of the device routes alone
	// (receipts, the VAPID key, the web kit, the preferences form), to
	// expose to the internet.
	PublicAddr string
	// PublicURL is the base URL devices reach Herald at from the internet
	// (HERALD_PUBLIC_URL), without a trailing slash: links to users'
	// preferences forms are made under it. Empty: under the scheme and
	// host of the request that asks for one.
	PublicURL string
	// BodyBudgetMB bounds the request bodies the process reads at once
	// (api.DefaultBodyBudget when zero).
	BodyBudgetMB int
	// MaxConnections and MaxConnectionsPerClient bound the connections the
	// process holds open (defaultMaxConnections, 256 when zero).
	MaxConnections, MaxConnectionsPerClient int
	APIKeys                                 []string
	AdminPassword                           string

	// TrustedProxies are the networks whose forwarding headers
	// (X-Forwarded-For, X-Real-IP, X-Forwarded-Proto) are believed
	// (HERALD_TRUSTED_PROXIES); none by default.
	TrustedProxies []*net.IPNet
	// SecureCookies marks the session cookie Secure even on plain-HTTP
	// requests (HERALD_SECURE_COOKIES), for a proxy that terminates TLS
	// and says nothing.
	SecureCookies bool
	// ReadTimeout bounds reading one request, body included; WriteTimeout
	// bounds everything after its headers (reading the body, handling it,
	// writing the answer); IdleTimeout bounds a kept-alive connection
	// waiting for its next request.
	ReadTimeout, WriteTimeout, IdleTimeout time.Duration

	APNs    apnsConfig
	FCM     fcmConfig
	WebPush webPushConfig
	// WebPushEgress says which Web Push endpoints may be registered and
	// posted to: the browsers' push services, plus HERALD_WEBPUSH_HOSTS.
	WebPushEgress *push.EgressPolicy
	// WebhookEgress says where webhooks may post: public https hosts, plus
	// HERALD_WEBHOOK_HOSTS, trusted.
	WebhookEgress *webhook.Policy
	// CertFile is SSL_CERT_FILE: a CA bundle trusted besides the system's
	// (how a test or `make run` trusts fakepush).
	CertFile string
	// Sealer seals and opens apps' stored credentials with
	// HERALD_SECRET_KEY's keys (docs/apps.md); without one, credentials
	// cannot be stored, only the environment's used.
	Sealer *apps.Sealer

	// Tuning, with the defaults of jobs/defaults.go (see docs/operations.md, "Sizing").
	ChunkSize                  int
	UrgentWorkers, BulkWorkers int
	FetchPollInterval          time.Duration
	// Lookahead is how long before its time a chunk may be fetched, the
	// same for the River clients and the Promoter; not configurable.
	Lookahead time.Duration
	// Lanes are the queues of the chunk lanes a worker serves
	// (HERALD_LANES); both unless set.
	Lanes []string
	// ChunkTimeout bounds one attempt of a chunk; RescueAfter is when River
	// retries a chunk whose process died. RescueAfter must exceed
	// ChunkTimeout, so that a chunk is never retried while its first attempt
	// may still be sending.
	ChunkTimeout, RescueAfter time.Duration
	// ShutdownTimeout is how long a stopping process lets its requests and
	// running chunks finish.
	ShutdownTimeout time.Duration
	// MaxInFlight is each provider client's limit of requests in flight
	// (HERALD_MAX_IN_FLIGHT_APNS, _FCM, _WEBPUSH); zero takes the
	// provider's default.
	MaxInFlight map[string]int
	// FCMRate is the FCM client's sends a second (HERALD_RATE_FCM): 0 for
	// its default, -1 for none.
	FCMRate int
	// WebPushHostRate is the Web Push client's sends a second to one push
	// service (HERALD_RATE_WEBPUSH_HOST): 0 for its default, -1 for none.
	WebPushHostRate int
	// RateWindow is the span over which the provider quotas are counted
	// (HERALD_RATE_WINDOW): no window of it carries more than the rate's
	// worth, summed over every process.
	RateWindow time.Duration
	// BreakerCooldown is how long a provider's (or a Web Push service's)
	// circuit breaker stays open before one probe may go out
	// (HERALD_BREAKER_COOLDOWN); it doubles after each failed probe, up to
	// 30 s or the cooldown itself if longer.
	BreakerCooldown time.Duration
	// DBMaxConns caps the process's connection pool (HERALD_DB_MAX_CONNS);
	// zero sizes it from the worker counts (poolSize).
	DBMaxConns int
	// ScheduleLead is how long before a schedule run its message is made;
	// MaterializeEvery is how often runs are looked for.
	ScheduleLead, MaterializeEvery time.Duration
	// Retention is how long settled messages (their ledger, payloads and
	// idempotency keys) and finished River jobs are kept (HERALD_RETENTION).
	Retention time.Duration
	// DeviceRetention is how long an evicted device is kept after its
	// eviction, with its token (HERALD_DEVICE_RETENTION).
	DeviceRetention time.Duration
	// AuditRetention is how long an audit log entry is kept
	// (HERALD_AUDIT_RETENTION).
	AuditRetention time.Duration
	// Receipts signs a receipt token into every push (HERALD_RECEIPTS, on
	// unless off); ReceiptWindow is how long after its message's expiry a
	// token is good (HERALD_RECEIPT_WINDOW).
	Receipts      bool
	ReceiptWindow time.Duration

	// Limits on what one caller or one schedule may cost; zero takes the
	// defaults, which api and jobs fill in.
	//
	// RateLimit and RateBurst are each caller's requests a second and burst
	// (HERALD_RATE_LIMIT, HERALD_RATE_BURST).
	RateLimit, RateBurst int
	// ReceiptRateLimit and ReceiptRateBurst are each client address's
	// receipt requests a second and burst (HERALD_RECEIPT_RATE_LIMIT,
	// HERALD_RECEIPT_RATE_BURST).
	ReceiptRateLimit, ReceiptRateBurst int
	// MaxDevicesPerUser is HERALD_MAX_DEVICES_PER_USER.
	MaxDevicesPerUser int
	// ScheduleLimits are HERALD_SCHEDULE_MIN_INTERVAL,
	// HERALD_SCHEDULE_MAX_AHEAD and HERALD_MAX_SCHEDULES.
	ScheduleLimits jobs.ScheduleLimits
}

type apnsConfig struct{ KeyFile, KeyID, TeamID, Topic, Host, SandboxHost string }

type fcmConfig struct{ CredentialsFile, Endpoint string }

type webPushConfig struct{ PublicKey, PrivateKey, Subject string }

func (c apnsConfig) enabled() bool    { return c.KeyFile != "" }
func (c fcmConfig) enabled() bool     { return c.CredentialsFile != "" }
func (c webPushConfig) enabled() bool { return c.PrivateKey != "" }

// enabled reports whether channel has credentials.
func (c config) enabled(channel string) bool {
	switch channel {
	case jobs.ChannelAPNs:
		return c.APNs.enabled()
	case jobs.ChannelFCM:
		return c.FCM.enabled()
	case jobs.ChannelWebPush:
		return c.WebPush.enabled()
	}
	return false
}

// loadConfig reads the configuration from getenv, filling defaults in one
// place. It checks shapes, not reachability.
func loadConfig(getenv func(string) string) (config, error) {
	getenv, err := withSecretFiles(getenv)
	if err != nil {
		return config{}, err
	}
	c := config{
		DatabaseURL:   getenv("DATABASE_URL"),
		DBSchema:      cmp.Or(getenv("HERALD_DB_SCHEMA"), db.DefaultSchema),
		Addr:          getenv("HERALD_ADDR"),
		AdminAddr:     getenv("HERALD_ADMIN_ADDR"),
		PublicAddr:    getenv("HERALD_PUBLIC_ADDR"),
		AdminPassword: getenv("HERALD_ADMIN_PASSWORD"),
		APNs: apnsConfig{
			KeyFile: getenv("APNS_KEY_FILE"), KeyID: getenv("APNS_KEY_ID"), TeamID: getenv("APNS_TEAM_ID"),
			Topic: getenv("APNS_TOPIC"), Host: getenv("APNS_HOST"), SandboxHost: getenv("APNS_SANDBOX_HOST"),
		},
		FCM:      fcmConfig{CredentialsFile: getenv("FCM_CREDENTIALS_FILE"), Endpoint: getenv("FCM_ENDPOINT")},
		WebPush:  webPushConfig{PublicKey: getenv("VAPID_PUBLIC_KEY"), PrivateKey: getenv("VAPID_PRIVATE_KEY"), Subject: getenv("VAPID_SUBJECT")},
		CertFile: getenv("SSL_CERT_FILE"),
	}
	if c.Addr == "" {
		c.Addr = defaultAddr
	}
	c.Lookahead = jobs.DefaultLookahead
	for _, k := range strings.Split(getenv("HERALD_API_KEYS"), ",") {
		if k = strings.TrimSpace(k); k != "" {
			c.APIKeys = append(c.APIKeys, k)
		}
	}
	if err := db.CheckSchema(c.DBSchema); err != nil {
		return c, fmt.Errorf("HERALD_DB_SCHEMA: %w", err)
	}
	if c.Sealer, err = apps.ParseSealKeys(getenv("HERALD_SECRET_KEY")); err != nil {
		return c, err
	}
	if c.WebPushEgress, err = push.NewEgressPolicy(strings.Split(getenv("HERALD_WEBPUSH_HOSTS"), ",")); err != nil {
		return c, fmt.Errorf("HERALD_WEBPUSH_HOSTS: %w", err)
	}
	if c.WebhookEgress, err = webhook.NewPolicy(strings.Split(getenv("HERALD_WEBHOOK_HOSTS"), ",")); err != nil {
		return c, fmt.Errorf("HERALD_WEBHOOK_HOSTS: %w", err)
	}
	if c.ChunkSize, err = intVar(getenv, "HERALD_CHUNK_SIZE", 1, 10_000); err != nil {
		return c, err
	}
	if c.UrgentWorkers, err = intVar(getenv, "HERALD_URGENT_WORKERS", 1, 1000); err != nil {
		return c, err
	}
	c.UrgentWorkers = cmp.Or(c.UrgentWorkers, jobs.DefaultUrgentWorkers)
	if c.BulkWorkers, err = intVar(getenv, "HERALD_BULK_WORKERS", 1, 1000); err != nil {
		return c, err
	}
	c.BulkWorkers = cmp.Or(c.BulkWorkers, jobs.DefaultBulkWorkers)
	if c.FetchPollInterval, err = durationVar(getenv, "HERALD_FETCH_POLL_INTERVAL", 0, time.Millisecond); err != nil {
		return c, err
	}
	if c.Lanes, err = jobs.ParseLanes(getenv("HERALD_LANES")); err != nil {
		return c, fmt.Errorf("HERALD_LANES: %w", err)
	}
	if c.ChunkTimeout, err = durationVar(getenv, "HERALD_CHUNK_TIMEOUT", jobs.DefaultChunkTimeout, time.Second); err != nil {
		return c, err
	}
	if c.RescueAfter, err = durationVar(getenv, "HERALD_RESCUE_AFTER", jobs.DefaultRescueAfter, time.Second); err != nil {
		return c, err
	}
	if c.ShutdownTimeout, err = durationVar(getenv, "HERALD_SHUTDOWN_TIMEOUT", jobs.DefaultShutdownTimeout, time.Second); err != nil {
		return c, err
	}
	if c.BreakerCooldown, err = durationVar(getenv, "HERALD_BREAKER_COOLDOWN", jobs.DefaultBreakerCooldown, 100*time.Millisecond); err != nil {
		return c, err
	}
	if c.DBMaxConns, err = intVar(getenv, "HERALD_DB_MAX_CONNS", 2, 10_000); err != nil {
		return c, err
	}
	c.MaxInFlight = map[string]int{}
	for channel, name := range map[string]string{"apns": "HERALD_MAX_IN_FLIGHT_APNS", "fcm": "HERALD_MAX_IN_FLIGHT_FCM", "webpush": "HERALD_MAX_IN_FLIGHT_WEBPUSH"} {
		if c.MaxInFlight[channel], err = intVar(getenv, name, 1, 100_000); err != nil {
			return c, err
		}
	}
	if c.FCMRate, err = intVar(getenv, "HERALD_RATE_FCM", -1, 10_000_000); err != nil {
		return c, err
	}
	if c.WebPushHostRate, err = intVar(getenv, "HERALD_RATE_WEBPUSH_HOST", -1, 10_000_000); err != nil {
		return c, err
	}
	if c.RateWindow, err = durationVar(getenv, "HERALD_RATE_WINDOW", quota.DefaultWindow, time.Second); err != nil {
		return c, err
	}
	if c.ScheduleLead, err = durationVar(getenv, "HERALD_SCHEDULE_LEAD", 0, time.Second); err != nil {
		return c, err
	}
	if c.MaterializeEvery, err = durationVar(getenv, "HERALD_MATERIALIZE_EVERY", 0, 100*time.Millisecond); err != nil {
		return c, err
	}
	if c.Retention, err = durationVar(getenv, "HERALD_RETENTION", jobs.DefaultRetention, jobs.MinRetention); err != nil {
		return c, err
	}
	if c.DeviceRetention, err = durationVar(getenv, "HERALD_DEVICE_RETENTION", jobs.DefaultDeviceRetention, jobs.MinRetention); err != nil {
		return c, err
	}
	if c.AuditRetention, err = durationVar(getenv, "HERALD_AUDIT_RETENTION", jobs.DefaultAuditRetention, jobs.MinRetention); err != nil {
		return c, err
	}
	switch v := getenv("HERALD_RECEIPTS"); v {
	case "", "on":
		c.Receipts = true
	case "off":
	default:
		return c, fmt.Errorf("HERALD_RECEIPTS: %q is neither on nor off", v)
	}
	if c.ReceiptWindow, err = durationVar(getenv, "HERALD_RECEIPT_WINDOW", jobs.DefaultReceiptWindow, time.Minute); err != nil {
		return c, err
	}
	// A token names its expiry in 32 bits of seconds, and a receipt for a
	// message retention has deleted finds nothing to count: a year is
	// more than any app waits for its pushes to be opened.
	if c.ReceiptWindow > 365*24*time.Hour {
		return c, fmt.Errorf("HERALD_RECEIPT_WINDOW: %s is longer than a year", c.ReceiptWindow)
	}
	if c.TrustedProxies, err = cidrsVar(getenv, "HERALD_TRUSTED_PROXIES"); err != nil {
		return c, err
	}
	if c.PublicURL, err = baseURLVar(getenv, "HERALD_PUBLIC_URL"); err != nil {
		return c, err
	}
	if v := getenv("HERALD_SECURE_COOKIES"); v != "" {
		if c.SecureCookies, err = strconv.ParseBool(v); err != nil {
			return c, fmt.Errorf("HERALD_SECURE_COOKIES: %q is neither true nor false", v)
		}
	}
	if c.ReadTimeout, err = durationVar(getenv, "HERALD_HTTP_READ_TIMEOUT", defaultReadTimeout, time.Second); err != nil {
		return c, err
	}
	if c.WriteTimeout, err = durationVar(getenv, "HERALD_HTTP_WRITE_TIMEOUT", defaultWriteTimeout, time.Second); err != nil {
		return c, err
	}
	if c.IdleTimeout, err = durationVar(getenv, "HERALD_HTTP_IDLE_TIMEOUT", defaultIdleTimeout, time.Second); err != nil {
		return c, err
	}
	if c.WriteTimeout < c.ReadTimeout {
		return c, fmt.Errorf("HERALD_HTTP_WRITE_TIMEOUT (%s) must be at least HERALD_HTTP_READ_TIMEOUT (%s): it runs from the end of the headers, so a body that takes the whole read timeout would leave no time to answer", c.WriteTimeout, c.ReadTimeout)
	}
	if c.RateLimit, err = intVar(getenv, "HERALD_RATE_LIMIT", 1, 1_000_000); err != nil {
		return c, err
	}
	if c.BodyBudgetMB, err = intVar(getenv, "HERALD_BODY_BUDGET_MB", 16, 64<<10); err != nil {
		return c, err
	}
	if c.MaxConnections, err = intVar(getenv, "HERALD_MAX_CONNECTIONS", 16, 10_000_000); err != nil {
		return c, err
	}
	c.MaxConnections = cmp.Or(c.MaxConnections, defaultMaxConnections())
	if c.MaxConnectionsPerClient, err = intVar(getenv, "HERALD_MAX_CONNECTIONS_PER_CLIENT", 1, 10_000_000); err != nil {
		return c, err
	}
	c.MaxConnectionsPerClient = cmp.Or(c.MaxConnectionsPerClient, defaultMaxConnectionsPerClient)
	if c.RateBurst, err = intVar(getenv, "HERALD_RATE_BURST", 1, 10_000_000); err != nil {
		return c, err
	}
	if c.ReceiptRateLimit, err = intVar(getenv, "HERALD_RECEIPT_RATE_LIMIT", 1, 1_000_000); err != nil {
		return c, err
	}
	if c.ReceiptRateBurst, err = intVar(getenv, "HERALD_RECEIPT_RATE_BURST", 1, 10_000_000); err != nil {
		return c, err
	}
	if c.MaxDevicesPerUser, err = intVar(getenv, "HERALD_MAX_DEVICES_PER_USER", 1, 1_000_000); err != nil {
		return c, err
	}
	if c.ScheduleLimits.MinInterval, err = durationVar(getenv, "HERALD_SCHEDULE_MIN_INTERVAL", 0, time.Minute); err != nil {
		return c, err
	}
	if c.ScheduleLimits.MaxAhead, err = intVar(getenv, "HERALD_SCHEDULE_MAX_AHEAD", 1, 1_000_000); err != nil {
		return c, err
	}
	if c.ScheduleLimits.MaxSchedules, err = intVar(getenv, "HERALD_MAX_SCHEDULES", 1, 10_000_000); err != nil {
		return c, err
	}
	if c.RescueAfter <= c.ChunkTimeout {
		return c, fmt.Errorf("HERALD_RESCUE_AFTER (%s) must be longer than HERALD_CHUNK_TIMEOUT (%s), or a chunk could be retried while its first attempt is still sending", c.RescueAfter, c.ChunkTimeout)
	}
	return c, c.validateProviders()
}

// intVar reads an optional whole number within [lo, hi]; 0 when unset.
func intVar(getenv func(string) string, name string, lo, hi int) (int, error) {
	s := getenv(name)
	if s == "" {
		return 0, nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < lo || n > hi {
		return 0, fmt.Errorf("%s: %q is not a whole number from %d to %d", name, s, lo, hi)
	}
	return n, nil
}

// durationVar reads an optional duration of at least lo; def when unset.
func durationVar(getenv func(string) string, name string, def, lo time.Duration) (time.Duration, error) {
	s := getenv(name)
	if s == "" {
		return def, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < lo {
		return 0, fmt.Errorf("%s: %q is not a duration of at least %s", name, s, lo)
	}
	return d, nil
}

// cidrsVar reads an optional comma-separated list of networks in CIDR
// notation; a bare address stands for itself alone.
func cidrsVar(getenv func(string) string, name string) ([]*net.IPNet, error) {
	var nets []*net.IPNet
	for _, s := range strings.Split(getenv(name), ",") {
		s = strings.TrimSpace(s)
		if s == "" {
			continue
		}
		if ip := net.ParseIP(s); ip != nil {
			bits := 8 * len(ip.To16())
			if ip4 := ip.To4(); ip4 != nil {
				ip, bits = ip4, 32
			}
			nets = append(nets, &net.IPNet{IP: ip, Mask: net.CIDRMask(bits, bits)})
			continue
		}
		_, n, err := net.ParseCIDR(s)
		if err != nil {
			return nil, fmt.Errorf("%s: %q is not a network in CIDR notation (such as 10.0.0.0/8) or an address", name, s)
		}
		nets = append(nets, n)
	}
	return nets, nil
}

// baseURLVar reads an optional base URL: http or https, a host, perhaps a
// path, and nothing else (no user, query or fragment); it is returned
// without a trailing slash, for paths to be added to it.
func baseURLVar(getenv func(string) string, name string) (string, error) {
	s := getenv(name)
	if s == "" {
		return "", nil
	}
	u, err := url.Parse(s)
	if err != nil || u.Scheme != "http" && u.Scheme != "https" || u.Host == "" || u.User != nil ||
		u.RawQuery != "" || u.ForceQuery || u.Fragment != "" || u.Opaque != "" {
		return "", fmt.Errorf("%s: %q is not a base URL such as https://push.example.com (http or https, a host, perhaps a path; no query or fragment)", name, s)
	}
	return strings.TrimRight(s, "/"), nil
}

// validateAdminPassword refuses a password too short to guard the
// dashboard and River UI, whose sessions can cancel any message: at least
// api.MinPasswordLength, as a named operator's (`make run` makes a
// 16-character one).
func (c config) validateAdminPassword() error {
	if n := utf8.RuneCountInString(c.AdminPassword); c.AdminPassword != "" && n < api.MinPasswordLength {
		return fmt.Errorf("HERALD_ADMIN_PASSWORD is %d characters long; use at least %d random characters (or unset it: then only named operators sign in)", n, api.MinPasswordLength)
	}
	return nil
}

// validateProviders refuses a half-configured provider: naming the missing
// variable at startup beats failing every send later.
func (c config) validateProviders() error {
	if c.APNs.enabled() {
		if err := requireAll("APNS_KEY_FILE", "APNs",
			[2]string{"APNS_KEY_ID", c.APNs.KeyID}, [2]string{"APNS_TEAM_ID", c.APNs.TeamID},
			[2]string{"APNS_TOPIC", c.APNs.Topic}); err != nil {
			return err
		}
	}
	if c.WebPush.enabled() {
		if err := requireAll("VAPID_PRIVATE_KEY", "Web Push",
			[2]string{"VAPID_PUBLIC_KEY", c.WebPush.PublicKey}, [2]string{"VAPID_SUBJECT", c.WebPush.Subject}); err != nil {
			return err
		}
	}
	return nil
}

// requireAll returns an error naming the first of vars (name, value) that
// is empty, given that trigger turned provider on.
func requireAll(trigger, provider string, vars ...[2]string) error {
	for _, v := range vars {
		if v[1] == "" {
			return fmt.Errorf("%s is set but %s is not: set it, or unset %s to disable %s", trigger, v[0], trigger, provider)
		}
	}
	return nil
}

func (c config) requireDatabase() error {
	if c.DatabaseURL == "" {
		return errors.New("DATABASE_URL is not set: point it at a PostgreSQL database (postgres://user:pass@host:5432/herald), or use `make run`, which starts a local one")
	}
	return nil
}

// validateAPIKeys refuses keys too short to be secret.
func (c config) validateAPIKeys() error {
	for i, k := range c.APIKeys {
		if len(k) < 16 {
			return fmt.Errorf("HERALD_API_KEYS: key %d is %d characters long; use at least 16 random characters", i+1, len(k))
		}
	}
	return nil
}

// poolSize is the connection pool's size: HERALD_DB_MAX_CONNS, else
// jobs.DefaultPoolSize.
func (c config) poolSize() int32 {
	return int32(cmp.Or(c.DBMaxConns, jobs.DefaultPoolSize))
}

// urgentPoolSize is the size of the urgent lane's own pool: one connection
// for every two urgent workers, from 2 to 10.
func (c config) urgentPoolSize() int32 {
	return int32(min(max(c.UrgentWorkers/2, 2), 10))
}

// laneWorkers is a lane's workers (HERALD_URGENT_WORKERS,
// HERALD_BULK_WORKERS).
func (c config) laneWorkers(queue string) int {
	if queue == jobs.QueueUrgent {
		return c.UrgentWorkers
	}
	return c.BulkWorkers
}

// configuredChannels are the channels with credentials.
// envWebPush is the environment's VAPID key (its public half and
// subject), the default app's; nil without one.
func (c config) envWebPush() *apps.WebPush {
	if !c.WebPush.enabled() {
		return nil
	}
	return &apps.WebPush{PublicKey: c.WebPush.PublicKey, Subject: c.WebPush.Subject}
}

func (c config) configuredChannels() []string {
	var channels []string
	for _, ch := range jobs.Channels {
		if c.enabled(ch) {
			channels = append(channels, ch)
		}
	}
	return channels
}

// defaultAddr is where a process listens unless HERALD_ADDR says otherwise:
// the loopback interface, so that nothing is exposed by accident.
const defaultAddr = "127.0.0.1:8080"

// The HTTP server's default timeouts. A 16 MB device batch must arrive
// within the read timeout: a minute allows a caller about 2 Mbit/s. The
// write timeout runs from the end of the headers, so it must also cover
// the body, then the handling (a big audience takes seconds to expand) and
// the answer.
const (
	defaultReadTimeout  = time.Minute
	defaultWriteTimeout = 2 * time.Minute
	defaultIdleTimeout  = 2 * time.Minute
)

// defaultMaxConnectionsPerClient is how many connections one address may
// hold open: far more than a client pool uses, far fewer than a process
// has descriptors for.
const defaultMaxConnectionsPerClient = 256

// defaultMaxConnections is how many connections the process holds open at
// most: its descriptors (RLIMIT_NOFILE, which Go raises to the hard limit)
// less 1,024 kept for the database, the providers and files.
func defaultMaxConnections() int {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil || rl.Cur > 1<<20 {
		return 10_000
	}
	return max(64, int(rl.Cur)-1024)
}
