package push

import (
	"context"
	"net"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestCheckEndpoint(t *testing.T) {
	t.Parallel()
	p, err := NewEgressPolicy([]string{"127.0.0.1:8443", "push.internal.example", "*.corp.example:9443"})
	require.NoError(t, err)
	allowed := []string{
		"https://fcm.googleapis.com/fcm/send/abc",
		"https://FCM.googleapis.com./fcm/send/abc",
		"https://fcm.googleapis.com:443/fcm/send/abc",
		"https://updates.push.services.mozilla.com/wpush/v2/abc",
		"https://web.push.apple.com/QGuQyavXutnMH",
		"https://wns2-by3p.notify.windows.com/w/?token=abc",
		"https://127.0.0.1:8443/webpush/abc",
		"https://push.internal.example/abc",
		"https://a.b.corp.example:9443/abc",
	}
	for _, e := range allowed {
		require.NoError(t, p.CheckEndpoint(e), e)
	}
	refused := []string{
		"http://fcm.googleapis.com/fcm/send/abc",
		"https://user:pw@fcm.googleapis.com/fcm/send/abc",
		"https://fcm.googleapis.com:8443/fcm/send/abc",
		"https://evil.example/abc",
		"https://push.apple.com.evil.example/abc",
		"https://evilpush.apple.com/abc",
		"https://push.apple.com/abc",
		"https://127.0.0.1:5432/",
		"https://127.0.0.1:8444/",
		"https://127.0.0.2:8443/",
		"https://localhost:8443/",
		"https://169.254.169.254/latest/meta-data/",
		"https://10.0.0.1/",
		"https://0.0.0.0:8443/",
		"https://[::ffff:127.0.0.1]:8443/",
		"https://[::1]:8443/",
		"https://2130706433/",
		"https://0x7f.1/",
		"https://push.internal.example:8443/abc",
		"https://corp.example:9443/abc",
		"fcm.googleapis.com/fcm/send/abc",
		"https:fcm.googleapis.com",
	}
	for _, e := range refused {
		err := p.CheckEndpoint(e)
		require.ErrorIs(t, err, ErrEndpointForbidden, e)
	}
}

func TestDefaultEgressPolicy(t *testing.T) {
	t.Parallel()
	p := DefaultEgressPolicy()
	require.NoError(t, p.CheckEndpoint("https://fcm.googleapis.com/fcm/send/abc"))
	require.ErrorIs(t, p.CheckEndpoint("https://127.0.0.1/"), ErrEndpointForbidden)
	// An IP address is refused whatever it is, when no one added it: a
	// default entry is a name.
	require.ErrorIs(t, p.CheckEndpoint("https://8.8.8.8/"), ErrEndpointForbidden)
}

func TestNewEgressPolicyRefusesBadEntries(t *testing.T) {
	t.Parallel()
	for _, e := range []string{"host:0", "host:99999", "host:x", "*", "*.com", "a/b", "user@host", "http://host"} {
		_, err := NewEgressPolicy([]string{e})
		require.Error(t, err, e)
	}
}

func TestInternalAddress(t *testing.T) {
	t.Parallel()
	internal := []string{
		"127.0.0.1", "127.255.0.1", "10.1.2.3", "172.16.0.1", "192.168.1.1", "169.254.169.254",
		"0.0.0.0", "0.1.2.3", "100.64.0.1", "192.0.0.8", "198.18.0.1", "224.0.0.1", "240.0.0.1",
		"255.255.255.255", "::", "::1", "::ffff:127.0.0.1", "::ffff:10.0.0.1", "fe80::1", "fc00::1",
		"fd12:3456::1", "ff02::1", "64:ff9b::7f00:1", "2002:7f00:1::1", "2001:db8::1",
	}
	for _, s := range internal {
		require.NotEmpty(t, InternalAddress(netip.MustParseAddr(s)), s)
	}
	for _, s := range []string{"8.8.8.8", "142.250.74.42", "17.253.144.10", "2606:4700::1111", "2a00:1450:4001::200a"} {
		require.Empty(t, InternalAddress(netip.MustParseAddr(s)), s)
	}
}

// countingListener counts the connections made to it.
func countingListener(t *testing.T, addr string) (net.Listener, *atomic.Int64) {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	var n atomic.Int64
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			n.Add(1)
			c.Close()
		}
	}()
	return ln, &n
}

// TestDialRefusesInternalAddresses checks the check made at connection
// time: a name the allow-list admits but that resolves to a loopback address
// (as a push service's name could, were its DNS answer changed) gets no
// connection, while the operator's own entry does.
func TestDialRefusesInternalAddresses(t *testing.T) {
	t.Parallel()
	ln, accepted := countingListener(t, "127.0.0.1:0")
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	// As if localhost were a default push service's name: not trusted.
	p := &EgressPolicy{rules: []hostRule{{host: "localhost", port: port}, {host: "127.0.0.1", port: port}}}
	dial := p.DialContext(&net.Dialer{Timeout: time.Second})
	ctx := context.Background()
	for _, addr := range []string{"localhost:" + port, "127.0.0.1:" + port, "127.0.0.2:" + port, "[::1]:" + port} {
		conn, err := dial(ctx, "tcp", addr)
		if conn != nil {
			conn.Close()
		}
		require.ErrorIs(t, err, ErrEndpointForbidden, addr)
	}
	time.Sleep(50 * time.Millisecond)
	require.Zero(t, accepted.Load(), "no connection reaches an internal address")

	trusted, err := NewEgressPolicy([]string{"localhost:" + port})
	require.NoError(t, err)
	conn, err := trusted.DialContext(&net.Dialer{Timeout: time.Second})(ctx, "tcp", "localhost:"+port)
	require.NoError(t, err)
	conn.Close()
	require.Eventually(t, func() bool { return accepted.Load() == 1 }, 5*time.Second, 10*time.Millisecond,
		"the operator's own entry is dialled")

	var fe *ForbiddenError
	_, err = dial(ctx, "tcp", "evil.example:443")
	require.ErrorAs(t, err, &fe)
	require.Contains(t, fe.Why, "not a Web Push service")
}

// TestInternalAddressIPv6Forms is issue #26's item 6: the IPv6 ranges that
// hold no public push service, or that carry an IPv4 address, each with a
// name. An IPv4-mapped address (::ffff:0:0/96) is judged as the IPv4
// address it maps, public or not; the deprecated IPv4-compatible form
// (::/96) and IPv4-translated form (::ffff:0:0:0/96) and the deprecated
// site-local range (fec0::/10) are never public.
func TestInternalAddressIPv6Forms(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, addr string
		internal   bool
	}{
		{"site-local", "fec0::1", true},
		{"site-local, top of range", "feff:ffff::1", true},
		{"IPv4-compatible loopback", "::127.0.0.1", true},
		{"IPv4-compatible private", "::10.0.0.1", true},
		{"IPv4-compatible public", "::8.8.8.8", true},
		{"IPv4-compatible, high bits", "::ffff", true},
		{"IPv4-translated loopback", "::ffff:0:127.0.0.1", true},
		{"IPv4-mapped loopback", "::ffff:127.0.0.1", true},
		{"IPv4-mapped unspecified", "::ffff:0.0.0.0", true},
		{"IPv4-mapped CGNAT", "::ffff:100.64.0.1", true},
		{"IPv4-mapped metadata", "::ffff:169.254.169.254", true},
		{"IPv4-mapped documentation", "::ffff:203.0.113.9", true},
		{"IPv4-mapped broadcast", "::ffff:255.255.255.255", true},
		{"IPv4-mapped public", "::ffff:8.8.8.8", false},
		{"IPv4-mapped public, hex", "::ffff:808:808", false},
		{"global unicast", "2a00:1450:4001::200a", false},
		{"just above site-local", "ff00::1", true}, // multicast
		{"just below site-local", "febf::1", true}, // link-local
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			why := InternalAddress(netip.MustParseAddr(tc.addr))
			if tc.internal {
				require.NotEmpty(t, why, "%s is let through", tc.addr)
			} else {
				require.Empty(t, why, "%s is refused", tc.addr)
			}
		})
	}
}

// TestCheckEndpointPaths is issue #26's item 5: a push service's host, or
// the operator's fakepush, serves more than push endpoints, so an endpoint
// must name a push subscription's resource: on the default services, the
// shapes their browsers' subscriptions have; on every host, nothing under
// /_ (fakepush's controls) and no dot segments, however spelt.
func TestCheckEndpointPaths(t *testing.T) {
	t.Parallel()
	p, err := NewEgressPolicy([]string{"127.0.0.1:8443"})
	require.NoError(t, err)
	for _, tc := range []struct {
		endpoint string
		ok       bool
	}{
		{"https://fcm.googleapis.com/fcm/send/cXyz:APA91b-_x", true},
		{"https://fcm.googleapis.com/wp/cXyz:APA91b", true},
		{"https://android.googleapis.com/gcm/send/eDD5G1tIe9", true},
		{"https://updates.push.services.mozilla.com/wpush/v1/gAAAAABf", true},
		{"https://updates.push.services.mozilla.com/wpush/v2/gAAAAABf", true},
		{"https://web.push.apple.com/QGuQyavXutnMH", true},
		{"https://db5.notify.windows.com/w/?token=BQYAAAB%2b", true},
		{"https://db5.notify.windows.com/?token=BQYAAAB", true},
		{"https://127.0.0.1:8443/webpush/abc", true},
		{"https://127.0.0.1:8443/", true},

		{"https://fcm.googleapis.com/", false},
		{"https://fcm.googleapis.com/fcm/send/", false},
		{"https://fcm.googleapis.com/v1/projects/p/messages:send", false},
		{"https://fcm.googleapis.com/fcm/send/a/b", false},
		{"https://fcm.googleapis.com/fcm/send/..", false},
		{"https://fcm.googleapis.com/fcm/send/%2e%2e", false},
		{"https://fcm.googleapis.com/fcm/send/a%2Fb", false},
		{"https://fcm.googleapis.com/fcm/send/a?x=1", false},
		{"https://android.googleapis.com/fcm/send/a", false},
		{"https://updates.push.services.mozilla.com/wpush/v3/a", false},
		{"https://updates.push.services.mozilla.com/v1/fcm/app/registration", false},
		{"https://updates.push.services.mozilla.com/m/abc", false},
		{"https://web.push.apple.com/", false},
		{"https://web.push.apple.com/a/b", false},
		{"https://db5.notify.windows.com/w/", false},
		{"https://db5.notify.windows.com/w/x?token=a", false},
		{"https://127.0.0.1:8443/_reset", false},
		{"https://127.0.0.1:8443/_control", false},
		{"https://127.0.0.1:8443/_webpush/subscriptions", false},
		{"https://127.0.0.1:8443/%5Freset", false},
		{"https://127.0.0.1:8443/webpush/../_reset", false},
		{"https://127.0.0.1:8443/webpush/%2e%2e/_reset", false},
		{"https://127.0.0.1:8443/./_reset", false},
	} {
		err := p.CheckEndpoint(tc.endpoint)
		if tc.ok {
			require.NoError(t, err, tc.endpoint)
		} else {
			require.ErrorIs(t, err, ErrEndpointForbidden, tc.endpoint)
		}
	}
}
