package api

import (
	"net"
	"net/http"
	"net/netip"

	"github.com/labstack/echo/v4"
)

// forwardedHeaders sets how the server learns a request's client address
// (c.RealIP) and scheme (c.Scheme) from X-Forwarded-For, X-Real-IP and
// X-Forwarded-Proto. Any client can send those headers, so they are
// believed only when the request comes straight from one of the trusted
// proxies; with none, only the connection counts. Echo's own defaults also
// believe loopback and private addresses, which would let anyone on the
// same network name any address, so those are switched off here.
func forwardedHeaders(e *echo.Echo, trusted []*net.IPNet) {
	if len(trusted) == 0 {
		e.IPExtractor = echo.ExtractIPDirect()
		e.SchemeExtractor = echo.ExtractSchemeDirect()
		return
	}
	opts := []echo.TrustOption{echo.TrustLoopback(false), echo.TrustLinkLocal(false), echo.TrustPrivateNet(false)}
	for _, n := range trusted {
		opts = append(opts, echo.TrustIPRange(n))
	}
	fromXFF := echo.ExtractIPFromXFFHeader(opts...)
	fromRealIP := echo.ExtractIPFromRealIPHeader(opts...)
	e.IPExtractor = func(r *http.Request) string {
		// X-Forwarded-For, read from the right, is the chain of proxies the
		// request passed; X-Real-IP is for proxies that send only that.
		if len(r.Header.Values(echo.HeaderXForwardedFor)) > 0 {
			return fromXFF(r)
		}
		return fromRealIP(r)
	}
	e.SchemeExtractor = echo.ExtractSchemeFromHeaders(opts...)
}

// throttleKey is the part of a client address that the login throttle
// counts failures against: the address itself for IPv4, and its /64 for
// IPv6, since one IPv6 client usually holds a whole /64 and could otherwise
// take a fresh address for every guess.
func throttleKey(ip string) string {
	addr, err := netip.ParseAddr(ip)
	if err != nil {
		return ip
	}
	addr = addr.Unmap().WithZone("")
	if addr.Is4() {
		return addr.String()
	}
	return netip.PrefixFrom(addr, 64).Masked().String()
}
