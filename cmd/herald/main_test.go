package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"testing"

	"go.uber.org/goleak"

	"github.com/heraldpush/herald/cmd/herald/heraldbench"
)

// childEnv marks a re-executed test binary that is to run as `herald` with
// its arguments, so that tests can start, kill -9 and restart real Herald
// processes without building a separate binary.
const childEnv = "HERALD_TEST_RUN_AS_HERALD"

// listeningLine is what `herald serve` prints once it accepts connections.
var listeningLine = heraldbench.ListeningLine

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) == "1" {
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		err := run(ctx, append([]string{"herald"}, os.Args[1:]...), os.Getenv, os.Stdout, os.Stderr)
		stop()
		if err != nil {
			fmt.Fprintln(os.Stderr, "herald:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	// Every test that runs Herald in this process must stop all of it:
	// River clients, pools, providers, background loops.
	goleak.VerifyTestMain(m)
}
