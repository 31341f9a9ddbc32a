// Package webpush sends Herald's pushes to browsers' push services with
// SherClockHolmes/webpush-go: RFC 8291 encryption, RFC 8292 VAPID, over one
// shared HTTP/2-capable client.
package webpush

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	webpush "github.com/SherClockHolmes/webpush-go"
	"golang.org/x/net/http/httpproxy"

	"github.com/heraldpush/herald/jobs/push"
)

// Connection health: a connection that has read nothing for pingAfter is
// pinged, and closed if the ping is not answered within pingTimeout.
const (
	pingAfter   = 30 * time.Second
	pingTimeout = 10 * time.Second
)

// recordOverhead is what webpush-go adds to a plaintext when it fills a
// record exactly: its header (16-byte salt, 4-byte record size, 1-byte key id
// length, 65-byte key), the padding delimiter and the 16-byte tag. webpush-go
// counts the header into the record size, so a RecordSize of plaintext plus
// recordOverhead is the smallest it accepts, and yields a body of exactly
// that many bytes with no padding. RFC 8291 only requires the record size to
// exceed plaintext, delimiter, padding and tag, which this does.
const recordOverhead = 16 + 4 + 1 + 65 + 1 + 16

// Provider sends to Web Push services. It is safe for concurrent use; all
// Send calls share its client, and those to one push service its pacing
// (hosts.go).
type Provider struct {
	cfg        Config
	subscriber string
	transport  *http.Transport
	client     *http.Client
	// hosts pace the requests to each push service, across all concurrent
	// Send calls.
	hosts *hosts
	// padRecords pads every record to webpush-go's default 4096 bytes, as
	// the library does when no RecordSize is given; the benchmark compares.
	padRecords bool
}

// New validates the VAPID keys and builds the shared client. It does not
// connect: push services are known only from the subscriptions sent to.
func New(cfg Config) (*Provider, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	// webpush-go would otherwise make an http.Client per push, and
	// net/http keeps only two idle connections per host by default: a
	// burst to one push service would dial hundreds. HTTP/2 multiplexes
	// the burst over few connections; the idle limit keeps those that
	// were needed.
	//
	// Every connection goes through the egress policy's dialer: an
	// endpoint is a URL a caller gave, and Herald must never become the
	// caller's way into the network it runs in.
	proxy := httpproxy.FromEnvironment().ProxyFunc()
	tr := &http.Transport{
		Proxy:               func(r *http.Request) (*url.URL, error) { return proxy(r.URL) },
		DialContext:         cfg.Egress.DialContext(&net.Dialer{Timeout: cfg.RequestTimeout, KeepAlive: 30 * time.Second}, proxyAddrs()...),
		TLSClientConfig:     &tls.Config{RootCAs: cfg.RootCAs, MinVersion: tls.VersionTLS12},
		ForceAttemptHTTP2:   true,
		MaxIdleConnsPerHost: cfg.MaxInFlight,
		IdleConnTimeout:     90 * time.Second,
		TLSHandshakeTimeout: cfg.RequestTimeout,
		HTTP2:               &http.HTTP2Config{SendPingTimeout: pingAfter, PingTimeout: pingTimeout},
	}
	return &Provider{
		cfg:        cfg,
		subscriber: subscriber(cfg.Subject),
		transport:  tr,
		// A push service answers; it never redirects. Following a
		// redirect would let an allowed host send Herald anywhere.
		client: &http.Client{Transport: tr, CheckRedirect: func(*http.Request, []*http.Request) error {
			return http.ErrUseLastResponse
		}},
		hosts: newHosts(cfg.MaxInFlight, cfg.HostRate, cfg.Quota),
	}, nil
}

// Warm does nothing: which push services a message goes to is known only
// from its subscriptions, so there is no connection to open at start.
// WarmFor opens them ahead of an instant, from the subscriptions due.
func (p *Provider) Warm(context.Context) error { return nil }

// Pacing is the pacing of every push service sent to lately: its bound on
// requests in flight now (MaxInFlight, or less while it pushes back) and
// its sustained rate, in the order of their hosts.
func (p *Provider) Pacing() []HostPacing { return p.hosts.pacing() }

// Close closes idle connections. Call it once no Send is running.
func (p *Provider) Close() {
	p.hosts.close()
	p.transport.CloseIdleConnections()
}

// Send pushes m to every target, filling results[i] for targets[i], in the
// way push.Limiter.Send describes: within each push service's in-flight
// limit and rate, asking allow before each request and parking the rest
// once it refuses, and calling answered (unless nil) with each request's
// index as its answer comes. Targets on different push services are sent
// concurrently, each service's through its own Limiter, so allow may be
// called from several goroutines at once. Each request is bounded by
// RequestTimeout; Send returns when all have answered.
func (p *Provider) Send(ctx context.Context, m *push.Message, targets []push.Target, results []push.Result, allow func() bool, answered func(i int)) {
	if len(targets) == 0 {
		return
	}
	urgency := webpush.UrgencyNormal
	if m.Urgent {
		urgency = webpush.UrgencyHigh
	}
	if w := m.Content.WebPush; w != nil && w.Urgency != "" {
		urgency = webpush.Urgency(w.Urgency)
	}
	// Every record is sized for the longest receipt token of the call, so
	// that the options can be shared: the others are padded by the few
	// bytes their shorter device ids leave.
	longest := 0
	for _, t := range targets {
		longest = max(longest, push.ReceiptLen(t.Receipt))
	}
	recordSize := uint32(len(m.WebPush) + longest + recordOverhead)
	if p.padRecords {
		recordSize = webpush.MaxRecordSize
	}
	// The options are the same for every subscription, and webpush-go only
	// reads them.
	opts := &webpush.Options{
		HTTPClient:      doer{p.client},
		RecordSize:      recordSize,
		Subscriber:      p.subscriber,
		Topic:           push.WebPushTopic(m.ID),
		TTL:             ttlSeconds(m, time.Now()),
		Urgency:         urgency,
		VAPIDPublicKey:  p.cfg.VAPIDPublicKey,
		VAPIDPrivateKey: p.cfg.VAPIDPrivateKey,
	}
	send := func(t push.Target) push.Result {
		return p.send(ctx, m.WebPush, &t, opts)
	}

	// The fan-out groups a chunk's targets by push service (each has a
	// breaker of its own), so a Send is nearly always to one: it goes
	// through that service's Limiter as it is.
	first := push.EndpointHost(targets[0].Token)
	for _, t := range targets[1:] {
		if push.EndpointHost(t.Token) != first {
			p.sendByHost(ctx, targets, results, allow, answered, send)
			return
		}
	}
	h := p.hosts.acquire(first)
	defer p.hosts.release(h)
	h.limiter.Send(ctx, targets, results, allow, answered, p.rejectEndpoint, func(t push.Target) push.Result { return h.classify(send(t)) })
}

// sendByHost is Send to targets on several push services: each service's
// share goes through its own Limiter, all at once, so that a service that
// is slow or throttling holds back only its own. The shares keep the
// caller's order and lead (push.WithLead: the lead's targets, wherever
// they fall), and once allow has refused, every share parks the rest
// without asking again.
func (p *Provider) sendByHost(ctx context.Context, targets []push.Target, results []push.Result, allow func() bool, answered func(i int),
	send func(push.Target) push.Result) {
	var shares [][]int
	byHost := map[string]int{}
	for i, t := range targets {
		host := push.EndpointHost(t.Token)
		k, ok := byHost[host]
		if !ok {
			k = len(shares)
			byHost[host] = k
			shares = append(shares, nil)
		}
		shares[k] = append(shares[k], i)
	}
	var refused atomic.Bool
	allowOnce := func() bool {
		if refused.Load() {
			return false
		}
		if !allow() {
			refused.Store(true)
			return false
		}
		return true
	}
	lead := push.LeadOf(ctx)
	var wg sync.WaitGroup
	for _, idx := range shares {
		wg.Go(func() {
			h := p.hosts.acquire(push.EndpointHost(targets[idx[0]].Token))
			defer p.hosts.release(h)
			ts := make([]push.Target, len(idx))
			for j, i := range idx {
				ts[j] = targets[i]
			}
			sctx := ctx
			if lead > 0 {
				// idx is in order: the share's lead is its targets
				// within the caller's.
				n, _ := slices.BinarySearch(idx, lead)
				sctx = push.WithLead(ctx, n)
			}
			out := make([]push.Result, len(idx))
			// done[j] is written by the goroutine that got target j's
			// answer, and read once Send has returned, which waits for
			// them all.
			done := make([]bool, len(idx))
			h.limiter.Send(sctx, ts, out, allowOnce, func(j int) {
				results[idx[j]] = out[j]
				done[j] = true
				if answered != nil {
					answered(idx[j])
				}
			}, p.rejectEndpoint, func(t push.Target) push.Result { return h.classify(send(t)) })
			for j, i := range idx {
				if !done[j] {
					results[i] = out[j]
				}
			}
		})
	}
	wg.Wait()
}

// rejectEndpoint refuses, before any request, an endpoint the egress policy
// does not admit: Herald posts only to push services over TLS, never to
// whatever a stored endpoint names (it may have been stored before the
// policy was narrowed).
func (p *Provider) rejectEndpoint(t push.Target) (push.Result, bool) {
	if err := p.cfg.Egress.CheckEndpoint(t.Token); err != nil {
		return push.Result{At: time.Now(), Reason: push.ReasonEndpointForbidden, Detail: err.Error()}, true
	}
	return push.Result{}, false
}

// proxyAddrs are the host:port addresses of the HTTPS proxy the environment
// names, if any: connections to it are the operator's, dialled as they are.
func proxyAddrs() []string {
	u, err := url.Parse(httpproxy.FromEnvironment().HTTPSProxy)
	if err != nil || u.Host == "" {
		return nil
	}
	port := u.Port()
	if port == "" {
		port = map[string]string{"https": "443", "socks5": "1080"}[u.Scheme]
		if port == "" {
			port = "80"
		}
	}
	return []string{net.JoinHostPort(u.Hostname(), port)}
}

// send encrypts and posts one push.
func (p *Provider) send(ctx context.Context, payload []byte, t *push.Target, opts *webpush.Options) push.Result {
	// webpush-go appends the padding delimiter and padding to the slice it
	// is given, which would write into the shared payload's spare capacity
	// from many goroutines. Each send gets its own copy, with the device's
	// receipt token spliced in (push.WithReceipt) and exactly the capacity
	// the padding needs so that appending never reallocates.
	n := len(payload) + push.ReceiptLen(t.Receipt)
	body := push.WithReceipt(make([]byte, 0, max(int(opts.RecordSize)-(recordOverhead-1), n+1)), payload, t.Receipt)
	sub := &webpush.Subscription{Endpoint: t.Token, Keys: webpush.Keys{Auth: t.Auth, P256dh: t.P256dh}}

	rctx, cancel := context.WithTimeout(ctx, p.cfg.RequestTimeout)
	defer cancel()
	resp, err := webpush.SendNotificationWithContext(rctx, body, sub, opts)
	if err != nil {
		reason := errorReason(err)
		var te *transportError
		return push.Result{At: time.Now(), Reason: reason, Detail: errorDetail(err),
			Unanswered: reason != push.ReasonEndpointForbidden && errors.As(err, &te)}
	}
	defer resp.Body.Close()
	at := time.Now()
	// Drained, so that an HTTP/1.1 connection can be reused. The body is
	// never kept: what a push service says is not for Herald's callers to
	// read (a result's detail reaches GET /v1/providers).
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4<<10))
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		return push.Result{At: at, Accepted: true}
	}
	detail := "push service answered " + strconv.Itoa(resp.StatusCode) + " " + http.StatusText(resp.StatusCode)
	if resp.StatusCode >= 300 && resp.StatusCode < 400 {
		return push.Result{At: at, Reason: push.ReasonEndpointForbidden, Detail: detail + ": redirects are not followed"}
	}
	return push.Result{
		At: at, Reason: reasonFor(resp.StatusCode), Detail: detail,
		RetryAfter: push.ParseRetryAfter(resp.Header.Get("Retry-After"), at),
		// A 429 is about this push resource, the one subscription (RFC
		// 8030 section 8.4): the push service is up for the others.
		TargetThrottled: resp.StatusCode == http.StatusTooManyRequests,
	}
}

// doer is the client webpush-go sends with. It marks the errors that come
// from the network, so that they can be told from webpush-go's own, which
// happen before anything is sent.
type doer struct {
	c *http.Client
}

func (d doer) Do(r *http.Request) (*http.Response, error) {
	resp, err := d.c.Do(r)
	if err != nil {
		return nil, &transportError{err: err}
	}
	return resp, nil
}

// transportError is a request that got no answer.
type transportError struct {
	err error
}

func (e *transportError) Error() string { return e.err.Error() }
func (e *transportError) Unwrap() error { return e.err }

// ttlSeconds is the message's remaining lifetime in whole seconds, rounded up:
// a TTL of 0 tells the push service to drop the message unless the browser
// is connected right now, which only an expired message deserves.
func ttlSeconds(m *push.Message, now time.Time) int {
	return int((m.TTL(now) + time.Second - 1) / time.Second)
}

// errorReason maps an error from webpush-go. A request without an answer is
// the service's trouble. Everything else failed before a request was made:
// the payload did not fit the record, or the subscription's keys are not
// keys (not base64, not a point on the curve), which no retry will fix.
func errorReason(err error) push.Reason {
	var te *transportError
	switch {
	case errors.Is(err, push.ErrEndpointForbidden):
		return push.ReasonEndpointForbidden
	case errors.As(err, &te):
		return push.ReasonProviderUnavailable
	case errors.Is(err, webpush.ErrMaxPadExceeded):
		return push.ReasonPayloadRejected
	}
	return push.ReasonBadToken
}

// errorDetail says what went wrong with a send that got no answer, without
// the endpoint, which is the subscription's token and which the text of
// every error that carries a URL quotes: the breaker of the endpoint's host
// keeps the detail, and names the host itself.
func errorDetail(err error) string {
	var te *transportError
	switch {
	case errors.As(err, &te), errors.Is(err, push.ErrEndpointForbidden):
		return push.ErrorClass(err)
	case errors.Is(err, webpush.ErrMaxPadExceeded):
		return "the payload does not fit the push service's record size"
	}
	return "the subscription's keys or endpoint cannot be used to encrypt or sign a push"
}

// reasonFor maps a push service's answer other than 2xx. 404 and 410 are the
// subscription gone (RFC 8030 section 7.3). 400 and 413 refuse the message
// itself. 401 refuses the app's VAPID credentials (credentials_refused);
// 403 says the subscription was made with another application server key
// (RFC 8292, section 4.2): another app's, or a key rotated away (wrong_app).
// Neither is the device's fault, and neither evicts it.
func reasonFor(status int) push.Reason {
	switch status {
	case http.StatusNotFound, http.StatusGone:
		return push.ReasonUnregistered
	case http.StatusBadRequest, http.StatusRequestEntityTooLarge:
		return push.ReasonPayloadRejected
	case http.StatusUnauthorized:
		return push.ReasonCredentialsRefused
	case http.StatusForbidden:
		return push.ReasonWrongApp
	}
	return push.StatusReason(status)
}
