package webhook

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/heraldpush/herald/jobs/push"
)

// MaxURLLength bounds a webhook's URL.
const MaxURLLength = 2048

// Policy decides where webhooks may post. A webhook's URL is the caller's,
// so it is held to the same rule as a Web Push endpoint's address: https,
// and only public addresses, checked when the URL is given (an IP address)
// and again at every connection (whatever the name resolves to then). Any
// public host will do: unlike Web Push, a receiver is the caller's own
// server. The operator may trust hosts (HERALD_WEBHOOK_HOSTS): their
// addresses are not checked, and they may be posted to over plain http, for
// a receiver inside the operator's own network. It is safe for concurrent
// use.
type Policy struct {
	trusted []trustedHost
}

// trustedHost is an operator's entry: a host, on one port or on any.
type trustedHost struct {
	host, port string
}

// NewPolicy returns the policy that trusts the operator's entries: "host"
// (on any port) or "host:port", a name or an IP address ("127.0.0.1",
// "hooks.internal:8080", "[::1]:9000").
func NewPolicy(trusted []string) (*Policy, error) {
	p := &Policy{}
	for _, entry := range trusted {
		if entry = strings.TrimSpace(entry); entry == "" {
			continue
		}
		host, port := entry, ""
		if h, pt, err := net.SplitHostPort(entry); err == nil {
			host, port = h, pt
			if n, err := strconv.ParseUint(port, 10, 16); err != nil || n == 0 {
				return nil, fmt.Errorf("webhook host %q: the port must be a number from 1 to 65535", entry)
			}
		}
		host = push.NormalizeHost(host)
		if host == "" || strings.ContainsAny(host, "*/@?#[] ") {
			return nil, fmt.Errorf("webhook host %q: want a host name or an IP address, with an optional :port", entry)
		}
		p.trusted = append(p.trusted, trustedHost{host: host, port: port})
	}
	return p, nil
}

func (p *Policy) trusts(host, port string) bool {
	host = push.NormalizeHost(host)
	for _, t := range p.trusted {
		if t.host == host && (t.port == "" || t.port == port) {
			return true
		}
	}
	return false
}

// CheckURL says whether a webhook may post to raw, as far as can be told
// without resolving its name: an absolute https URL (http on a trusted
// host) without credentials or fragment, at most MaxURLLength long, whose
// host, when it is an IP address the operator does not trust, is a public
// one. The error says why, for the caller.
func (p *Policy) CheckURL(raw string) error {
	if len(raw) > MaxURLLength {
		return fmt.Errorf("the url is longer than %d characters", MaxURLLength)
	}
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" || u.User != nil || u.Opaque != "" || u.Fragment != "" || (u.Scheme != "https" && u.Scheme != "http") {
		return errors.New("the url must be an absolute https URL without credentials or fragment")
	}
	port := u.Port()
	if port == "" {
		port = map[string]string{"https": "443", "http": "80"}[u.Scheme]
	}
	trusted := p.trusts(u.Hostname(), port)
	if u.Scheme == "http" && !trusted {
		return errors.New("the url must be https (plain http only to a host the operator trusts: HERALD_WEBHOOK_HOSTS)")
	}
	if a, err := netip.ParseAddr(push.NormalizeHost(u.Hostname())); err == nil && !trusted {
		if why := push.InternalAddress(a); why != "" {
			return fmt.Errorf("the url's host %s is %s; Herald posts only to public addresses", a, why)
		}
	}
	if !trusted && push.NormalizeHost(u.Hostname()) == "localhost" {
		return errors.New("the url's host is localhost; Herald posts only to public addresses")
	}
	return nil
}

// Client returns the HTTP client webhooks post with: each request bounded
// by timeout, connections only to public addresses (or trusted hosts), no
// proxy from the environment, and no redirect followed (a redirect is an
// answer that is not 2xx, so retried as any other).
func (p *Policy) Client(timeout time.Duration) *http.Client {
	dialer := &net.Dialer{Timeout: timeout, KeepAlive: 30 * time.Second}
	public := push.PublicOnly(dialer)
	transport := &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			host, port, err := net.SplitHostPort(addr)
			if err == nil && p.trusts(host, port) {
				return dialer.DialContext(ctx, network, addr)
			}
			return public.DialContext(ctx, network, addr)
		},
		ForceAttemptHTTP2:     true,
		MaxIdleConnsPerHost:   4,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   timeout,
		ResponseHeaderTimeout: timeout,
	}
	return &http.Client{
		Transport:     transport,
		Timeout:       timeout,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}
