package push

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"syscall"
)

// DefaultWebPushHosts are the push services browsers subscribe with: Chrome,
// Edge's Chromium engine, Opera and Samsung Internet use FCM, Firefox uses
// Mozilla's autopush, Safari uses Apple's, and legacy Edge uses Windows'
// notification service. A Web Push endpoint is a URL the caller gives, so
// Herald posts only to these (and to the hosts an operator adds), over port
// 443, and never to an address inside a network.
var DefaultWebPushHosts = []string{
	"fcm.googleapis.com",
	"android.googleapis.com",
	"*.push.services.mozilla.com",
	"*.push.apple.com",
	"*.notify.windows.com",
}

// pushPaths are the shapes of the default push services' endpoint paths:
// a fixed prefix and then the subscription's own token, one path segment
// (or, for Windows, the token in the query). A push service's host serves
// more than push endpoints (Mozilla's autopush has registration routes, for
// one), so a caller's endpoint may name only the resource a browser's
// subscription names. Keyed by the entry of DefaultWebPushHosts.
var pushPaths = map[string][]pathShape{
	// Chrome's subscriptions say /fcm/send/; the Web Push protocol's
	// resource for the same token is /wp/.
	"fcm.googleapis.com":     {{prefix: "/fcm/send/"}, {prefix: "/wp/"}},
	"android.googleapis.com": {{prefix: "/gcm/send/"}},
	// Firefox: /wpush/v1/ without VAPID, /wpush/v2/ with it.
	"*.push.services.mozilla.com": {{prefix: "/wpush/v1/"}, {prefix: "/wpush/v2/"}},
	// Safari: https://web.push.apple.com/<token>.
	"*.push.apple.com": {{prefix: "/"}},
	// Windows: https://<region>.notify.windows.com/w/?token=<token>.
	"*.notify.windows.com": {{prefix: "/w/", tokenInQuery: true}, {prefix: "/", tokenInQuery: true}},
}

// pathShape is one shape of a push service's endpoint path.
type pathShape struct {
	prefix string
	// tokenInQuery: the path is the prefix alone and the token is the
	// query's token parameter; otherwise the token is the one segment after
	// the prefix, and there is no query.
	tokenInQuery bool
}

func (s pathShape) matches(u *url.URL) bool {
	if s.tokenInQuery {
		return u.Path == s.prefix && u.Query().Get("token") != ""
	}
	token, ok := strings.CutPrefix(u.Path, s.prefix)
	return ok && token != "" && !strings.Contains(token, "/") && u.RawQuery == ""
}

// ReasonEndpointForbidden is the reason of a Web Push delivery whose endpoint
// Herald will not post to: a host that is not a known push service, or a
// name that resolves to an address inside a network. Nothing was sent. The
// device is not evicted: the allow-list is the operator's, and widening it
// makes the device reachable again.
const ReasonEndpointForbidden Reason = "endpoint_forbidden"

// ErrEndpointForbidden is the error a forbidden endpoint or address wraps.
var ErrEndpointForbidden = errors.New("endpoint forbidden")

// ForbiddenError says why an endpoint or a dialled address is refused.
type ForbiddenError struct {
	Why string
}

func (e *ForbiddenError) Error() string { return e.Why }

// Unwrap lets errors.Is find ErrEndpointForbidden.
func (e *ForbiddenError) Unwrap() error { return ErrEndpointForbidden }

func forbidden(format string, args ...any) error {
	return &ForbiddenError{Why: fmt.Sprintf(format, args...)}
}

// hostRule is one entry of the allow-list: a host name (or, with suffix, every
// name below it), and the one port it may be reached on.
type hostRule struct {
	host   string
	suffix bool
	port   string
	// trusted entries are the operator's own: their addresses are not
	// checked, so that a push service inside the operator's network (or a
	// local fakepush) can be reached. The defaults are never trusted.
	trusted bool
	// paths are the endpoint paths a default entry admits (pushPaths);
	// an operator's entry admits any path checkPath lets through.
	paths []pathShape
}

func (r hostRule) matches(host, port string) bool {
	if port != r.port {
		return false
	}
	if r.suffix {
		return strings.HasSuffix(host, "."+r.host)
	}
	return host == r.host
}

// EgressPolicy decides where Herald may send Web Push requests. An endpoint
// must be https, on an allowed host and port; at connection time every
// address the name resolves to must be a public unicast address, unless the
// host is one the operator added. It is safe for concurrent use.
type EgressPolicy struct {
	rules []hostRule
}

// NewEgressPolicy returns the policy of DefaultWebPushHosts plus extra, the
// operator's entries: "host", "*.domain" (every name below domain), either
// with ":port" (443 when none), or an IP address ("127.0.0.1:8443",
// "[::1]:8443"). The operator's entries are trusted: their addresses are not
// checked at connection time.
func NewEgressPolicy(extra []string) (*EgressPolicy, error) {
	p := &EgressPolicy{}
	for _, h := range DefaultWebPushHosts {
		r, err := parseHostRule(h)
		if err != nil {
			return nil, err
		}
		r.paths = pushPaths[h]
		p.rules = append(p.rules, r)
	}
	for _, h := range extra {
		if h = strings.TrimSpace(h); h == "" {
			continue
		}
		r, err := parseHostRule(h)
		if err != nil {
			return nil, err
		}
		r.trusted = true
		p.rules = append(p.rules, r)
	}
	return p, nil
}

// DefaultEgressPolicy is the policy with the default hosts alone.
func DefaultEgressPolicy() *EgressPolicy {
	p, err := NewEgressPolicy(nil)
	if err != nil {
		panic(err) // The defaults are constants; a test parses them.
	}
	return p
}

func parseHostRule(entry string) (hostRule, error) {
	host, port := entry, "443"
	if h, p, err := net.SplitHostPort(entry); err == nil {
		host, port = h, p
	}
	r := hostRule{port: port}
	if n, err := strconv.ParseUint(port, 10, 16); err != nil || n == 0 {
		return r, fmt.Errorf("web push host %q: the port must be a number from 1 to 65535", entry)
	}
	host = NormalizeHost(host)
	if rest, ok := strings.CutPrefix(host, "*."); ok {
		host, r.suffix = rest, true
	}
	if host == "" || strings.ContainsAny(host, "*/@?#[] ") {
		return r, fmt.Errorf("web push host %q: want a host name, *.domain or an IP address, with an optional :port", entry)
	}
	if r.suffix && !strings.Contains(host, ".") {
		return r, fmt.Errorf("web push host %q: a wildcard must name a domain with at least two labels", entry)
	}
	r.host = host
	return r, nil
}

// NormalizeHost lower-cases a host name and drops one trailing dot, so that
// FCM.googleapis.com. is fcm.googleapis.com; an IP address is written in its
// canonical form, so that ::ffff:127.0.0.1 is not a spelling apart.
func NormalizeHost(host string) string {
	host = strings.TrimSuffix(strings.ToLower(host), ".")
	if a, err := netip.ParseAddr(host); err == nil {
		return a.String()
	}
	return host
}

// rule returns the rule that admits host and port, if any.
func (p *EgressPolicy) rule(host, port string) (hostRule, bool) {
	for _, r := range p.rules {
		if r.matches(host, port) {
			return r, true
		}
	}
	return hostRule{}, false
}

// CheckEndpoint says whether Herald may post to endpoint, as far as can be
// told without resolving its name: an https URL without credentials, on an
// allowed host and port, whose path is a push resource (checkPath), and,
// where the host is an IP address the operator did not add, a public one.
// The error wraps ErrEndpointForbidden.
func (p *EgressPolicy) CheckEndpoint(endpoint string) error {
	u, err := url.Parse(endpoint)
	if err != nil || u.Scheme != "https" || u.Host == "" || u.User != nil || u.Opaque != "" {
		return forbidden("the endpoint must be an absolute https URL without credentials")
	}
	host, port := NormalizeHost(u.Hostname()), u.Port()
	if port == "" {
		port = "443"
	}
	r, ok := p.rule(host, port)
	if !ok {
		return forbidden("%s is not a Web Push service Herald may post to", net.JoinHostPort(host, port))
	}
	if a, err := netip.ParseAddr(host); err == nil && !r.trusted {
		if why := InternalAddress(a); why != "" {
			return forbidden("%s is %s", host, why)
		}
	}
	return r.checkPath(u)
}

// EndpointHost is the host (and port, if named) of a Web Push endpoint,
// lower-cased: the push service it belongs to, by which the fan-out keys
// its breakers and the Web Push client its pacing. It is empty for an
// endpoint that is not an https URL, which is never sent to. It allocates
// nothing for an endpoint already in lower case, as they are.
func EndpointHost(endpoint string) string {
	rest, ok := strings.CutPrefix(endpoint, "https://")
	if !ok {
		return ""
	}
	if i := strings.IndexAny(rest, "/?#"); i >= 0 {
		rest = rest[:i]
	}
	return strings.ToLower(rest)
}

// checkPath says whether u's path may be a push endpoint's. On every host:
// no dot segments (a server that cleans its paths would serve another
// resource) and nothing under /_, where fakepush, which an operator's entry
// names in development and tests, keeps its control endpoints (/_reset,
// /_control): a caller's endpoint must never reset or steer it. On a
// default push service, the path must have one of the service's endpoint
// shapes (pushPaths). The path is judged decoded, as a server routes it, so
// /%5Freset is /_reset.
func (r hostRule) checkPath(u *url.URL) error {
	for _, seg := range strings.Split(u.Path, "/") {
		if seg == "." || seg == ".." {
			return forbidden("the endpoint's path must not hold . or .. segments")
		}
	}
	if strings.HasPrefix(u.Path, "/_") {
		return forbidden("the endpoint's path must not start with /_, where push services' test doubles keep their controls")
	}
	if r.paths == nil {
		return nil
	}
	for _, shape := range r.paths {
		if shape.matches(u) {
			return nil
		}
	}
	return forbidden("the endpoint's path is not a push subscription's on %s", u.Hostname())
}

// DialContext wraps dial, a net.Dialer's DialContext, for a client that sends
// to Web Push endpoints: an address the policy does not admit, or a name
// that resolves to an internal address, is refused before any connection
// is made. Proxies lists host:port addresses that are dialled as they are
// (the operator's HTTPS proxy, which resolves names itself).
func (p *EgressPolicy) DialContext(d *net.Dialer, proxies ...string) func(ctx context.Context, network, addr string) (net.Conn, error) {
	checked := PublicOnly(d)
	plain := *d
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		for _, proxy := range proxies {
			if addr == proxy {
				return plain.DialContext(ctx, network, addr)
			}
		}
		host, port, err := net.SplitHostPort(addr)
		if err != nil {
			return nil, forbidden("cannot read the address %q", addr)
		}
		r, ok := p.rule(NormalizeHost(host), port)
		switch {
		case !ok:
			return nil, forbidden("%s is not a Web Push service Herald may post to", addr)
		case r.trusted:
			return plain.DialContext(ctx, network, addr)
		}
		return checked.DialContext(ctx, network, addr)
	}
}

// PublicOnly returns a copy of d that refuses to connect to any address that
// is not a public unicast one (the error wraps ErrEndpointForbidden): Web
// Push endpoints and webhooks' URLs are the callers', and must not reach
// into the network Herald runs in.
func PublicOnly(d *net.Dialer) *net.Dialer {
	checked := *d
	// Control runs once per address the name resolved to, just before the
	// connection is attempted: the check sees the very address dialled, so
	// a name that resolves to a public address when it is registered and
	// to an internal one later is still refused.
	checked.Control = func(_, address string, _ syscall.RawConn) error {
		ap, err := netip.ParseAddrPort(address)
		if err != nil {
			return forbidden("cannot read the dialled address %q", address)
		}
		if why := InternalAddress(ap.Addr()); why != "" {
			return forbidden("the endpoint's host resolves to %s, which is %s", ap.Addr().Unmap(), why)
		}
		return nil
	}
	return &checked
}

// internalPrefixes are the ranges, beyond what netip classifies, that never
// hold a public push service: shared address space (CGNAT), the IETF
// protocol assignments, benchmarking, documentation, reserved, IPv6's
// deprecated site-local range (fec0::/10, which netip does not call
// private), and the IPv6 forms that embed an IPv4 address (IPv4-compatible
// ::/96 and IPv4-translated ::ffff:0:0:0/96, NAT64, 6to4, Teredo), which
// could carry an internal one. IPv4-mapped addresses (::ffff:0:0/96) are
// not here: InternalAddress judges them as the IPv4 address they map.
var internalPrefixes = func() []netip.Prefix {
	var out []netip.Prefix
	for _, s := range []string{
		"0.0.0.0/8", "100.64.0.0/10", "192.0.0.0/24", "192.0.2.0/24", "198.18.0.0/15",
		"198.51.100.0/24", "203.0.113.0/24", "240.0.0.0/4", "255.255.255.255/32",
		"fec0::/10", "::/96", "::ffff:0:0:0/96", "64:ff9b::/96", "64:ff9b:1::/48", "2001::/32", "2001:db8::/32", "2002::/16", "100::/64",
	} {
		out = append(out, netip.MustParsePrefix(s))
	}
	return out
}()

// InternalAddress says why a is not a public unicast address, or "" when it
// is one. An IPv4-mapped IPv6 address is judged as the IPv4 address it maps.
func InternalAddress(a netip.Addr) string {
	a = a.Unmap()
	switch {
	case !a.IsValid():
		return "not an address"
	case a.IsUnspecified():
		return "the unspecified address"
	case a.IsLoopback():
		return "a loopback address"
	case a.IsPrivate():
		return "a private address"
	case a.IsLinkLocalUnicast():
		return "a link-local address"
	case a.IsMulticast(), a.IsLinkLocalMulticast(), a.IsInterfaceLocalMulticast():
		return "a multicast address"
	case a.Zone() != "":
		return "a scoped address"
	}
	for _, p := range internalPrefixes {
		if p.Contains(a) {
			return "a reserved or special-purpose address"
		}
	}
	return ""
}
