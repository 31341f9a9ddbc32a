package fake

import (
	"net"
	"net/http"
	"sync"
	"sync/atomic"
)

// ConnStats counts the connections clients opened to fakepush: each is a
// TCP connection and a TLS handshake its client paid, so that a push that
// went out on a connection opened ahead (a warm-up's) can be told from one
// that opened its own.
type ConnStats struct {
	// Opened counts the connections accepted since start or the last
	// reset, on both listeners; Sandbox those of them to the APNs sandbox
	// listener.
	Opened  int64 `json:"opened"`
	Sandbox int64 `json:"sandbox_opened"`
	// Open is how many are open now.
	Open int64 `json:"open"`
}

// conns are the connections fakepush holds, counted as they are accepted
// and closed on demand (CloseConnections), as a provider closes the
// connections it has kept idle long enough.
type conns struct {
	// sandboxAddr is the sandbox listener's address, set by Start.
	sandboxAddr string

	mu   sync.Mutex
	open map[net.Conn]struct{}

	opened, sandboxOpened atomic.Int64
}

// track is the http.Server's ConnState hook.
func (c *conns) track(conn net.Conn, state http.ConnState) {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch state {
	case http.StateNew:
		if c.open == nil {
			c.open = map[net.Conn]struct{}{}
		}
		c.open[conn] = struct{}{}
		c.opened.Add(1)
		if conn.LocalAddr().String() == c.sandboxAddr {
			c.sandboxOpened.Add(1)
		}
	case http.StateClosed, http.StateHijacked:
		delete(c.open, conn)
	}
}

func (c *conns) stats() ConnStats {
	c.mu.Lock()
	open := len(c.open)
	c.mu.Unlock()
	return ConnStats{Opened: c.opened.Load(), Sandbox: c.sandboxOpened.Load(), Open: int64(open)}
}

func (c *conns) reset() {
	c.opened.Store(0)
	c.sandboxOpened.Store(0)
}

// closeAll closes every open connection but except, and says how many it
// closed.
func (c *conns) closeAll(except net.Conn) int {
	c.mu.Lock()
	var victims []net.Conn
	for conn := range c.open {
		if conn != except {
			victims = append(victims, conn)
		}
	}
	c.mu.Unlock()
	for _, conn := range victims {
		conn.Close()
	}
	return len(victims)
}

// connKey holds, in a request's context, the connection it came on.
type connKey struct{}

// CloseConnections closes every connection clients hold to fakepush, as a
// provider closes those it kept idle too long (Apple's and Google's after
// their own idle limits, fakepush after IdleTimeout), and says how many it
// closed: a client's next request opens a new one, and pays its handshake.
// Requests in flight on them fail.
func (s *Server) CloseConnections() int { return s.conns.closeAll(nil) }

// ClosedConnections is the body of POST /_connections/close's answer.
type ClosedConnections struct {
	Closed int `json:"closed"`
}

// handleCloseConnections closes every connection but the one the request
// came on, whose answer is still to be written.
func (s *Server) handleCloseConnections(w http.ResponseWriter, r *http.Request) {
	own, _ := r.Context().Value(connKey{}).(net.Conn)
	s.writeJSON(w, http.StatusOK, ClosedConnections{Closed: s.conns.closeAll(own)})
}

// handleWebPushWarmup answers a HEAD of the push service's root, which is
// how a sender opens a connection to a push service before it has a push
// to send (Herald's Web Push warm-up ahead of an instant): it names no
// subscription and delivers nothing, so it is a warm-up rather than a
// push. Real push services answer it as they answer any unknown resource;
// any answer proves the connection.
func (s *Server) handleWebPushWarmup(w http.ResponseWriter, _ *http.Request) {
	s.counters[WebPush].warmups.Add(1)
	w.WriteHeader(http.StatusOK)
}
