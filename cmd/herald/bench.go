package main

import (
	"context"
	"io"
	"log/slog"

	"github.com/heraldpush/herald/cmd/herald/heraldbench"
	"github.com/heraldpush/herald/jobs"
)

// runBench is `herald bench`. The benchmark is heraldbench; what it takes
// from here is how a Herald process builds its provider clients, so that
// its probes and its blast send through exactly what Herald sends through.
func runBench(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	return heraldbench.Run(ctx, args, getenv, stdout, stderr, benchProviders)
}

// benchProviders builds provider clients as a Herald worker of lane would,
// from getenv's configuration.
func benchProviders(ctx context.Context, getenv func(string) string, lane string) (map[string]jobs.Sender, func(), error) {
	cfg, err := loadConfig(getenv)
	if err != nil {
		return nil, nil, err
	}
	roots, err := rootCAs(cfg.CertFile)
	if err != nil {
		return nil, nil, err
	}
	p, err := buildProviders(ctx, cfg, roots, slog.New(slog.DiscardHandler), lane, nil)
	if err != nil {
		return nil, nil, err
	}
	return p.byChannel, p.close, nil
}
