package heraldbench

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/heraldpush/herald/api/client"
	"github.com/heraldpush/herald/db"
)

// soakTables are the tables whose sizes a soak follows: everything that
// grows with traffic.
var soakTables = []string{"accepted_runs", "chunk_devices", "deliveries", "idempotency_keys", "message_chunks", "messages", "payloads", "river_job"}

// SoakConfig is what a soak runs.
type SoakConfig struct {
	// Duration is how long traffic flows; Every how often a message goes
	// out to the whole population; Sample how often the sizes are read.
	Duration, Every, Sample time.Duration
	// Retention is the HERALD_RETENTION the soak's Herald runs with.
	Retention time.Duration
	Users     int
	Out       string
}

// SoakSample is the tables' sizes at one moment of a soak.
type SoakSample struct {
	// At is the time since traffic began.
	At       time.Duration       `json:"at_ns"`
	Messages int                 `json:"messages_sent"`
	Tables   map[string]SoakSize `json:"tables"`
}

// SoakSize is one table's size.
type SoakSize struct {
	HeapBytes  int64 `json:"heap_bytes"`
	IndexBytes int64 `json:"index_bytes"`
	LiveRows   int64 `json:"live_rows"`
}

// RunSoak is `herald soak`: a Herald with a short retention under steady
// traffic, the tables' sizes read every Sample. It shows whether the
// retention job holds the database at a plateau. Its last line is the
// JSON of every sample.
func RunSoak(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	cfg := SoakConfig{}
	fs := flag.NewFlagSet("herald soak", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.DurationVar(&cfg.Duration, "duration", 20*time.Minute, "how long traffic flows")
	fs.DurationVar(&cfg.Retention, "retention", 3*time.Minute, "the HERALD_RETENTION of the soak's Herald (at least 1m)")
	fs.DurationVar(&cfg.Every, "every", time.Second, "how often a message goes to the whole population")
	fs.DurationVar(&cfg.Sample, "sample", time.Minute, "how often the tables' sizes are read")
	fs.IntVar(&cfg.Users, "users", 400, "users in the population (each with 1 to 5 devices, mean 2.5)")
	fs.StringVar(&cfg.Out, "out", "bench/results/soak.json", "where the JSON samples are also written")
	fs.Usage = func() {}
	if err := fs.Parse(args); errors.Is(err, flag.ErrHelp) {
		fmt.Fprint(stdout, "Usage: herald soak [flags]\n\nFlags:\n")
		fs.SetOutput(stdout)
		fs.PrintDefaults()
		fmt.Fprint(stdout, "\nEnvironment:\n  DATABASE_URL  the PostgreSQL server the soak makes its database on\n")
		return nil
	} else if err != nil {
		fmt.Fprintln(stderr, "usage: herald soak [flags] (herald soak --help lists them)")
		return err
	}
	if cfg.Users < 1 || cfg.Every <= 0 || cfg.Sample <= 0 || cfg.Duration <= 0 {
		return errors.New("--users, --every, --sample and --duration must be positive")
	}
	admin := getenv("DATABASE_URL")
	if admin == "" {
		return errors.New("DATABASE_URL is not set: herald soak creates a fresh database on that server")
	}
	b := &Benchmark{
		Config: Config{Users: cfg.Users, Mix: [3]float64{0.45, 0.45, 0.10}, Latency: 20 * time.Millisecond, Seed: 1, DecryptOneIn: 10},
		Getenv: getenv, Stderr: stderr,
		Progress: func(format string, a ...any) { fmt.Fprintf(stdout, "soak: "+format+"\n", a...) },
		ChildEnv: []string{"HERALD_RETENTION=" + cfg.Retention.String()},
	}
	defer b.Cleanup()
	samples, err := b.Soak(ctx, admin, cfg)
	if err != nil {
		return err
	}
	fmt.Fprint(stdout, SoakTable(samples))
	return writeResult(samples, cfg.Out, stdout)
}

// Soak starts fakepush and Herald (with HERALD_RETENTION from ChildEnv) on
// a fresh database on the server of admin, then sends a message to everyone
// every cfg.Every for cfg.Duration, reading the sizes every cfg.Sample.
// Call Cleanup afterwards.
func (b *Benchmark) Soak(ctx context.Context, admin string, cfg SoakConfig) ([]SoakSample, error) {
	dbURL, err := b.start(ctx, admin, &Result{})
	if err != nil {
		return nil, err
	}
	pool, err := db.Open(ctx, dbURL, db.PoolConfig{MaxConns: 2})
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	b.Progress("traffic for %s: a message to %d users every %s, retention %s", cfg.Duration, cfg.Users, cfg.Every, cfg.Retention)

	var samples []SoakSample
	sent := 0
	start := time.Now()
	sample := func() error {
		rows, err := db.On(pool).TableSizes(ctx, soakTables)
		if err != nil {
			return fmt.Errorf("read table sizes: %w", err)
		}
		s := SoakSample{At: time.Since(start).Round(time.Second), Messages: sent, Tables: map[string]SoakSize{}}
		var parts []string
		for _, r := range rows {
			s.Tables[r.Name] = SoakSize{HeapBytes: r.HeapBytes, IndexBytes: r.IndexBytes, LiveRows: r.LiveRows}
			parts = append(parts, fmt.Sprintf("%s %s+%s (%d rows)", r.Name, mb(r.HeapBytes), mb(r.IndexBytes), r.LiveRows))
		}
		samples = append(samples, s)
		b.Progress("%s: %d messages; %s", s.At, sent, strings.Join(parts, ", "))
		return nil
	}
	if err := sample(); err != nil {
		return nil, err
	}
	send := time.NewTicker(cfg.Every)
	defer send.Stop()
	read := time.NewTicker(cfg.Sample)
	defer read.Stop()
	end := time.After(cfg.Duration)
	for {
		select {
		case <-ctx.Done():
			return samples, ctx.Err()
		case <-end:
			return samples, sample()
		case <-read.C:
			if err := sample(); err != nil {
				return nil, err
			}
		case <-send.C:
			// Each with an idempotency key, as a careful caller sends.
			key := fmt.Sprintf("soak-%d-%d", start.UnixNano(), sent)
			res, err := b.api.CreateMessageWithResponse(ctx, &client.CreateMessageParams{IdempotencyKey: &key}, client.NewMessage{
				Priority: new(client.PriorityBulk),
				Audience: client.Audience{Type: client.AudienceTypeSegment, ID: new(segment(0))},
				Payload:  client.Payload{Title: new("Soak"), Body: new(fmt.Sprintf("message %d", sent))},
			})
			if err := answered("schedule a soak message", http.StatusAccepted, res, err); err != nil {
				return nil, err
			}
			sent++
		}
	}
}

// SoakTable renders samples as a Markdown table: total size of each table
// (heap + indexes), in MB, per sample.
func SoakTable(samples []SoakSample) string {
	var sb strings.Builder
	sb.WriteString("| time | messages sent |")
	for _, t := range soakTables {
		fmt.Fprintf(&sb, " %s |", t)
	}
	sb.WriteString("\n| ---: | ---: |" + strings.Repeat(" ---: |", len(soakTables)) + "\n")
	for _, s := range samples {
		fmt.Fprintf(&sb, "| %s | %d |", s.At, s.Messages)
		for _, t := range soakTables {
			z := s.Tables[t]
			fmt.Fprintf(&sb, " %s + %s |", mb(z.HeapBytes), mb(z.IndexBytes))
		}
		sb.WriteString("\n")
	}
	return sb.String()
}

func mb(n int64) string { return fmt.Sprintf("%.2f", float64(n)/(1<<20)) }
