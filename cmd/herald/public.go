package main

import (
	"fmt"
	"io"
	"net"
	"net/http"

	"github.com/heraldpush/herald/api"
)

// publicServer is the optional listener of HERALD_PUBLIC_ADDR: the routes a
// device may call (receipts, the VAPID key, the web kit) and nothing else,
// so that it alone can face the internet while HERALD_ADDR (the keyed API,
// the dashboard, River UI) stays private. It faces the same clients a
// public API would, so it keeps the main listener's timeouts and
// connection limits. Its stop is reported on serveErr, as the main
// listener's is.
func (p *process) publicServer(handler http.Handler, main *http.Server, stdout io.Writer, serveErr chan<- error) *http.Server {
	if p.publicLn == nil {
		return nil
	}
	cfg := p.cfg
	srv := &http.Server{
		Handler:           handler,
		ReadHeaderTimeout: main.ReadHeaderTimeout,
		ReadTimeout:       main.ReadTimeout,
		WriteTimeout:      main.WriteTimeout,
		IdleTimeout:       main.IdleTimeout,
	}
	limited := api.LimitListener(p.publicLn, api.ConnLimits{
		MaxTotal: cfg.MaxConnections, MaxPerClient: cfg.MaxConnectionsPerClient, TrustedProxies: cfg.TrustedProxies,
	})
	srv.ConnState = limited.ConnState
	p.logger.Info("public listener serving the device routes", "addr", p.publicLn.Addr().String())
	fmt.Fprintf(stdout, "herald: public listener on http://%s\n", p.publicLn.Addr())
	go func() {
		if err := srv.Serve(limited); err != nil && err != http.ErrServerClosed {
			serveErr <- fmt.Errorf("public listener: %w", err)
		}
	}()
	return srv
}

// listenPublic binds HERALD_PUBLIC_ADDR, if set.
func listenPublic(addr string) (net.Listener, error) {
	if addr == "" {
		return nil, nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w (set HERALD_PUBLIC_ADDR to a free address)", addr, err)
	}
	return ln, nil
}
