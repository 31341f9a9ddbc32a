package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	"github.com/heraldpush/herald/jobs/push/fake"
)

// runFakepush is `herald fakepush`: it serves the local APNs, FCM and Web Push
// stand-in until ctx is cancelled. getenv is accepted for symmetry with the other
// subcommands; fakepush is configured by flags only, since its job is to produce
// the environment of others.
func runFakepush(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("herald fakepush", flag.ContinueOnError)
	fs.SetOutput(stderr)
	addr := fs.String("addr", fake.DefaultAddr, "listen address (use port 0 for any free port)")
	sandboxAddr := fs.String("sandbox-addr", "", "listen address of the APNs sandbox host, written to DIR/env as APNS_SANDBOX_HOST (default: a free port on the host of --addr)")
	latency := fs.Duration("latency", 20*time.Millisecond, "latency added to every provider response")
	tlsDir := fs.String("tls-dir", "./"+fake.DefaultTLSDir, "directory for the CA, provider keys and the env file (reused across runs)")
	hostname := fs.String("hostname", "", "host name clients use to reach fakepush (default: the host of --addr, or 127.0.0.1)")
	decryptOneIn := fs.Int("decrypt-one-in", 1, "decrypt one Web Push body in N (1 decrypts all; raise it to save CPU in benchmarks)")
	details := fs.Int("details", fake.DefaultDetails, "keep the headers and decoded body of the last N pushes for GET /_receipts?detail=1 (-1 keeps none)")
	topic := fs.String("apns-topic", fake.DefaultAPNsTopic, "the only apns-topic the APNs endpoint accepts")
	project := fs.String("fcm-project", fake.DefaultFCMProjectID, "the Firebase project id of the written service account")
	apps := fs.String("apps", "", "more apps beside the default one, as NAME,NAME,...: each gets its own APNs key and team (topic com.heraldpush.NAME), Firebase project herald-fake-NAME and VAPID keys, in DIR/apps/NAME/app.json")
	receiptsURL := fs.String("receipts-url", "", "play the devices: post their receipts to this Herald's /v1/receipts (e.g. http://127.0.0.1:8080)")
	delivered := fs.Float64("delivered", 0.9, "with --receipts-url, the share (0 to 1) of pushes whose device confirms delivery")
	opened := fs.Float64("opened", 0.1, "with --receipts-url, the share (0 to --delivered) of pushes whose device also confirms they were opened")
	delay := fs.String("receipt-delay", "50ms,2s", "the range (min,max) a delivered receipt's delay after the push is drawn from")
	openAfter := fs.String("open-after", "1s,5s", "the range (min,max) an opened receipt's delay after the delivered one is drawn from")
	synopsis := "herald fakepush [flags]\n\nServes fake APNs, FCM and Web Push over HTTPS and writes DIR/env for Herald to use."
	if help, err := parseFlags(fs, args, synopsis, nil, stdout); help || err != nil {
		return err
	}

	devices := fake.Devices{ReceiptsURL: *receiptsURL}
	if *receiptsURL != "" {
		devices.Delivered, devices.Opened = *delivered, *opened
		var err error
		if devices.DelayMS, err = msRange("--receipt-delay", *delay); err != nil {
			return err
		}
		if devices.OpenAfterMS, err = msRange("--open-after", *openAfter); err != nil {
			return err
		}
	}

	var appNames []string
	for name := range strings.SplitSeq(*apps, ",") {
		if name = strings.TrimSpace(name); name != "" {
			appNames = append(appNames, name)
		}
	}

	logger := slog.New(slog.NewTextHandler(stderr, nil))
	srv, err := fake.New(fake.Config{
		Addr:         *addr,
		SandboxAddr:  *sandboxAddr,
		Hostname:     *hostname,
		TLSDir:       *tlsDir,
		Latency:      *latency,
		DecryptOneIn: *decryptOneIn,
		Details:      *details,
		APNsTopic:    *topic,
		FCMProjectID: *project,
		Apps:         appNames,
		Devices:      devices,
		Logger:       logger,
	})
	if err != nil {
		return err
	}
	if err := srv.Start(ctx); err != nil {
		return err
	}
	defer srv.Close()

	fmt.Fprintf(stdout, "fakepush listening on %s\n", srv.URL())
	fmt.Fprintf(stdout, "environment written to %s; load it with: . %s\n", srv.EnvFile(), srv.EnvFile())
	<-ctx.Done()
	if err := srv.Close(); err != nil {
		return fmt.Errorf("fakepush: shut down: %w", err)
	}
	fmt.Fprintln(stdout, "fakepush stopped")
	return nil
}

// msRange reads a flag's range of durations, "min,max", in milliseconds.
func msRange(flag, s string) ([2]int, error) {
	lo, hi, ok := strings.Cut(s, ",")
	a, errA := time.ParseDuration(strings.TrimSpace(lo))
	b, errB := time.ParseDuration(strings.TrimSpace(hi))
	if !ok || errA != nil || errB != nil || a < 0 || b < a {
		return [2]int{}, fmt.Errorf("%s %q: want min,max durations such as 50ms,2s", flag, s)
	}
	return [2]int{int(a / time.Millisecond), int(b / time.Millisecond)}, nil
}
