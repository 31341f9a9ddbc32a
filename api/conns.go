package api

import (
	"net"
	"net/http"
	"sync"
	"time"
)

// ConnLimits bound the connections a process holds open: MaxTotal in all,
// MaxPerClient from one address (unless it is a trusted proxy's, whose
// connections carry many clients). Idle keep-alive connections cost a file
// descriptor each and nothing else, so a client that opened 20,000 of them
// used up the process's descriptors and every API call then timed out.
type ConnLimits struct {
	MaxTotal, MaxPerClient int
	// TrustedProxies are exempt from MaxPerClient.
	TrustedProxies []*net.IPNet
}

// LimitedListener accepts connections within limits. Past a client's limit
// a new connection is closed at once; past the total, the connection idle
// the longest is closed to make room, and when none is idle the new one is
// closed. Pass ConnState to the http.Server, which tells it which
// connections are idle.
type LimitedListener struct {
	net.Listener
	limits ConnLimits

	mu       sync.Mutex
	total    int
	perIP    map[string]int
	idle     map[net.Conn]time.Time
	refused  int64
	recycled int64
}

// LimitListener wraps ln with limits.
func LimitListener(ln net.Listener, limits ConnLimits) *LimitedListener {
	return &LimitedListener{Listener: ln, limits: limits, perIP: map[string]int{}, idle: map[net.Conn]time.Time{}}
}

// Accept returns the next connection within the limits.
func (l *LimitedListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		ip := remoteIP(c)
		if lc, ok := l.admit(c, ip); ok {
			return lc, nil
		}
		c.Close()
	}
}

// admit counts c in, or says it may not be.
func (l *LimitedListener) admit(c net.Conn, ip string) (net.Conn, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	perClient := l.limits.MaxPerClient > 0 && !l.trusted(ip)
	if perClient && l.perIP[ip] >= l.limits.MaxPerClient {
		l.refused++
		return nil, false
	}
	if l.limits.MaxTotal > 0 && l.total >= l.limits.MaxTotal {
		if !l.recycleLocked() {
			l.refused++
			return nil, false
		}
	}
	l.total++
	l.perIP[ip]++
	return &limitedConn{Conn: c, l: l, ip: ip}, true
}

// recycleLocked closes the connection idle the longest, if any is idle,
// before the new one is taken: closed later, it could still take a
// request in between.
// Its count is given back when the server closes it in turn; it is taken
// out of the count now, so that a burst of new connections does not close
// every idle one.
func (l *LimitedListener) recycleLocked() bool {
	var oldest net.Conn
	var since time.Time
	for c, at := range l.idle {
		if oldest == nil || at.Before(since) {
			oldest, since = c, at
		}
	}
	if oldest == nil {
		return false
	}
	delete(l.idle, oldest)
	lc := oldest.(*limitedConn)
	lc.releaseLocked()
	l.recycled++
	_ = lc.Conn.Close()
	return true
}

// ConnState is the http.Server's ConnState hook: it keeps track of the idle
// connections, the ones a new connection may take the place of.
func (l *LimitedListener) ConnState(c net.Conn, state http.ConnState) {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch state {
	case http.StateIdle:
		l.idle[c] = time.Now()
	default:
		delete(l.idle, c)
	}
}

// idleCount is how many connections the server has said are idle.
func (l *LimitedListener) idleCount() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.idle)
}

// Counts are the connections open now, and those refused and closed to make
// room since the process started.
func (l *LimitedListener) Counts() (open int, refused, recycled int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.total, l.refused, l.recycled
}

func (l *LimitedListener) trusted(ip string) bool {
	parsed := net.ParseIP(ip)
	for _, n := range l.limits.TrustedProxies {
		if parsed != nil && n.Contains(parsed) {
			return true
		}
	}
	return false
}

// limitedConn gives its place back once, when it closes.
type limitedConn struct {
	net.Conn
	l        *LimitedListener
	ip       string
	released bool
}

func (c *limitedConn) Close() error {
	c.l.mu.Lock()
	c.releaseLocked()
	delete(c.l.idle, c)
	c.l.mu.Unlock()
	return c.Conn.Close()
}

// CloseWrite half-closes the connection, as net/http does before it closes
// one whose request it refused unread (a 431): without it the server
// closed at once, and a client still sending its headers got a reset
// instead of the answer.
func (c *limitedConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

func (c *limitedConn) releaseLocked() {
	if c.released {
		return
	}
	c.released = true
	c.l.total--
	if c.l.perIP[c.ip]--; c.l.perIP[c.ip] <= 0 {
		delete(c.l.perIP, c.ip)
	}
}

// remoteIP is the address a connection comes from, without its port.
func remoteIP(c net.Conn) string {
	host, _, err := net.SplitHostPort(c.RemoteAddr().String())
	if err != nil {
		return c.RemoteAddr().String()
	}
	return host
}
