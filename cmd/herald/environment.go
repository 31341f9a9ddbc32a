package main

import (
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/heraldpush/herald/api"
	"github.com/heraldpush/herald/db"
	"github.com/heraldpush/herald/jobs"
	"github.com/heraldpush/herald/jobs/push/apns"
	"github.com/heraldpush/herald/jobs/push/fcm"
	"github.com/heraldpush/herald/jobs/push/webpush"
	"github.com/heraldpush/herald/jobs/quota"
)

// envVar is one variable of the environment a command reads, as --help
// lists it. The table of docs/configuration.md says more of each; a test
// checks that this list, the variables loadConfig reads and that table
// agree, and that the table shows the same defaults.
type envVar struct {
	name, meaning string
	// value is the default in code, when one value is it: --help shows it
	// (shown), and the configuration table must show it too.
	value any
	// def says what happens when the variable is unset, when no value of
	// the code's is the default (none, or a provider disabled).
	def string
}

// defaultText is the default --help shows.
func (v envVar) defaultText() string {
	if v.value != nil {
		return shown(v.value)
	}
	return v.def
}

// shown writes a default as --help and the configuration table write it:
// a duration without its zero units (1m, not 1m0s), with the days it makes
// when it is a whole number of them.
func shown(value any) string {
	d, ok := value.(time.Duration)
	if !ok {
		return fmt.Sprint(value)
	}
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	if day := 24 * time.Hour; d >= day && d%day == 0 {
		s += fmt.Sprintf(" (%d days)", d/day)
	}
	return s
}

// serveEnv is what `herald serve` reads, with the defaults of the code that
// reads it: jobs/defaults.go for the workers' tuning, api's for the limits
// on callers, the providers' packages for theirs.
var serveEnv = []envVar{
	{"DATABASE_URL", "PostgreSQL connection string", nil, "none"},
	{"DATABASE_URL_FILE", "a file holding DATABASE_URL instead (each secret has a _FILE form)", nil, "none"},
	{"HERALD_DB_SCHEMA", "PostgreSQL schema of Herald's tables and River's; herald migrate moves them there from public", db.DefaultSchema, ""},
	{"HERALD_ADDR", "listen address (--addr)", defaultAddr, ""},
	{"HERALD_ADMIN_ADDR", "operators' listener for /metrics (moved off HERALD_ADDR) and /debug/pprof/", nil, "none (/metrics on HERALD_ADDR)"},
	{"HERALD_PUBLIC_ADDR", "a listener of what devices call alone (receipts, the VAPID key, the web kit, the preferences form), to expose to the internet; not on --role worker", nil, "none (devices call HERALD_ADDR)"},
	{"HERALD_PUBLIC_URL", "the base URL devices reach Herald at (https://push.example.com), under which links to users' preferences forms are made", nil, "the scheme and host of the request for the link"},
	{"HERALD_API_KEYS", "comma-separated bootstrap bearer tokens for /v1 (scope admin), each at least 16 characters", nil, "none (only keys made with herald keys)"},
	{"HERALD_API_KEYS_FILE", "a file holding HERALD_API_KEYS instead", nil, "none"},
	{"HERALD_ADMIN_PASSWORD", "password of operator admin for the dashboard and River UI, at least 12 characters", nil, "none (only named operators)"},
	{"HERALD_ADMIN_PASSWORD_FILE", "a file holding HERALD_ADMIN_PASSWORD instead", nil, "none"},
	{"HERALD_TRUSTED_PROXIES", "networks whose forwarding headers are believed (CIDRs)", nil, "none"},
	{"HERALD_SECURE_COOKIES", "mark the session cookie Secure on every response", false, ""},
	{"HERALD_HTTP_READ_TIMEOUT", "time to read one request, body included", defaultReadTimeout, ""},
	{"HERALD_HTTP_WRITE_TIMEOUT", "time from a request's headers to the end of its answer", defaultWriteTimeout, ""},
	{"HERALD_HTTP_IDLE_TIMEOUT", "how long a kept-alive connection may wait", defaultIdleTimeout, ""},
	{"HERALD_LOG_LEVEL", "debug, info, warn or error", defaultLogLevel, ""},
	{"HERALD_LOG_FORMAT", "json or text", defaultLogFormat, ""},
	{"APNS_KEY_FILE", "APNs .p8 key; with APNS_KEY_ID, APNS_TEAM_ID, APNS_TOPIC", nil, "APNs disabled"},
	{"APNS_KEY_ID", "APNs key id", nil, ""},
	{"APNS_TEAM_ID", "APNs team id", nil, ""},
	{"APNS_TOPIC", "APNs topic (the app's bundle id)", nil, ""},
	{"APNS_HOST", "APNs base URL", apns.DefaultHost, ""},
	{"APNS_SANDBOX_HOST", "APNs base URL for devices registered with environment sandbox", apns.DefaultSandboxHost, ""},
	{"FCM_CREDENTIALS_FILE", "Google service-account JSON", nil, "FCM disabled"},
	{"FCM_ENDPOINT", "FCM v1 base URL, ending in /v1", fcm.DefaultEndpoint, ""},
	{"VAPID_PRIVATE_KEY", "Web Push VAPID private key; with VAPID_PUBLIC_KEY, VAPID_SUBJECT", nil, "Web Push disabled"},
	{"VAPID_PRIVATE_KEY_FILE", "a file holding VAPID_PRIVATE_KEY instead", nil, "none"},
	{"VAPID_PUBLIC_KEY", "Web Push VAPID public key", nil, ""},
	{"VAPID_SUBJECT", "Web Push contact (mailto: or https:)", nil, ""},
	{"HERALD_SECRET_KEY", "the key apps' stored credentials are sealed with: 32 bytes in base64; several comma-separated, the first seals and all open (docs/apps.md)", nil, "credentials cannot be stored"},
	{"HERALD_SECRET_KEY_FILE", "a file holding HERALD_SECRET_KEY instead", nil, "none"},
	{"SSL_CERT_FILE", "a CA bundle trusted besides the system's", nil, "system roots"},
	{"HERALD_WEBPUSH_HOSTS", "push services Web Push endpoints may name besides the browsers' own", nil, "none"},
	{"HERALD_WEBHOOK_HOSTS", "hosts webhooks may post to inside your network (trusted: any address, http allowed)", nil, "none: public https hosts only"},
	{"HERALD_BREAKER_COOLDOWN", "how long an open circuit breaker waits before a probe", jobs.DefaultBreakerCooldown, ""},
	{"HERALD_CHUNK_SIZE", "devices per chunk job", jobs.DefaultChunkSize, ""},
	{"HERALD_URGENT_WORKERS", "urgent chunks worked at once per process", jobs.DefaultUrgentWorkers, ""},
	{"HERALD_BULK_WORKERS", "bulk chunks worked at once per process", jobs.DefaultBulkWorkers, ""},
	{"HERALD_LANES", "the chunk lanes a worker serves: urgent, bulk or both", nil, "both"},
	{"HERALD_FETCH_POLL_INTERVAL", "how often each lane looks for due chunks", jobs.DefaultFetchPollInterval, ""},
	{"HERALD_CHUNK_TIMEOUT", "one chunk attempt's limit", jobs.DefaultChunkTimeout, ""},
	{"HERALD_RESCUE_AFTER", "when a chunk whose process died is retried", jobs.DefaultRescueAfter, ""},
	{"HERALD_SHUTDOWN_TIMEOUT", "how long a stopping process lets its requests and running chunks finish", jobs.DefaultShutdownTimeout, ""},
	{"HERALD_MAX_IN_FLIGHT_APNS", "APNs requests in flight per client", apns.DefaultMaxInFlight, ""},
	{"HERALD_MAX_IN_FLIGHT_FCM", "FCM requests in flight per client", fcm.DefaultMaxInFlight, ""},
	{"HERALD_MAX_IN_FLIGHT_WEBPUSH", "Web Push requests in flight per client and push service", webpush.DefaultMaxInFlight, ""},
	{"HERALD_RATE_FCM", "FCM sends a second for each Firebase project, shared by every process and lane; -1 for no bound", fcm.DefaultRate, ""},
	{"HERALD_RATE_WEBPUSH_HOST", "Web Push sends a second for each VAPID key at one push service, shared by every process and lane; -1 for no bound", webpush.DefaultHostRate, ""},
	{"HERALD_RATE_WINDOW", "the span the two rates are counted over: no such span carries more than the rate's worth", quota.DefaultWindow, ""},
	{"HERALD_RECEIPTS", "on signs a receipt token into every push (herald_receipt); off sends none", "on", ""},
	{"HERALD_RECEIPT_WINDOW", "how long after its message's expiry a push's receipt token is good (1m to a year)", jobs.DefaultReceiptWindow, ""},
	{"HERALD_DB_MAX_CONNS", "the process's PostgreSQL connection pool", jobs.DefaultPoolSize, ""},
	{"HERALD_SCHEDULE_LEAD", "how long before a schedule run its message is made", jobs.DefaultScheduleLead, ""},
	{"HERALD_MATERIALIZE_EVERY", "how often schedule runs are looked for", jobs.DefaultMaterializeEvery, ""},
	{"HERALD_RETENTION", "how long settled messages and finished jobs are kept (at least 1m)", jobs.DefaultRetention, ""},
	{"HERALD_DEVICE_RETENTION", "how long an evicted device and its token are kept (at least 1m)", jobs.DefaultDeviceRetention, ""},
	{"HERALD_AUDIT_RETENTION", "how long an audit log entry is kept (at least 1m)", jobs.DefaultAuditRetention, ""},
	{"HERALD_RATE_LIMIT", "requests a second per API key and process", api.DefaultRateLimit, ""},
	{"HERALD_MAX_CONNECTIONS", "connections the process holds open; past it the longest idle one is closed", nil, "open files allowed less 1,024"},
	{"HERALD_MAX_CONNECTIONS_PER_CLIENT", "connections one address may hold open (trusted proxies exempt)", defaultMaxConnectionsPerClient, ""},
	{"HERALD_BODY_BUDGET_MB", "request body bytes the process reads at once, in MiB; beyond it 503 with Retry-After", api.DefaultBodyBudget >> 20, ""},
	{"HERALD_RATE_BURST", "requests a key may make at once before the rate applies", api.DefaultRateBurst, ""},
	{"HERALD_RECEIPT_RATE_LIMIT", "receipt requests a second per client address and process", api.DefaultReceiptRateLimit, ""},
	{"HERALD_RECEIPT_RATE_BURST", "receipt requests an address may make at once before the rate applies", api.DefaultReceiptRateBurst, ""},
	{"HERALD_MAX_DEVICES_PER_USER", "active devices one user may have", api.DefaultMaxDevicesPerUser, ""},
	{"HERALD_SCHEDULE_MIN_INTERVAL", "least time between two runs of a schedule", jobs.DefaultScheduleMinInterval, ""},
	{"HERALD_SCHEDULE_MAX_AHEAD", "runs of one schedule made into messages and not yet started", jobs.DefaultScheduleMaxAhead, ""},
	{"HERALD_MAX_SCHEDULES", "live (not deleted) schedules there may be", jobs.DefaultMaxSchedules, ""},
	{"GOGC", "Go's garbage collector target", defaultGCPercent, ""},
}

// migrateEnv is what `herald migrate` reads: serveEnv's entries of the
// same variables, so that each is described once.
var migrateEnv = envOf("DATABASE_URL", "DATABASE_URL_FILE", "HERALD_DB_SCHEMA", "HERALD_LOG_LEVEL", "HERALD_LOG_FORMAT")

// envOf is serveEnv's entries of names, in that order.
func envOf(names ...string) []envVar {
	var env []envVar
	for _, name := range names {
		i := slices.IndexFunc(serveEnv, func(v envVar) bool { return v.name == name })
		env = append(env, serveEnv[i])
	}
	return env
}

// helpRequested reports whether args ask for help (-h, -help or --help
// before any "--"), which a command answers on stdout, exiting 0.
func helpRequested(args []string) bool {
	for _, a := range args {
		switch a {
		case "--":
			return false
		case "-h", "-help", "--help":
			return true
		}
	}
	return false
}

// printHelp writes a command's usage: its synopsis, its flags and the
// environment it reads.
func printHelp(w io.Writer, fs *flag.FlagSet, synopsis string, env []envVar) {
	fmt.Fprintf(w, "Usage: %s\n\nFlags:\n", synopsis)
	fs.SetOutput(w)
	fs.PrintDefaults()
	if len(env) == 0 {
		fmt.Fprintln(w, "\nIt reads no environment variables.")
		return
	}
	fmt.Fprintln(w, "\nEnvironment (docs/configuration.md says more):")
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	for _, v := range env {
		def := ""
		if text := v.defaultText(); text != "" {
			def = "default: " + text
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\n", v.name, v.meaning, def)
	}
	tw.Flush()
}

// parseFlags parses args into fs, or, when they ask for help, prints it to
// stdout: help is true then, and the command has nothing more to do.
func parseFlags(fs *flag.FlagSet, args []string, synopsis string, env []envVar, stdout io.Writer) (help bool, err error) {
	if helpRequested(args) {
		printHelp(stdout, fs, synopsis, env)
		return true, nil
	}
	// A bad flag is said on stderr (by the flag package) with this short
	// usage after it, and the command fails.
	fs.Usage = func() {
		name, _, _ := strings.Cut(synopsis, "\n")
		fmt.Fprintf(fs.Output(), "usage: %s\n(%s --help lists every flag and the environment)\n", name, fs.Name())
	}
	if err := fs.Parse(args); err != nil {
		return false, err
	}
	if fs.NArg() > 0 {
		return false, fmt.Errorf("%s: unexpected arguments %s (see --help)", fs.Name(), strings.Join(fs.Args(), " "))
	}
	return false, nil
}
