// Package apns sends Herald's pushes to Apple Push Notification service
// through sideshow/apns2 with token-based authentication, over a small pool
// of HTTP/2 connections that Warm opens before traffic arrives and pings keep
// open.
package apns

import (
	"context"
	"crypto/ecdsa"
	"crypto/tls"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sideshow/apns2"
	"github.com/sideshow/apns2/token"
	"golang.org/x/net/http2"

	"github.com/heraldpush/herald/jobs/push"
)

// Connection health: a connection that has read nothing for pingAfter is
// pinged, and closed if the ping is not answered within pingTimeout, so that
// a connection silently dropped by a middlebox is replaced before a push
// needs it rather than after a push has timed out on it.
const (
	pingAfter   = 30 * time.Second
	pingTimeout = 10 * time.Second
)

// maxTokenLen bounds a device token; Apple's are 64 hex digits today and
// documented as variable length, fakepush accepts up to 200.
const maxTokenLen = 200

// Provider sends to APNs. It is safe for concurrent use; all Send calls share
// its connections and its in-flight limit.
type Provider struct {
	cfg Config
	// clients send to the production host, sandboxClients to the sandbox
	// host: each environment has a pool of its own, since a connection is
	// to one host.
	clients        []*apns2.Client
	sandboxClients []*apns2.Client
	transports     []*http2.Transport
	next           atomic.Uint64
	// token is the provider token every connection sends: apns2 renews it
	// on its timer, renewToken when Apple calls it expired before that.
	token *token.Token
	// limiter bounds the requests in flight across all concurrent Send
	// calls.
	limiter *push.Limiter
}

// New loads the signing key and prepares the connection pool. It does not
// connect; Warm does.
func New(cfg Config) (*Provider, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	var key *ecdsa.PrivateKey
	var err error
	if len(cfg.Key) > 0 {
		if key, err = token.AuthKeyFromBytes(cfg.Key); err != nil {
			return nil, fmt.Errorf("apns config: Key: %w", err)
		}
	} else if key, err = token.AuthKeyFromFile(cfg.KeyFile); err != nil {
		return nil, fmt.Errorf("apns config: KeyFile (APNS_KEY_FILE) %s: %w", cfg.KeyFile, err)
	}
	// One provider token serves every connection: Apple refuses tokens
	// refreshed more often than every 20 minutes, and apns2 renews this one
	// under its lock before it ages out. Signing it now makes a broken key
	// fail here, not on the first push.
	tok := &token.Token{AuthKey: key, KeyID: cfg.KeyID, TeamID: cfg.TeamID}
	if _, err := tok.Generate(); err != nil {
		return nil, fmt.Errorf("apns config: KeyFile (APNS_KEY_FILE): sign a provider token: %w", err)
	}
	p := &Provider{cfg: cfg, limiter: push.NewLimiter(cfg.MaxInFlight), token: tok}
	p.clients = p.pool(cfg.Host, cfg.Connections, tok)
	// Sandbox devices are debug builds, few beside the production ones: one
	// connection serves them.
	p.sandboxClients = p.pool(cfg.SandboxHost, 1, tok)
	return p, nil
}

// pool makes n clients of host, each with a connection of its own.
func (p *Provider) pool(host string, n int, tok *token.Token) []*apns2.Client {
	cfg := p.cfg
	var clients []*apns2.Client
	for range n {
		// Each client has its own transport, and so its own connection: one
		// transport would multiplex everything onto a single connection.
		// StrictMaxConcurrentStreams stays false, so that should Apple ever
		// advertise fewer streams than MaxInFlight needs, the transport
		// dials another connection instead of queueing requests behind the
		// limit.
		tr := &http2.Transport{
			TLSClientConfig: &tls.Config{RootCAs: cfg.RootCAs, MinVersion: tls.VersionTLS12},
			ReadIdleTimeout: pingAfter,
			PingTimeout:     pingTimeout,
		}
		p.transports = append(p.transports, tr)
		clients = append(clients, &apns2.Client{
			Host:  host,
			Token: tok,
			// No client timeout: each request carries its own deadline.
			HTTPClient: &http.Client{Transport: tr},
		})
	}
	return clients
}

// Warm opens every connection of the production pool, concurrently, so
// that the first push of a message pays no TLS handshake. It sends one
// request per connection without a device token, which Apple answers with
// an error at no cost to anyone; any answer proves the connection.
//
// The sandbox connection is not warmed at start: sandbox devices are debug
// builds, and a deployment without any should not depend on reaching
// Apple's sandbox to start. WarmFor opens it ahead of an instant that has
// such devices.
func (p *Provider) Warm(ctx context.Context) error {
	return p.warm(ctx, true, false)
}

// WarmFor opens, ahead of an instant, the connections a send to targets
// will use, as Warm does: the production pool's if some target is a
// production device, the sandbox's if some is a debug build's. A
// connection still open carries the request in a round trip; one that was
// closed (Apple closes connections it has kept idle, and the sandbox's is
// opened by its first use) is dialled now, rather than by the instant's
// first push. The pool keeps what it opened: nothing closes an idle
// connection on Herald's side.
func (p *Provider) WarmFor(ctx context.Context, targets []push.Target) error {
	production := slices.ContainsFunc(targets, func(t push.Target) bool { return !t.Sandbox })
	sandbox := slices.ContainsFunc(targets, func(t push.Target) bool { return t.Sandbox })
	return p.warm(ctx, production, sandbox)
}

// warm sends one request without a device token on every connection of the
// pools asked for, concurrently.
func (p *Provider) warm(ctx context.Context, production, sandbox bool) error {
	type conn struct {
		name   string
		client *apns2.Client
	}
	var conns []conn
	if production {
		for i, c := range p.clients {
			conns = append(conns, conn{fmt.Sprintf("connection %d", i), c})
		}
	}
	if sandbox {
		for i, c := range p.sandboxClients {
			conns = append(conns, conn{fmt.Sprintf("sandbox connection %d", i), c})
		}
	}
	errs := make([]error, len(conns))
	var wg sync.WaitGroup
	for i, c := range conns {
		wg.Go(func() {
			rctx, cancel := context.WithTimeout(ctx, max(p.cfg.RequestTimeout, push.WarmTimeout))
			defer cancel()
			n := &apns2.Notification{Topic: p.cfg.Topic, PushType: apns2.PushTypeAlert, Payload: []byte(`{}`)}
			if _, err := c.client.PushWithContext(rctx, n); err != nil {
				errs[i] = fmt.Errorf("apns: warm %s: %w", c.name, err)
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// InFlightLimit is the bound on requests in flight now: MaxInFlight, or
// less while the provider pushes back (push.Limiter).
func (p *Provider) InFlightLimit() int { return p.limiter.InFlightLimit() }

// Close closes the pool's idle connections. Call it once no Send is running.
func (p *Provider) Close() {
	p.limiter.Close()
	for _, tr := range p.transports {
		tr.CloseIdleConnections()
	}
}

// Send pushes m to every target, filling results[i] for targets[i], in the
// way push.Limiter.Send describes: within the Provider's in-flight limit,
// asking allow before each request and parking the rest once it refuses,
// and calling answered (unless nil) with each request's index as its answer
// comes. Each request is bounded by RequestTimeout; Send returns when all
// have answered.
func (p *Provider) Send(ctx context.Context, m *push.Message, targets []push.Target, results []push.Result, allow func() bool, answered func(i int)) {
	// The notification is the same for every device but its token and
	// receipt; each request gets a copy. The payload was encoded once,
	// with the message.
	n := apns2.Notification{
		Topic:      p.cfg.Topic,
		CollapseID: m.ID,
		Expiration: m.ExpiresAt,
		Priority:   apns2.PriorityLow,
		PushType:   apns2.EPushType(push.APNsPushType(&m.Content)),
		Payload:    m.APNs,
	}
	// A background push goes at priority 5 whatever the message's
	// priority: Apple refuses it at 10.
	if m.Urgent && !m.Content.DataOnly() {
		n.Priority = apns2.PriorityHigh
	}

	p.limiter.Send(ctx, targets, results, allow, answered, rejectToken, func(t push.Target) push.Result {
		n := n
		n.DeviceToken = t.Token
		if t.Receipt != "" {
			// The device's receipt token is spliced into the payload
			// encoded once; apns2 sends a []byte payload as it is.
			n.Payload = push.WithReceipt(make([]byte, 0, len(m.APNs)+push.ReceiptLen(t.Receipt)), m.APNs, t.Receipt)
		}
		return p.push(ctx, &n, t.Sandbox)
	})
}

// rejectToken refuses a token that is not hex: Apple's tokens are, and one
// with '/', '?' or '#' in it would change the request's path, so that Apple
// would read another path or even another device's token. Checking here
// also lets Apple's BadDeviceToken mean the token's environment
// (errors.go).
func rejectToken(t push.Target) (push.Result, bool) {
	if validToken(t.Token) {
		return push.Result{}, false
	}
	return push.Result{At: time.Now(), Reason: push.ReasonBadToken, Detail: "not an APNs device token"}, true
}

// push sends one notification on the next connection of its environment's
// pool. When Apple answers that the provider token is expired, which
// apns2's timer (a new token every 50 minutes by the host's clock) should
// never let happen but a host's clock that jumped or a process that was
// suspended does, push signs a new token and sends the notification once
// more; a second ExpiredProviderToken is the answer.
func (p *Provider) push(ctx context.Context, n *apns2.Notification, sandbox bool) push.Result {
	bearer := p.token.GenerateIfExpired()
	r, expired := p.pushOnce(ctx, n, sandbox)
	if !expired || ctx.Err() != nil || p.renewToken(bearer) != nil {
		return r
	}
	r, _ = p.pushOnce(ctx, n, sandbox)
	return r
}

// renewToken signs a new provider token in place of stale, unless another
// send has already replaced it: the answers to a burst of sends with an
// expired token renew it once, as Apple answers TooManyProviderTokenUpdates
// to tokens renewed more often than every 20 minutes.
func (p *Provider) renewToken(stale string) error {
	t := p.token
	t.Lock()
	defer t.Unlock()
	if t.Bearer != stale {
		return nil
	}
	_, err := t.Generate()
	return err
}

// pushOnce sends one request, and reports whether Apple answered that its
// provider token is expired.
func (p *Provider) pushOnce(ctx context.Context, n *apns2.Notification, sandbox bool) (r push.Result, expiredToken bool) {
	clients := p.clients
	if sandbox {
		clients = p.sandboxClients
	}
	c := clients[p.next.Add(1)%uint64(len(clients))]
	rctx, cancel := context.WithTimeout(ctx, p.cfg.RequestTimeout)
	res, err := c.PushWithContext(rctx, n)
	cancel()
	at := time.Now()
	switch {
	case err != nil:
		reason := errorReason(err)
		// The error's text quotes the request's URL, which holds the
		// device token: the detail is the error's class alone.
		return push.Result{At: at, Reason: reason, Detail: push.ErrorClass(err), Unanswered: reason == push.ReasonProviderUnavailable}, false
	case res.StatusCode == http.StatusOK:
		return push.Result{At: at, Accepted: true}, false
	}
	return push.Result{
		At: at, Reason: reasonFor(res.StatusCode, res.Reason), Detail: strconv.Itoa(res.StatusCode) + " " + res.Reason,
		// Apple's TooManyRequests is about one device token ("too many
		// requests were made consecutively to the same device token"),
		// and Apple names no Retry-After: the delivery backs off, and
		// the other devices go on.
		TargetThrottled: res.Reason == apns2.ReasonTooManyRequests,
	}, res.Reason == apns2.ReasonExpiredProviderToken
}

// validToken reports whether t can be an APNs device token: hex digits, of
// a length the path can carry. Whether it is live, and of which
// environment, is Apple's to answer.
func validToken(t string) bool {
	if t == "" || len(t) > maxTokenLen {
		return false
	}
	for i := 0; i < len(t); i++ {
		c := t[i]
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F') {
			return false
		}
	}
	return true
}
