package api

import (
	"bufio"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestLimitedListenerRecyclesTheLongestIdle: past the total, a new
// connection takes the place of the one idle the longest; past a client's
// limit, it is closed; a trusted proxy's connections count only in the
// total.
func TestLimitedListenerRecyclesTheLongestIdle(t *testing.T) {
	t.Parallel()
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	_, proxy, err := net.ParseCIDR("127.0.0.3/32")
	require.NoError(t, err)
	l := LimitListener(raw, ConnLimits{MaxTotal: 3, MaxPerClient: 2, TrustedProxies: []*net.IPNet{proxy}})
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {}), ConnState: l.ConnState}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })

	// get opens a keep-alive connection from ip and makes one request on
	// it; it reports whether the request was answered.
	get := func(ip string) (net.Conn, bool) {
		t.Helper()
		c, err := (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}).Dial("tcp", raw.Addr().String())
		require.NoError(t, err)
		t.Cleanup(func() { c.Close() })
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Write([]byte("GET / HTTP/1.1\r\nHost: h\r\n\r\n")); err != nil {
			return c, false
		}
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			return c, false
		}
		resp.Body.Close()
		return c, true
	}
	// alive reports whether c is still open, by a second request on it.
	alive := func(c net.Conn) bool {
		if _, err := c.Write([]byte("GET / HTTP/1.1\r\nHost: h\r\n\r\n")); err != nil {
			return false
		}
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			return false
		}
		resp.Body.Close()
		return true
	}

	// idle waits for the server to have said that n connections are idle
	// (it says so just after it has answered), so that which one is idle
	// the longest is known.
	idle := func(n int) {
		t.Helper()
		require.Eventually(t, func() bool { return l.idleCount() == n }, 5*time.Second, time.Millisecond)
	}
	first, ok := get("127.0.0.1")
	require.True(t, ok)
	idle(1)
	_, ok = get("127.0.0.1")
	require.True(t, ok)
	idle(2)
	_, ok = get("127.0.0.1")
	require.False(t, ok, "a client's third connection is past its limit")

	// The proxy is exempt from the client's limit, not from the total:
	// its second connection takes the place of the longest idle.
	_, ok = get("127.0.0.3")
	require.True(t, ok)
	idle(3)
	_, ok = get("127.0.0.3")
	require.True(t, ok)
	require.False(t, alive(first), "the connection idle the longest was closed to make room")
	open, refused, recycled := l.Counts()
	require.Equal(t, 3, open)
	require.EqualValues(t, 1, refused)
	require.EqualValues(t, 1, recycled)
}
