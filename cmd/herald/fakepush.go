package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
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
	synopsis := "herald fakepush [flags]\n\nServes fake APNs, FCM and Web Push over HTTPS and writes DIR/env for Herald to use."
	if help, err := parseFlags(fs, args, synopsis, nil, stdout); help || err != nil {
		return err
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
