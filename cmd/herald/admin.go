package main

import (
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	httppprof "net/http/pprof"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// metricsHandler serves the process's metrics in Prometheus's format.
func (p *process) metricsHandler() http.Handler {
	return promhttp.HandlerFor(p.registry, promhttp.HandlerOpts{ErrorLog: slog.NewLogLogger(p.logger.Handler(), slog.LevelWarn)})
}

// adminServer is the optional listener of HERALD_ADMIN_ADDR, for operators
// and their scrapers only: /metrics, moved there off the public port, and
// Go's profiles under /debug/pprof/. It has no authentication of its own:
// bind it to an address only the cluster's monitoring reaches.
func (p *process) adminServer(stdout io.Writer) *http.Server {
	if p.adminLn == nil {
		return nil
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", p.metricsHandler())
	mux.HandleFunc("/debug/pprof/", httppprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", httppprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", httppprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", httppprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", httppprof.Trace)
	srv := &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: 10 * time.Second,
		// A CPU profile or a trace streams for as long as it was asked
		// (?seconds=), 30 s by default.
		WriteTimeout: 5 * time.Minute,
		IdleTimeout:  2 * time.Minute,
	}
	p.logger.Info("admin listener serving /metrics and /debug/pprof/", "addr", p.adminLn.Addr().String())
	fmt.Fprintf(stdout, "herald: admin listener on http://%s\n", p.adminLn.Addr())
	go func() {
		if err := srv.Serve(p.adminLn); err != nil && err != http.ErrServerClosed {
			p.logger.Error("admin listener stopped", "error", err)
		}
	}()
	return srv
}

// listenAdmin binds HERALD_ADMIN_ADDR, if set.
func listenAdmin(addr string) (net.Listener, error) {
	if addr == "" {
		return nil, nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w (set HERALD_ADMIN_ADDR to a free address)", addr, err)
	}
	return ln, nil
}
