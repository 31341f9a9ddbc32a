package push

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"net/url"
	"regexp"
	"syscall"
)

// A result's Detail is kept by the breakers, shown in GET /v1/providers and
// the dashboard, and logged, none of which erasing a user reaches. A
// device's token is personal data (for APNs and Web Push it is in the
// request's URL), so a detail never holds it: it says what happened in the
// provider's status and words, or for a request that got no answer in the
// error's class (ErrorClass), never in the text of a Go error, which quotes
// the URL.

// ErrorClass names what kind of failure err is, in words that hold nothing
// of the request: "timeout", "connection refused", "TLS certificate not
// trusted", and so on. A refused endpoint or address says why in the egress
// policy's words, which name a host or an address, never a path.
func ErrorClass(err error) string {
	var (
		forbidden *ForbiddenError
		dnsErr    *net.DNSError
		netErr    net.Error
		certErr   *tls.CertificateVerificationError
		unknownCA x509.UnknownAuthorityError
		hostErr   x509.HostnameError
		invalid   x509.CertificateInvalidError
		alert     tls.AlertError
		record    tls.RecordHeaderError
	)
	switch {
	case err == nil:
		return ""
	case errors.As(err, &forbidden):
		return "refused: " + forbidden.Why
	case errors.Is(err, context.Canceled):
		return "cancelled"
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &netErr) && netErr.Timeout():
		return "timeout"
	case errors.As(err, &dnsErr):
		return "name not resolved"
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connection refused"
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE), errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return "connection closed"
	case errors.Is(err, syscall.ENETUNREACH), errors.Is(err, syscall.EHOSTUNREACH):
		return "network unreachable"
	case errors.As(err, &certErr), errors.As(err, &unknownCA), errors.As(err, &hostErr), errors.As(err, &invalid):
		return "TLS certificate not trusted"
	case errors.As(err, &alert), errors.As(err, &record):
		return "TLS handshake failed"
	}
	var urlErr *url.Error
	if errors.As(err, &urlErr) {
		return "request failed"
	}
	return "error"
}

// urlPattern finds URLs in a detail: a scheme, "://" and what follows up to
// a space or a quote.
var urlPattern = regexp.MustCompile(`[A-Za-z][A-Za-z0-9+.-]*://[^\s"'<>]*`)

// ScrubDetail replaces every URL in detail with its scheme and host, so
// that a detail that quotes a request's URL (a Go error's text) keeps no
// path, query or credentials. It is the last guard before a detail is kept
// or logged; providers make details that need none.
func ScrubDetail(detail string) string {
	return urlPattern.ReplaceAllStringFunc(detail, func(s string) string {
		u, err := url.Parse(s)
		if err != nil || u.Host == "" {
			return "(a URL)"
		}
		return u.Scheme + "://" + u.Host
	})
}
