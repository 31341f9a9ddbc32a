package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"

	"github.com/heraldpush/herald/cmd/herald/heraldbench"
)

const usage = `herald: scheduled push reminders

Usage:
  herald serve [--role all|api|worker] [--migrate] [--addr ADDR]
  herald migrate
  herald keys create --name NAME --scope send|read|apps|admin [--apps A,B] [--expires-in D] | list | revoke NAME
  herald apps list | show APP | create APP | set-credentials APP ... | retire APP CHANNEL | disable APP | enable APP | reseal
  herald vapid generate [--subject CONTACT]
  herald credentials check [--offline]
  herald operators create --name NAME | list | remove NAME
  herald fakepush [--addr ADDR] [--latency D] [--tls-dir DIR] [--receipts-url URL]
  herald bench [--users N] [--latency D] [--mix 45,45,10] [--profile DIR]
  herald soak [--duration 20m] [--retention 3m] [--users N]
  herald version

Configuration is read from the environment (DATABASE_URL, HERALD_ADDR,
HERALD_API_KEYS, ...); see docs/configuration.md.
`

// run is the whole program behind main, with its environment passed in so
// that tests can run it in-process.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	if len(args) < 2 {
		fmt.Fprint(stderr, usage)
		return errors.New("no command given")
	}
	cmd, rest := args[1], args[2:]
	switch cmd {
	case "serve":
		return runServe(ctx, rest, getenv, stdout, stderr)
	case "migrate":
		return runMigrate(ctx, rest, getenv, stdout, stderr)
	case "keys":
		return runKeys(ctx, rest, getenv, stdout, stderr)
	case "apps":
		return runApps(ctx, rest, getenv, stdout, stderr)
	case "vapid":
		return runVAPID(rest, stdout, stderr)
	case "credentials":
		return runCredentials(ctx, rest, getenv, stdout, stderr)
	case "operators":
		// A new operator's password comes on stdin, which only this
		// command reads.
		return runOperators(ctx, rest, getenv, os.Stdin, stdout, stderr)
	case "fakepush":
		return runFakepush(ctx, rest, getenv, stdout, stderr)
	case "bench":
		return runBench(ctx, rest, getenv, stdout, stderr)
	case "soak":
		return heraldbench.RunSoak(ctx, rest, getenv, stdout, stderr)
	case "version":
		readBuildInfo().write(stdout)
		return nil
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return nil
	}
	fmt.Fprint(stderr, usage)
	return fmt.Errorf("unknown command %q", cmd)
}

// newFlagSet returns a flag set that reports errors instead of exiting.
func newFlagSet(name string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("herald "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	return fs
}

// The logger's defaults: what an operator wants from a service in
// production, a log aggregator's format at the level that tells what
// happened without every request.
const (
	defaultLogLevel  = "info"
	defaultLogFormat = "json"
)

// newLogger builds the process logger from HERALD_LOG_LEVEL (debug, info,
// warn, error; defaultLogLevel when unset) and HERALD_LOG_FORMAT (json or
// text; defaultLogFormat when unset).
func newLogger(getenv func(string) string, w io.Writer) (*slog.Logger, error) {
	var level slog.Level
	if s := cmp.Or(getenv("HERALD_LOG_LEVEL"), defaultLogLevel); level.UnmarshalText([]byte(s)) != nil {
		return nil, fmt.Errorf("HERALD_LOG_LEVEL: %q is not one of debug, info, warn, error", s)
	}
	opts := &slog.HandlerOptions{Level: level}
	switch f := strings.ToLower(cmp.Or(getenv("HERALD_LOG_FORMAT"), defaultLogFormat)); f {
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	default:
		return nil, fmt.Errorf("HERALD_LOG_FORMAT: %q is not json or text", f)
	}
}
