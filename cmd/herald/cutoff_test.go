package main

import (
	"fmt"
	"io"
	"maps"
	"net"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/heraldpush/herald/db/dbtest"
)

// netns is a network namespace the test made, joined to the test's own by
// a veth pair: hostIP on the test's side, nsIP inside. Dropping the link
// (cut) loses every packet between them without a FIN or a reset, as a host
// that lost its network does.
type netns struct {
	name, hostIP, nsIP, hostDev, nsDev string
}

// newNetns makes the namespace, or skips the test where it cannot (not
// root, no iproute2).
func newNetns(t *testing.T) *netns {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("!!! SKIPPING: a network namespace needs root (make test-e2e runs as root in CI)")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("!!! SKIPPING: no ip command (apt-get install iproute2)")
	}
	id := os.Getpid() % 200
	n := &netns{
		name: fmt.Sprintf("herald-cut-%d", os.Getpid()), hostDev: fmt.Sprintf("hcut%dh", id), nsDev: fmt.Sprintf("hcut%dn", id),
		hostIP: fmt.Sprintf("169.254.%d.1", 20+id), nsIP: fmt.Sprintf("169.254.%d.2", 20+id),
	}
	t.Cleanup(func() {
		_ = exec.Command("ip", "netns", "del", n.name).Run()
		_ = exec.Command("ip", "link", "del", n.hostDev).Run()
	})
	for _, args := range [][]string{
		{"netns", "add", n.name},
		{"link", "add", n.hostDev, "type", "veth", "peer", "name", n.nsDev},
		{"link", "set", n.nsDev, "netns", n.name},
		{"addr", "add", n.hostIP + "/24", "dev", n.hostDev},
		{"link", "set", n.hostDev, "up"},
		{"-n", n.name, "addr", "add", n.nsIP + "/24", "dev", n.nsDev},
		{"-n", n.name, "link", "set", n.nsDev, "up"},
		{"-n", n.name, "link", "set", "lo", "up"},
	} {
		n.ip(t, args...)
	}
	return n
}

func (n *netns) ip(t *testing.T, args ...string) {
	t.Helper()
	out, err := exec.Command("ip", args...).CombinedOutput()
	require.NoError(t, err, "ip %s: %s", strings.Join(args, " "), out)
}

// cut drops the link, restore brings it back.
func (n *netns) cut(t *testing.T)     { n.ip(t, "-n", n.name, "link", "set", n.nsDev, "down") }
func (n *netns) restore(t *testing.T) { n.ip(t, "-n", n.name, "link", "set", n.nsDev, "up") }

// forwardPostgres listens on addr (TCP) and carries each connection to the
// PostgreSQL of url over its Unix socket, so that a process in the
// namespace reaches the database through the link, and returns the URL it
// connects with. A unix socket is a file, which a namespace does not
// separate: without the link in between, cutting it would cut nothing.
func forwardPostgres(t *testing.T, dbURL, addr string) string {
	t.Helper()
	cfg, err := pgconn.ParseConfig(dbURL)
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(cfg.Host, "/"), "the test database is reached over a Unix socket: %s", cfg.Host)
	socket := fmt.Sprintf("%s/.s.PGSQL.%d", cfg.Host, cfg.Port)
	ln, err := net.Listen("tcp", addr)
	require.NoError(t, err)
	var (
		conns  sync.WaitGroup
		mu     sync.Mutex
		open   []net.Conn
		closed bool
		ended  []string
	)
	// The connections are closed, not waited for: a worker cut off and
	// never let back (a test that failed while it was cut) leaves its
	// connections open until TCP gives up on them, a quarter of an hour.
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		if t.Failed() {
			// When a connection ended and which way, for a failure to say
			// whether the cut-off worker's session ended on its own.
			t.Logf("connections forwarded to PostgreSQL that ended before the test did:\n%s", strings.Join(ended, "\n"))
		}
		closed = true
		for _, c := range open {
			c.Close()
		}
		mu.Unlock()
		conns.Wait()
	})
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			open = append(open, c)
			if closed {
				c.Close()
			}
			mu.Unlock()
			conns.Go(func() {
				defer c.Close()
				pg, err := net.Dial("unix", socket)
				if err != nil {
					return
				}
				defer pg.Close()
				done := make(chan string, 2)
				go func() { _, err := io.Copy(pg, c); done <- fmt.Sprintf("from the worker: %v", err) }()
				go func() { _, err := io.Copy(c, pg); done <- fmt.Sprintf("from PostgreSQL: %v", err) }()
				why := <-done
				mu.Lock()
				ended = append(ended, fmt.Sprintf("%s %s: %s", time.Now().Format("15:04:05.000"), c.RemoteAddr(), why))
				mu.Unlock()
			})
		}
	}()
	u := url.URL{Scheme: "postgres", User: url.User(cfg.User), Host: ln.Addr().String(), Path: "/" + cfg.Database, RawQuery: "sslmode=disable"}
	return u.String()
}

// TestE2ECutOffWorkerIsTakenOver cuts one of two workers off the network in
// the middle of a 20,000-device fan-out: it runs in a network namespace of
// the test's own, reaching PostgreSQL and fakepush through a veth link,
// which the test drops. No FIN reaches PostgreSQL, which keeps the worker's
// session and liveness lock open (takenOverWithoutAGoodbye). When the link
// comes back, the requests it had in flight may still reach fakepush; a
// worker that went on with its chunks under its new session once it held
// its lock again sent 4,950 pushes another worker had taken.
func TestE2ECutOffWorkerIsTakenOver(t *testing.T) {
	t.Parallel()
	ns := newNetns(t)
	tdb := dbtest.New(t)
	s := vanishingSetup(t, tdb, ns.hostIP+":0")
	b := startWorker(t, s.vars)
	cutVars := maps.Clone(s.vars)
	cutVars["DATABASE_URL"] = forwardPostgres(t, tdb.URL, ns.hostIP+":0")
	a := startChild(t, append([]string{"ip", "netns", "exec", ns.name}, asHerald("serve", "--role", "worker", "--addr", ns.nsIP+":0")...), cutVars)
	a.base(t)
	b.base(t)
	takenOverWithoutAGoodbye(t, s, 20_000, a, b, vanishing{what: "cut off", vanish: ns.cut, comeBack: ns.restore})
}
