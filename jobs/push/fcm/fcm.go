// Package fcm sends Herald's pushes through Firebase Cloud Messaging's HTTP v1
// API with the Firebase Admin SDK, over a few HTTP/2 connections that Warm
// opens (with an access token) before traffic arrives, and with one request
// per send: the SDK's own retries are cut short (see failFast).
package fcm

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	firebase "firebase.google.com/go/v4"
	"firebase.google.com/go/v4/messaging"
	"golang.org/x/net/http2"
	"golang.org/x/oauth2"
	"golang.org/x/oauth2/google"
	"google.golang.org/api/option"

	"github.com/heraldpush/herald/jobs/push"
)

// scope is the OAuth 2.0 scope FCM's send endpoint requires.
const scope = "https://www.googleapis.com/auth/firebase.messaging"

// Connection health: a connection that has read nothing for pingAfter is
// pinged, and closed if the ping is not answered within pingTimeout.
const (
	pingAfter   = 30 * time.Second
	pingTimeout = 10 * time.Second
)

// warmTopic is the topic of Warm's dry run. A dry run delivers nothing, so
// nobody need be subscribed to it.
const warmTopic = "herald-warm"

// Provider sends to FCM. It is safe for concurrent use; all Send calls share
// its connections and its in-flight limit.
type Provider struct {
	cfg    Config
	client *messaging.Client
	sends  *pool
	tokens *http.Transport
	// limiter bounds the requests in flight across all concurrent Send
	// calls.
	limiter *push.Limiter
}

// New reads the service-account file and builds the SDK client on Herald's
// own HTTP/2 transports. It does not connect; Warm does. ctx is used only
// while New runs.
func New(ctx context.Context, cfg Config) (*Provider, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	data := cfg.Credentials
	if len(data) == 0 {
		var err error
		if data, err = os.ReadFile(cfg.CredentialsFile); err != nil {
			return nil, fmt.Errorf("fcm config: CredentialsFile (FCM_CREDENTIALS_FILE): %w", err)
		}
	}

	// Access tokens come from the file's token_uri over a client of their
	// own: an ordinary transport (the token endpoint need not speak HTTP/2)
	// that trusts RootCAs, with a timeout because oauth2 fetches tokens
	// without the request's context. An exchange (a signed assertion, a
	// handshake, a round trip) happens about once an hour and is more work
	// than a push, so it is bounded like a warm-up, not like a request. The
	// token source outlives New, so its context must not end with New's.
	tokenTimeout := max(cfg.RequestTimeout, push.WarmTimeout)
	tlsConfig := &tls.Config{RootCAs: cfg.RootCAs, MinVersion: tls.VersionTLS12}
	tokens := &http.Transport{
		Proxy:               http.ProxyFromEnvironment,
		TLSClientConfig:     tlsConfig.Clone(),
		ForceAttemptHTTP2:   true,
		TLSHandshakeTimeout: tokenTimeout,
		IdleConnTimeout:     90 * time.Second,
	}
	tokenCtx := context.WithValue(context.WithoutCancel(ctx), oauth2.HTTPClient, &http.Client{Transport: tokens, Timeout: tokenTimeout})
	creds, err := google.CredentialsFromJSONWithType(tokenCtx, data, google.ServiceAccount, scope)
	if err != nil {
		return nil, fmt.Errorf("fcm config: CredentialsFile (FCM_CREDENTIALS_FILE) %s: %w", cfg.CredentialsFile, err)
	}
	if creds.ProjectID == "" {
		return nil, fmt.Errorf("fcm config: CredentialsFile (FCM_CREDENTIALS_FILE) %s has no project_id", cfg.CredentialsFile)
	}

	// The SDK's default client opens a connection per request in a burst.
	// Herald's multiplexes requests over a few HTTP/2 connections instead,
	// as many as MaxInFlight needs at Google's streams per connection, each
	// on a transport of its own so that Warm can open every one of them.
	sends := &pool{}
	for range (cfg.MaxInFlight + streamsPerConnection - 1) / streamsPerConnection {
		sends.transports = append(sends.transports, &http2.Transport{
			TLSClientConfig: tlsConfig,
			ReadIdleTimeout: pingAfter,
			PingTimeout:     pingTimeout,
		})
	}
	hc := &http.Client{Transport: failFast{base: &oauth2.Transport{Source: tokenSource{src: creds.TokenSource}, Base: sends}}}
	app, err := firebase.NewApp(ctx, &firebase.Config{ProjectID: creds.ProjectID},
		option.WithHTTPClient(hc), option.WithEndpoint(cfg.Endpoint))
	if err != nil {
		return nil, fmt.Errorf("fcm: %w", err)
	}
	client, err := app.Messaging(ctx)
	if err != nil {
		return nil, fmt.Errorf("fcm: %w", err)
	}
	limiter := push.NewLimiter(cfg.MaxInFlight)
	if cfg.Quota != nil && cfg.Rate > 0 {
		limiter.SetPacer(cfg.Quota(creds.ProjectID, cfg.Rate), cfg.Rate)
	} else {
		limiter.SetRate(cfg.Rate, int(60*cfg.Rate))
	}
	return &Provider{cfg: cfg, client: client, sends: sends, tokens: tokens, limiter: limiter}, nil
}

// Warm fetches an access token and opens every connection to FCM, with one
// dry run to a topic per connection, which FCM validates end to end
// (credentials, project, message) without delivering anything. The first
// push of a message then pays neither the token exchange nor a TLS
// handshake.
func (p *Provider) Warm(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, max(p.cfg.RequestTimeout, push.WarmTimeout))
	defer cancel()
	// The token first, so that the dry runs do not queue for it one by one.
	if _, err := p.client.SendDryRun(ctx, warmMessage()); err != nil {
		return fmt.Errorf("fcm: warm: %w", err)
	}
	// The pool hands each request the next connection, so one dry run per
	// remaining connection, concurrently, reaches every one.
	errs := make([]error, len(p.sends.transports)-1)
	var wg sync.WaitGroup
	for i := range errs {
		wg.Go(func() {
			if _, err := p.client.SendDryRun(ctx, warmMessage()); err != nil {
				errs[i] = fmt.Errorf("fcm: warm: %w", err)
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// warmMessage is Warm's dry run: a data message to a topic.
func warmMessage() *messaging.Message {
	return &messaging.Message{Topic: warmTopic, Data: map[string]string{"herald": "warm"}}
}

// Rate is the sends a second the Provider keeps to; zero for no bound.
func (p *Provider) Rate() float64 { return p.limiter.Rate() }

// InFlightLimit is the bound on requests in flight now: MaxInFlight, or
// less while the provider pushes back (push.Limiter).
func (p *Provider) InFlightLimit() int { return p.limiter.InFlightLimit() }

// Close closes idle connections. Call it once no Send is running.
func (p *Provider) Close() {
	p.limiter.Close()
	for _, t := range p.sends.transports {
		t.CloseIdleConnections()
	}
	p.tokens.CloseIdleConnections()
}

// streamsPerConnection is how many concurrent streams Google's front ends
// allow on one HTTP/2 connection.
const streamsPerConnection = 100

// pool spreads requests over its transports in turn, one connection each.
// With StrictMaxConcurrentStreams off, a transport whose connection is full
// dials another rather than making requests wait, so the pool never hangs;
// sized to MaxInFlight it never needs to.
type pool struct {
	transports []*http2.Transport
	next       atomic.Uint64
}

func (p *pool) RoundTrip(r *http.Request) (*http.Response, error) {
	return p.transports[p.next.Add(1)%uint64(len(p.transports))].RoundTrip(r)
}

// Send pushes m to every target, filling results[i] for targets[i], in the
// way push.Limiter.Send describes: within the Provider's in-flight limit,
// asking allow before each request and parking the rest once it refuses,
// and calling answered (unless nil) with each request's index as its answer
// comes. Each request is bounded by RequestTimeout; Send returns when all
// have answered.
//
// Each device is one SDK Send rather than a share of SendEachForMulticast:
// the wire traffic is the same (the SDK sends one request per token either
// way), but this way allow is asked before every request, the in-flight
// limit is the Provider's rather than 50 per call, and each result carries
// the time its own answer arrived, which the skew figures are made of.
func (p *Provider) Send(ctx context.Context, m *push.Message, targets []push.Target, results []push.Result, allow func() bool, answered func(i int)) {
	base := p.message(m, time.Now())
	p.limiter.Send(ctx, targets, results, allow, answered, rejectToken, func(t push.Target) push.Result {
		msg := base
		msg.Token = t.Token
		if t.Receipt != "" {
			msg.Data = withReceipt(m.FCMData, t.Receipt)
		}
		return p.send(ctx, &msg)
	})
}

// withReceipt is data, the message's data map that every device shares,
// with the device's receipt token added under push.ReceiptKey: a map of its
// own, sized for it, since the SDK reads the map while it encodes the
// request and the shared one must not change. Copying a few keys costs
// little beside the encoding the SDK does for every send anyway.
func withReceipt(data map[string]string, token string) map[string]string {
	d := make(map[string]string, len(data)+1)
	for k, v := range data {
		d[k] = v
	}
	d[push.ReceiptKey] = token
	return d
}

// rejectToken refuses an empty token, which the SDK would refuse itself
// before sending anything.
func rejectToken(t push.Target) (push.Result, bool) {
	if t.Token != "" {
		return push.Result{}, false
	}
	return push.Result{At: time.Now(), Reason: push.ReasonBadToken, Detail: "empty FCM registration token"}, true
}

// send sends one message.
func (p *Provider) send(ctx context.Context, msg *messaging.Message) push.Result {
	rctx, cancel := context.WithTimeout(ctx, p.cfg.RequestTimeout)
	_, err := p.client.Send(rctx, msg)
	cancel()
	at := time.Now()
	if err == nil {
		return push.Result{At: at, Accepted: true}
	}
	r := classify(err, at)
	r.At = at
	return r
}

// message builds what every device of one Send shares: everything but the
// token. The parts are pointers the SDK only reads, so the per-device copies
// share them.
//
// A message with something to show is a notification message: Android
// folds a second copy of it on its notification's tag (androidNotification),
// and it carries no collapse key, which Firebase ignores on notification
// messages. To Apple devices it asks for the app's notification service
// extension (mutable-content), which sends its delivered receipt and
// fetches its image, given as apns.fcm_options.image.
//
// A message with nothing to show (push.Content.DataOnly) is a data message:
// no notification block, so that Android hands it to the app, and on Apple
// devices APNs' background push, content-available alone at priority 5,
// which is all FCM takes for a data message to Apple. It is collapsible
// only when fcm.tag asks: FCM keeps at most four collapse keys for an
// offline device, so a key of every message's own would leave it an
// arbitrary four; an app drops a second copy by herald_message_id.
//
// A message with something to show that asks for data-only delivery
// (push.Content.DrawnByApp) is a data message on Android, collapsible as
// above, its display fields in its data for the app to draw; Apple devices
// get its alert from the apns block (title and body, as FCM makes them of
// a notification block), so that they show it as before.
func (p *Provider) message(m *push.Message, now time.Time) messaging.Message {
	c := &m.Content
	androidPriority, apnsPriority, urgency := "normal", "5", "normal"
	if m.Urgent {
		androidPriority, apnsPriority, urgency = "high", "10", "high"
	}
	if c.FCM != nil && c.FCM.AndroidPriority != "" {
		androidPriority = c.FCM.AndroidPriority
	}
	if c.WebPush != nil && c.WebPush.Urgency != "" {
		urgency = c.WebPush.Urgency
	}
	msg := messaging.Message{
		Data:    m.FCMData,
		Android: &messaging.AndroidConfig{Priority: androidPriority},
		APNS:    &messaging.APNSConfig{Headers: map[string]string{"apns-collapse-id": m.ID, "apns-priority": apnsPriority}},
		Webpush: &messaging.WebpushConfig{Headers: map[string]string{
			"Urgency": urgency,
			"Topic":   push.WebPushTopic(m.ID),
		}},
	}
	switch {
	case c.DataOnly():
		msg.APNS.Headers["apns-priority"] = "5"
		msg.APNS.Headers["apns-push-type"] = "background"
		msg.APNS.Payload = &messaging.APNSPayload{Aps: &messaging.Aps{ContentAvailable: true}}
		if c.FCM != nil {
			msg.Android.CollapseKey = c.FCM.Tag
		}
	case c.DrawnByApp():
		msg.Android.CollapseKey = c.FCM.Tag
		msg.APNS.Payload, msg.APNS.FCMOptions = appleAlert(c)
		// Without a notification block for FCM to make the alert of, the
		// apns block carries it.
		if c.Title != "" || c.Body != "" {
			msg.APNS.Payload.Aps.Alert = &messaging.ApsAlert{Title: c.Title, Body: c.Body}
		}
	default:
		msg.Notification = &messaging.Notification{Title: c.Title, Body: c.Body, ImageURL: c.Image}
		msg.Android.Notification = androidNotification(m)
		msg.APNS.Payload, msg.APNS.FCMOptions = appleAlert(c)
	}
	// Without an expiry FCM's own default lifetime applies; Herald's
	// messages always have one.
	if !m.ExpiresAt.IsZero() {
		ttl := ttlOf(m, now)
		msg.Android.TTL = &ttl
		msg.APNS.Headers["apns-expiration"] = strconv.FormatInt(m.ExpiresAt.Unix(), 10)
		msg.Webpush.Headers["TTL"] = strconv.FormatInt(int64(ttl/time.Second), 10)
	}
	return msg
}

// appleAlert is the apns block's payload and options of a message with
// something to show. As on APNs itself (push.APNsPayload), every alert asks
// for the app's notification service extension (mutable-content): it
// fetches the image, given as fcm_options.image, and sends the delivered
// receipt.
func appleAlert(c *push.Content) (*messaging.APNSPayload, *messaging.APNSFCMOptions) {
	payload := &messaging.APNSPayload{Aps: &messaging.Aps{MutableContent: true}}
	if c.Image == "" {
		return payload, nil
	}
	return payload, &messaging.APNSFCMOptions{ImageURL: c.Image}
}

// androidNotification maps the display fields Android has: the tag that
// collapses notifications (the message id unless fcm.tag names another),
// sound, badge count, category as the click action, and fcm's own section.
func androidNotification(m *push.Message) *messaging.AndroidNotification {
	c := &m.Content
	n := &messaging.AndroidNotification{Tag: m.ID, Sound: c.Sound, NotificationCount: c.Badge, ClickAction: c.Category}
	if f := c.FCM; f != nil {
		n.Tag = cmp.Or(f.Tag, m.ID)
		n.ChannelID, n.Color, n.Icon = f.AndroidChannelID, f.Color, f.Icon
	}
	return n
}

// maxTTL is the longest time to live FCM takes: four weeks, the longest a
// Herald message lives.
const maxTTL = 28 * 24 * time.Hour

// ttlOf is the message's remaining lifetime in whole seconds, rounded up so
// that a message with a moment left is not sent as "now or never", and at
// most maxTTL, which the rounding would pass for a message of the longest
// lifetime sent a moment before its dispatch_at.
func ttlOf(m *push.Message, now time.Time) time.Duration {
	return min((m.TTL(now) + time.Second - 1).Truncate(time.Second), maxTTL)
}
