package dbtest

import (
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

// Proxy stands between code under test and its database, so that a test
// can take the database away from that code alone (Down) and give it back
// (Up), as a restart or a network fault would, without disturbing the
// server other tests share.
type Proxy struct {
	// URL connects to the proxied database through the proxy.
	URL string

	// network ("unix" or "tcp") and target are the server's address.
	network, target string
	listener        net.Listener

	mu    sync.Mutex
	down  bool
	conns map[net.Conn]bool
}

// NewProxy starts a proxy to the database at url, closed when the test ends.
func NewProxy(tb testing.TB, url string) *Proxy {
	tb.Helper()
	cfg, err := pgconn.ParseConfig(url)
	if err != nil {
		tb.Fatalf("dbtest: %v", err)
	}
	p := &Proxy{network: "tcp", target: net.JoinHostPort(cfg.Host, fmt.Sprint(cfg.Port)), conns: map[net.Conn]bool{}}
	if filepath.IsAbs(cfg.Host) {
		p.network, p.target = "unix", filepath.Join(cfg.Host, fmt.Sprintf(".s.PGSQL.%d", cfg.Port))
	}
	dir, err := os.MkdirTemp("", "herald-proxy-")
	if err != nil {
		tb.Fatalf("dbtest: %v", err)
	}
	tb.Cleanup(func() { _ = os.RemoveAll(dir) })
	if p.listener, err = net.Listen("unix", filepath.Join(dir, ".s.PGSQL.5432")); err != nil {
		tb.Fatalf("dbtest: %v", err)
	}
	tb.Cleanup(p.close)
	p.URL = fmt.Sprintf("postgres://%s@/%s?host=%s&port=5432&sslmode=disable", cfg.User, cfg.Database, dir)
	go p.accept()
	return p
}

// Down cuts every connection through the proxy and refuses new ones until
// Up.
func (p *Proxy) Down() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = true
	for c := range p.conns {
		_ = c.Close()
	}
}

// Up lets connections through again.
func (p *Proxy) Up() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = false
}

func (p *Proxy) close() {
	_ = p.listener.Close()
	p.Down()
}

func (p *Proxy) accept() {
	for {
		client, err := p.listener.Accept()
		if err != nil {
			return
		}
		go p.serve(client)
	}
}

func (p *Proxy) serve(client net.Conn) {
	p.mu.Lock()
	if p.down {
		p.mu.Unlock()
		_ = client.Close()
		return
	}
	server, err := net.Dial(p.network, p.target)
	if err != nil {
		p.mu.Unlock()
		_ = client.Close()
		return
	}
	p.conns[client], p.conns[server] = true, true
	p.mu.Unlock()
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		done <- struct{}{}
	}
	go pipe(server, client)
	go pipe(client, server)
	<-done
	_ = client.Close()
	_ = server.Close()
	<-done
	p.mu.Lock()
	delete(p.conns, client)
	delete(p.conns, server)
	p.mu.Unlock()
}
