// Command herald is Herald's single binary: the server, its migrations, the
// local fake of the push providers and the dispatch benchmark.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"

	// The zone database is embedded so that time zones validate and convert
	// the same on every host, including minimal containers without tzdata.
	_ "time/tzdata"
)

// defaultGCPercent is Herald's garbage collector target unless GOGC is set.
// A worker's live heap is small (the chunks in hand, tens of MB) and a
// fan-out allocates fast (the provider clients' HTTP/2 and JSON), so at Go's
// default of 100 it collects several times a second. At 200 a send costs
// less CPU and the fan-out's skew is smaller, for a little more peak memory
// (docs/performance.md has the measurements).
const defaultGCPercent = 200

func main() {
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(defaultGCPercent)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args, os.Getenv, os.Stdout, os.Stderr)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "herald:", err)
		os.Exit(1)
	}
}
