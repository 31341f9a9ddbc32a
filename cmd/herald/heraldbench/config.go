// Package heraldbench is `herald bench`, the dispatch benchmark: it builds a
// population through the API in a fresh database, runs fakepush and Herald
// as processes of their own (the running executable, as `herald fakepush`
// and `herald serve`), sends earlier messages to settle the ledger into its
// steady state, schedules bulk messages (one by default) and one urgent
// single-device message for the same instant, measures where the time and
// CPU went over the messages' whole life, then sends the same devices
// straight through the same provider clients with no database and no queue
// (the blast) for the floor. docs/performance.md explains the figures.
package heraldbench

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// Config is what a benchmark runs: the population, the provider round
// trip, and how Herald is run.
type Config struct {
	Users        int
	Mix          [3]float64 // APNs, FCM, Web Push shares
	Latency      time.Duration
	Ahead        time.Duration
	Seed         uint64
	Out          string
	ProfileDir   string
	DecryptOneIn int
	KeepDB       bool
	// NoBlast skips the blast (--blast=false): a run too large to send
	// twice, such as ten million devices, gives Herald's own figures.
	NoBlast bool
	// Retain runs the retention over the measured messages once they have
	// settled and been read (--retain), as if their retention had passed,
	// and gives the database's size after it against before the POSTs.
	Retain bool
	// UrgentWorker runs the urgent lane in a worker process of its own
	// (HERALD_LANES), beside the serve process that keeps the bulk lane.
	UrgentWorker bool
	// Workers, when above zero, runs the fan-out on that many worker
	// processes (--role worker, both lanes each) beside an API process
	// (--role api) instead of one process of role all (--workers).
	Workers int
	// History is how many settled ledger rows are written before the
	// measured messages (--history), to show that dispatch does not cost
	// more on a database with history.
	History int
	// Payload is the bulk message's payload: "plain" (title, body, one
	// data key), "rich" (every field of the payload reference) or
	// "localized" (the rich one in five languages, the users' locales
	// spread over them).
	Payload string
	// Messages is how many bulk messages are due at the instant, each to
	// Users users of its own (--messages); 0 means one.
	Messages int
	// Before is how many earlier rounds of the same bulk messages are sent
	// through Herald, immediately, settled and cleaned up before the
	// measured ones (--before), so that the measurement runs on a ledger
	// that already holds messages, as a production one does.
	Before int
	// StatusEvery is how often each message's status is read through the
	// API until it settles (--status-every); 0 means 250 ms.
	StatusEvery time.Duration
	// Throttled is the share of devices (0 to 1) fakepush answers 429 once
	// in the measured messages, each as its provider answers one device
	// (--throttled).
	Throttled float64
	// Cold restarts PostgreSQL, and drops the page cache where it may,
	// between the scheduling and the instant (--cold): the instant then
	// meets cold caches. PostgreSQL's CPU is not measured then: the
	// restart ends the processes it is read from.
	Cold bool
	// Receipts has fakepush play the devices (--receipts): nine in ten
	// confirm their push to Herald, one in ten opens it, and the result
	// gains the confirmed deliveries' skew (receipts.go).
	Receipts bool
	// DropConnections, when set, has fakepush close every connection
	// clients hold to it that long before the instant
	// (--drop-connections), as a provider closes those kept idle: beyond
	// the instant's look-ahead (DefaultWakeAhead, 2 s) Herald's warm-up
	// opens them again; within it, after the warm-up, the instant meets
	// them closed.
	DropConnections time.Duration
	// Apps is how many apps the users' devices are spread over (--apps):
	// the default app and Apps-1 more, each with credentials of its own at
	// fakepush, stored in Herald (apps.go); 0 means one.
	Apps int
	// Preferences gives every user preferences (--preferences,
	// preferences.go): the bulk messages are in a category with a cap, a
	// tenth of the users opted out of it, a third have quiet hours (a
	// third of those inside them at the instant, held for moments), and a
	// tenth are at the cap already.
	Preferences bool
	// Populate is how the population is registered (--populate): "api"
	// (the default), through Herald's API in batches as an application
	// would; "db", with the same statements the API's batches run, into
	// the database directly, for populations (ten million devices) the
	// API would take the better part of an hour to register.
	Populate string
}

// messages is Config.Messages, at least one.
func (c Config) messages() int { return max(1, c.Messages) }

// statusEvery is Config.StatusEvery, 250 ms when unset.
func (c Config) statusEvery() time.Duration { return cmp.Or(c.StatusEvery, 250*time.Millisecond) }

// benchTuning are the variables a bench run passes on to its Herald
// process, and reports when set.
var benchTuning = []string{
	"HERALD_CHUNK_SIZE", "HERALD_URGENT_WORKERS", "HERALD_BULK_WORKERS", "HERALD_FETCH_POLL_INTERVAL",
	"HERALD_MAX_IN_FLIGHT_APNS", "HERALD_MAX_IN_FLIGHT_FCM", "HERALD_MAX_IN_FLIGHT_WEBPUSH", "HERALD_RATE_FCM", "HERALD_DB_MAX_CONNS",
	"HERALD_RECEIPTS", "GOMAXPROCS", "GOGC", "GOMEMLIMIT",
}

// devicesPerUser is the distribution of devices per user: 1 to 5, mean 2.5.
var devicesPerUser = []float64{0.30, 0.25, 0.20, 0.15, 0.10}

// Run is `herald bench`: it builds a population in a fresh database,
// runs Herald and a fakepush as processes of their own, sends --before
// earlier rounds of the bulk messages, schedules --messages bulk messages
// and one urgent single-device message for the same instant, measures
// where the time and CPU went over their whole life, then sends the same
// devices straight through the same provider clients (no database, no
// queue) for the floor. Its last line is the JSON result.
func Run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer, providers Providers) error {
	cfg := Config{}
	fs := flag.NewFlagSet("herald bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.IntVar(&cfg.Users, "users", 10_000, "users of each bulk message (each with 1 to 5 devices, mean 2.5)")
	fs.IntVar(&cfg.Messages, "messages", 1, "bulk messages due at the same instant, each to --users users of its own")
	fs.DurationVar(&cfg.StatusEvery, "status-every", 250*time.Millisecond, "how often each message's status is read through the API until it settles, as a caller would")
	fs.IntVar(&cfg.Before, "before", 1, "earlier rounds of the bulk messages sent, settled and cleaned up before the measured one")
	mix := fs.String("mix", "45,45,10", "percent of devices on APNs, FCM and Web Push")
	fs.DurationVar(&cfg.Latency, "latency", 20*time.Millisecond, "provider round trip fakepush adds")
	fs.DurationVar(&cfg.Ahead, "ahead", 10*time.Second, "how far ahead the messages are scheduled")
	fs.Uint64Var(&cfg.Seed, "seed", 1, "seed of the population")
	fs.StringVar(&cfg.Out, "out", "bench/results/latest.json", "where the JSON result is also written")
	fs.StringVar(&cfg.ProfileDir, "profile", "", "write Herald's CPU and heap profiles into this directory")
	fs.IntVar(&cfg.DecryptOneIn, "decrypt-one-in", 10, "fakepush decrypts one Web Push body in N, to leave the CPU to Herald")
	fs.BoolVar(&cfg.KeepDB, "keep-db", false, "keep the bench database afterwards")
	blast := fs.Bool("blast", true, "send the same devices again straight through the provider clients, for the floor (--blast=false skips it)")
	fs.BoolVar(&cfg.Retain, "retain", false, "once the measured messages have settled, delete them as their retention would, and give the database's size after it")
	fs.IntVar(&cfg.History, "history", 0, "settled ledger rows (in messages of 25,000) written with SQL before the measured messages")
	fs.StringVar(&cfg.Payload, "payload", "plain", "the bulk message's payload: plain (title, body, data), rich (every payload field) or localized (rich, in five languages the users' locales spread over)")
	fs.BoolVar(&cfg.UrgentWorker, "urgent-worker", false, "run the urgent lane in a worker process of its own (HERALD_LANES=urgent)")
	fs.IntVar(&cfg.Workers, "workers", 0, "run the fan-out on N worker processes beside an API process, instead of one process that does both")
	fs.BoolVar(&cfg.Cold, "cold", false, "restart PostgreSQL and drop the page cache (as root) between the scheduling and the instant; PostgreSQL's CPU is then not measured")
	fs.DurationVar(&cfg.DropConnections, "drop-connections", 0, "fakepush closes every connection this long before the instant, as providers close idle ones: 5s is before the instant's warm-up (which opens them again), 500ms after it (the instant meets them closed)")
	fs.IntVar(&cfg.Apps, "apps", 1, "apps the devices are spread over, user by user: the default app and N-1 more, each with its own APNs key and topic, FCM project and VAPID pair")
	fs.BoolVar(&cfg.Preferences, "preferences", false, "every user has preferences: the bulk messages' category has a cap, a tenth of the users opted out of it, a third have quiet hours (a third of those inside them at the instant, which ends moments after it), a tenth are at the cap; the result counts what was withheld, against what the rules say")
	fs.BoolVar(&cfg.Receipts, "receipts", false, "fakepush plays the devices: 90% confirm their push to Herald (POST /v1/receipts), 10% open it; the result adds the confirmed skew (HERALD_RECEIPTS=off runs without tokens)")
	fs.StringVar(&cfg.Populate, "populate", "api", "how the population is registered: api (batches through Herald's API) or db (the batches' statements, run on the database directly; for populations of millions)")
	throttled := fs.Float64("throttled", 0, "percent of devices fakepush throttles (429 with Retry-After, once each) in the measured messages")
	// --help answers on stdout and succeeds; a bad flag fails with the
	// usage on stderr.
	fs.Usage = func() {}
	if err := fs.Parse(args); errors.Is(err, flag.ErrHelp) {
		fmt.Fprint(stdout, "Usage: herald bench [flags]\n\nFlags:\n")
		fs.SetOutput(stdout)
		fs.PrintDefaults()
		fmt.Fprintf(stdout, "\nEnvironment:\n  DATABASE_URL  the PostgreSQL server the bench makes its database on\n"+
			"  %s\n                passed on to the Herald it runs, when set\n", strings.Join(benchTuning, ", "))
		return nil
	} else if err != nil {
		fmt.Fprintln(stderr, "usage: herald bench [flags] (herald bench --help lists them)")
		return err
	}
	cfg.NoBlast = !*blast
	if err := parseMix(*mix, &cfg.Mix); err != nil {
		return err
	}
	if _, ok := bulkPayloads[cfg.Payload]; !ok {
		return fmt.Errorf("--payload must be plain, rich or localized, not %q", cfg.Payload)
	}
	if cfg.Users < 1 {
		return errors.New("--users must be at least 1")
	}
	if *throttled < 0 || *throttled > 100 {
		return fmt.Errorf("--throttled must be a percent from 0 to 100, not %v", *throttled)
	}
	cfg.Throttled = *throttled / 100
	if cfg.Messages < 1 {
		return errors.New("--messages must be at least 1")
	}
	if cfg.Before < 0 {
		return errors.New("--before must not be negative")
	}
	if cfg.Workers < 0 || cfg.Workers > 16 {
		return errors.New("--workers must be from 0 to 16")
	}
	if cfg.Workers > 0 && cfg.UrgentWorker {
		return errors.New("--workers and --urgent-worker do not go together: each of the workers serves both lanes")
	}
	switch cfg.Populate {
	case "api":
	case "db":
		if cfg.Apps > 1 {
			return errors.New("--populate db registers the default app's devices only; --apps needs --populate api")
		}
	default:
		return fmt.Errorf("--populate must be api or db, not %q", cfg.Populate)
	}
	if cfg.StatusEvery <= 0 {
		return errors.New("--status-every must be positive")
	}
	if cfg.DropConnections < 0 || cfg.DropConnections >= cfg.Ahead {
		return fmt.Errorf("--drop-connections must be from 0 to less than --ahead (%s), not %s", cfg.Ahead, cfg.DropConnections)
	}
	admin := getenv("DATABASE_URL")
	if admin == "" {
		return errors.New("DATABASE_URL is not set: herald bench creates a fresh database on that server (make bench starts one)")
	}
	progress := func(format string, a ...any) { fmt.Fprintf(stdout, "bench: "+format+"\n", a...) }

	b := &Benchmark{Config: cfg, Getenv: getenv, Progress: progress, Stderr: stderr, Providers: providers}
	defer b.Cleanup()
	res, err := b.Run(ctx, admin)
	if err != nil {
		return err
	}
	return writeResult(res, cfg.Out, stdout)
}

// writeResult prints v as one line of JSON on stdout and, unless out is
// empty, writes it indented to the file out.
func writeResult(v any, out string, stdout io.Writer) error {
	line, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if out != "" {
		if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
			return err
		}
		var pretty bytes.Buffer
		_ = json.Indent(&pretty, line, "", "  ")
		if err := os.WriteFile(out, append(pretty.Bytes(), '\n'), 0o644); err != nil {
			return err
		}
	}
	fmt.Fprintln(stdout, string(line))
	return nil
}

func parseMix(s string, out *[3]float64) error {
	parts := strings.Split(s, ",")
	if len(parts) != 3 {
		return fmt.Errorf("--mix %q: want three percentages, APNs,FCM,WebPush", s)
	}
	var total float64
	for i, p := range parts {
		v, err := strconv.ParseFloat(strings.TrimSpace(p), 64)
		if err != nil || v < 0 {
			return fmt.Errorf("--mix %q: %q is not a percentage", s, p)
		}
		out[i], total = v, total+v
	}
	if total <= 0 {
		return fmt.Errorf("--mix %q: the shares add up to nothing", s)
	}
	for i := range out {
		out[i] /= total
	}
	return nil
}
