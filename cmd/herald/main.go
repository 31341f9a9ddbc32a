// Command herald is Herald's single binary: the server, its migrations, the
// local fake of the push providers and the dispatch benchmark.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	// The zone database is embedded so that time zones validate and convert
	// the same on every host, including minimal containers without tzdata.
	_ "time/tzdata"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args, os.Getenv, os.Stdout, os.Stderr)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "herald:", err)
		os.Exit(1)
	}
}
