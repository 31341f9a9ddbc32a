package main

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"riverqueue.com/riverui"
)

// riverUIPrefix is where api mounts River UI; the handler must know it to
// strip it and to build its links.
const riverUIPrefix = "/riverui"

// startRiverUI builds River UI on the process's River client, so that
// operators can inspect, cancel and retry fan_out jobs, and starts its
// background services (its cached job counts), which stop with ctx. api
// puts it behind the dashboard's login.
func startRiverUI(ctx context.Context, client *river.Client[pgx.Tx], logger *slog.Logger) (http.Handler, error) {
	h, err := riverui.NewHandler(&riverui.HandlerOpts{
		Endpoints: riverui.NewEndpoints(client, nil),
		Logger:    logger.With("component", "riverui"),
		Prefix:    riverUIPrefix,
	})
	if err != nil {
		return nil, fmt.Errorf("build River UI: %w", err)
	}
	if err := h.Start(ctx); err != nil {
		return nil, fmt.Errorf("start River UI: %w", err)
	}
	return h, nil
}
