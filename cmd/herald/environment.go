package main

import (
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// envVar is one variable of the environment a command reads, as --help
// lists it. The table of docs/configuration.md says more of each; a test
// checks that this list, the variables loadConfig reads and that table
// agree.
type envVar struct {
	name, meaning, def string
}

// serveEnv is what `herald serve` reads.
var serveEnv = []envVar{
	{"DATABASE_URL", "PostgreSQL connection string", "none"},
	{"DATABASE_URL_FILE", "a file holding DATABASE_URL instead (each secret has a _FILE form)", "none"},
	{"HERALD_DB_SCHEMA", "PostgreSQL schema of Herald's tables and River's", "herald"},
	{"HERALD_ADDR", "listen address (--addr)", "127.0.0.1:8080"},
	{"HERALD_ADMIN_ADDR", "operators' listener for /metrics (moved off HERALD_ADDR) and /debug/pprof/", "none (/metrics on HERALD_ADDR)"},
	{"HERALD_API_KEYS", "comma-separated bootstrap bearer tokens for /v1 (scope admin), each at least 16 characters", "none (only keys made with herald keys)"},
	{"HERALD_API_KEYS_FILE", "a file holding HERALD_API_KEYS instead", "none"},
	{"HERALD_ADMIN_PASSWORD", "password of operator admin for the dashboard and River UI, at least 12 characters", "none (only named operators)"},
	{"HERALD_ADMIN_PASSWORD_FILE", "a file holding HERALD_ADMIN_PASSWORD instead", "none"},
	{"HERALD_TRUSTED_PROXIES", "networks whose forwarding headers are believed (CIDRs)", "none"},
	{"HERALD_SECURE_COOKIES", "mark the session cookie Secure on every response", "false"},
	{"HERALD_HTTP_READ_TIMEOUT", "time to read one request, body included", "1m"},
	{"HERALD_HTTP_WRITE_TIMEOUT", "time from a request's headers to the end of its answer", "2m"},
	{"HERALD_HTTP_IDLE_TIMEOUT", "how long a kept-alive connection may wait", "2m"},
	{"HERALD_LOG_LEVEL", "debug, info, warn or error", "info"},
	{"HERALD_LOG_FORMAT", "json or text", "json"},
	{"APNS_KEY_FILE", "APNs .p8 key; with APNS_KEY_ID, APNS_TEAM_ID, APNS_TOPIC", "APNs disabled"},
	{"APNS_KEY_ID", "APNs key id", ""},
	{"APNS_TEAM_ID", "APNs team id", ""},
	{"APNS_TOPIC", "APNs topic (the app's bundle id)", ""},
	{"APNS_HOST", "APNs base URL", "https://api.push.apple.com"},
	{"APNS_SANDBOX_HOST", "APNs base URL for devices registered with environment sandbox", "https://api.sandbox.push.apple.com"},
	{"FCM_CREDENTIALS_FILE", "Google service-account JSON", "FCM disabled"},
	{"FCM_ENDPOINT", "FCM v1 base URL, ending in /v1", "https://fcm.googleapis.com/v1"},
	{"VAPID_PRIVATE_KEY", "Web Push VAPID private key; with VAPID_PUBLIC_KEY, VAPID_SUBJECT", "Web Push disabled"},
	{"VAPID_PRIVATE_KEY_FILE", "a file holding VAPID_PRIVATE_KEY instead", "none"},
	{"VAPID_PUBLIC_KEY", "Web Push VAPID public key", ""},
	{"VAPID_SUBJECT", "Web Push contact (mailto: or https:)", ""},
	{"SSL_CERT_FILE", "a CA bundle trusted besides the system's", "system roots"},
	{"HERALD_WEBPUSH_HOSTS", "push services Web Push endpoints may name besides the browsers' own", "none"},
	{"HERALD_BREAKER_COOLDOWN", "how long an open circuit breaker waits before a probe", "1s"},
	{"HERALD_CHUNK_SIZE", "devices per chunk job", "500"},
	{"HERALD_URGENT_WORKERS", "urgent chunks worked at once per process", "10"},
	{"HERALD_BULK_WORKERS", "bulk chunks worked at once per process", "50"},
	{"HERALD_LANES", "the chunk lanes a worker serves: urgent, bulk or both", "both"},
	{"HERALD_FETCH_POLL_INTERVAL", "how often each lane looks for due chunks", "250ms"},
	{"HERALD_CHUNK_TIMEOUT", "one chunk attempt's limit", "30s"},
	{"HERALD_RESCUE_AFTER", "when a chunk whose process died is retried", "1m"},
	{"HERALD_SHUTDOWN_TIMEOUT", "how long a stopping process lets its requests and running chunks finish", "25s"},
	{"HERALD_MAX_IN_FLIGHT_APNS", "APNs requests in flight per client", "500"},
	{"HERALD_MAX_IN_FLIGHT_FCM", "FCM requests in flight per client", "500"},
	{"HERALD_MAX_IN_FLIGHT_WEBPUSH", "Web Push requests in flight per client", "200"},
	{"HERALD_DB_MAX_CONNS", "the process's PostgreSQL connection pool", "20"},
	{"HERALD_SCHEDULE_LEAD", "how long before a schedule run its message is made", "2m"},
	{"HERALD_MATERIALIZE_EVERY", "how often schedule runs are looked for", "15s"},
	{"HERALD_RETENTION", "how long settled messages and finished jobs are kept (at least 1m)", "720h (30 days)"},
	{"HERALD_DEVICE_RETENTION", "how long an evicted device and its token are kept (at least 1m)", "720h (30 days)"},
	{"HERALD_AUDIT_RETENTION", "how long an audit log entry is kept (at least 1m)", "2160h (90 days)"},
	{"HERALD_RATE_LIMIT", "requests a second per API key and process", "500"},
	{"HERALD_MAX_CONNECTIONS", "connections the process holds open; past it the longest idle one is closed", "open files allowed less 1,024"},
	{"HERALD_MAX_CONNECTIONS_PER_CLIENT", "connections one address may hold open (trusted proxies exempt)", "256"},
	{"HERALD_BODY_BUDGET_MB", "request body bytes the process reads at once, in MiB; beyond it 503 with Retry-After", "16"},
	{"HERALD_RATE_BURST", "requests a key may make at once before the rate applies", "1000"},
	{"HERALD_MAX_DEVICES_PER_USER", "active devices one user may have", "100"},
	{"HERALD_SCHEDULE_MIN_INTERVAL", "least time between two runs of a schedule", "1m"},
	{"HERALD_SCHEDULE_MAX_AHEAD", "runs of one schedule made into messages and not yet started", "120"},
	{"HERALD_MAX_SCHEDULES", "live (not deleted) schedules there may be", "1000"},
	{"GOGC", "Go's garbage collector target", "200"},
}

// migrateEnv is what `herald migrate` reads.
var migrateEnv = []envVar{
	{"DATABASE_URL", "PostgreSQL connection string", "none"},
	{"DATABASE_URL_FILE", "a file holding DATABASE_URL instead", "none"},
	{"HERALD_DB_SCHEMA", "PostgreSQL schema of Herald's tables and River's; moved there from public if found there", "herald"},
	{"HERALD_LOG_LEVEL", "debug, info, warn or error", "info"},
	{"HERALD_LOG_FORMAT", "json or text", "json"},
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
		if v.def != "" {
			def = "default: " + v.def
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
