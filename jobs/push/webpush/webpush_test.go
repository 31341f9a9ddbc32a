package webpush

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	webpush "github.com/SherClockHolmes/webpush-go"
	"github.com/stretchr/testify/require"

	"github.com/heraldpush/herald/jobs/push"
	"github.com/heraldpush/herald/jobs/push/fake"
	"github.com/heraldpush/herald/jobs/push/pushtest"
)

// harness describes this package to pushtest's shared tests.
func harness() *pushtest.Harness[Config, *Provider] {
	return &pushtest.Harness[Config, *Provider]{
		Channel: fake.WebPush,
		Config:  configFromEnv,
		New:     New,
		Targets: pushtest.Subscriptions,
	}
}

// setup starts an in-process fakepush and a Provider pointed at it.
func setup(t testing.TB, configure ...func(*Config)) *pushtest.Bundle[Config, *Provider] {
	return harness().Setup(t, configure...)
}

// configFromEnv is what cmd/ does with the variables fakepush writes.
func configFromEnv(env map[string]string, roots *x509.CertPool, limits pushtest.Limits) Config {
	return Config{
		VAPIDPublicKey:  env[fake.EnvVAPIDPublicKey],
		VAPIDPrivateKey: env[fake.EnvVAPIDPrivateKey],
		Subject:         env[fake.EnvVAPIDSubject],
		RootCAs:         roots,
		MaxInFlight:     limits.MaxInFlight,
		RequestTimeout:  limits.RequestTimeout,
		Egress:          egressFromEnv(env),
	}
}

// egressFromEnv is the egress policy cmd/ builds from HERALD_WEBPUSH_HOSTS,
// which admits fakepush's own address.
func egressFromEnv(env map[string]string) *push.EgressPolicy {
	p, err := push.NewEgressPolicy(strings.Split(env[fake.EnvWebPushHosts], ","))
	if err != nil {
		panic(err)
	}
	return p
}

// bodyRecorder keeps the headers and bodies of the requests it passes on.
type bodyRecorder struct {
	base   http.RoundTripper
	mu     sync.Mutex
	header []http.Header
	bodies [][]byte
}

func (r *bodyRecorder) RoundTrip(req *http.Request) (*http.Response, error) {
	body, err := io.ReadAll(req.Body)
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	r.header = append(r.header, req.Header.Clone())
	r.bodies = append(r.bodies, body)
	r.mu.Unlock()
	req.Body = io.NopCloser(bytes.NewReader(body))
	return r.base.RoundTrip(req)
}

// TestSend runs the scenarios pushtest holds for every provider, with what
// this one makes of fakepush's failure modes.
func TestSend(t *testing.T) {
	t.Parallel()
	harness().Run(t,
		pushtest.Trouble{Mode: fake.ModeUnavailable, Reason: push.ReasonProviderUnavailable, Detail: "push service answered 503 Service Unavailable"},
		pushtest.Trouble{Mode: fake.ModeRateLimited, Reason: push.ReasonRateLimited, Detail: "push service answered 429 Too Many Requests"},
	)
}

func TestSendAccepted(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rec := &bodyRecorder{base: b.P.client.Transport}
	b.P.client.Transport = rec
	m := pushtest.Message(t, "msg_1", true)
	// Spare capacity in the shared payload is where webpush-go v1.4.0 would
	// write its padding if it were handed the payload itself.
	payload := bytes.Clone(m.WebPush)
	m.WebPush = append(make([]byte, 0, 4096), m.WebPush...)
	// fakepush decrypts every body to find its herald_message_id, and
	// takes the Topic for the collapse key.
	b.SendAccepted(t, m, b.Subscribe(t, 3, false))
	require.Equal(t, payload, m.WebPush, "the shared payload is left as it was")
	require.Equal(t, payload, m.WebPush[:cap(m.WebPush)][:len(payload)])

	// One record of exactly the payload and its overhead, not 4096 bytes.
	for i, body := range rec.bodies {
		require.Len(t, body, len(payload)+recordOverhead)
		require.Equal(t, uint32(len(body)), binary.BigEndian.Uint32(body[16:20]), "rs")
		h := rec.header[i]
		require.Equal(t, "high", h.Get("Urgency"))
		require.Equal(t, "msg_1", h.Get("Topic"))
		require.Equal(t, "3600", h.Get("TTL"), "the remaining lifetime, rounded up")
		require.Contains(t, h.Get("Authorization"), "vapid t=")
	}
}

func TestSendPadded(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.P.padRecords = true
	rec := &bodyRecorder{base: b.P.client.Transport}
	b.P.client.Transport = rec
	m := pushtest.Message(t, "msg_2", false)
	results := b.Send(m, b.Subscribe(t, 1, false))
	require.True(t, results[0].Accepted, "%+v", results[0])
	require.Len(t, rec.bodies[0], 4096)
	require.Equal(t, "normal", rec.header[0].Get("Urgency"))
	require.Len(t, b.Receipts(t, m.ID), 1)
}

func TestSendFailures(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ts := append(b.Subscribe(t, 1, false), b.Subscribe(t, 1, true)...)
	unknown := ts[0]
	unknown.Token = b.URL + "/webpush/unknownsubscription0000000000"
	badKey := ts[0]
	badKey.P256dh = "AAAA"
	plain := ts[0]
	plain.Token = strings.Replace(plain.Token, "https://", "http://", 1)
	ts = append(ts, unknown, badKey, plain)

	results := b.Send(pushtest.Message(t, "msg_3", false), ts)
	require.True(t, results[0].Accepted, "%+v", results[0])
	want := []push.Reason{push.ReasonNone, push.ReasonUnregistered, push.ReasonUnregistered, push.ReasonBadToken, push.ReasonEndpointForbidden}
	for i, r := range results {
		require.Equal(t, want[i], r.Reason, "target %d: %+v", i, r)
		require.False(t, r.At.IsZero())
	}
	// The status, never the push service's body: a detail reaches GET
	// /v1/providers, and a body is not the caller's to read.
	require.Equal(t, "push service answered 410 Gone", results[1].Detail)
	require.Equal(t, "push service answered 404 Not Found", results[2].Detail)
	require.Equal(t, int64(3), b.Stats(t).Received, "broken keys and plain http are never sent")
}

func TestWarm(t *testing.T) {
	t.Parallel()
	b := setup(t)
	require.NoError(t, b.P.Warm(context.Background()))
	require.Zero(t, b.Stats(t).Received)
}

func TestConfig(t *testing.T) {
	t.Parallel()
	priv, pub, err := webpush.GenerateVAPIDKeys()
	require.NoError(t, err)
	otherPriv, _, err := webpush.GenerateVAPIDKeys()
	require.NoError(t, err)
	valid := Config{VAPIDPublicKey: pub, VAPIDPrivateKey: priv, Subject: "mailto:ops@example.com"}

	got := valid.withDefaults()
	require.Equal(t, DefaultMaxInFlight, got.MaxInFlight)
	require.Equal(t, DefaultRequestTimeout, got.RequestTimeout)
	require.InDelta(t, DefaultHostRate, got.HostRate, 0)
	require.NoError(t, got.validate())
	p, err := New(valid)
	require.NoError(t, err)
	require.Equal(t, "ops@example.com", p.subscriber, "webpush-go adds mailto: itself")

	for _, tc := range []struct {
		edit func(*Config)
		want string
	}{
		{func(c *Config) { c.VAPIDPublicKey = "" }, "VAPIDPublicKey (VAPID_PUBLIC_KEY) is required"},
		{func(c *Config) { c.VAPIDPrivateKey = "" }, "VAPIDPrivateKey (VAPID_PRIVATE_KEY) is required"},
		{func(c *Config) { c.VAPIDPublicKey = "not base64!" }, "VAPIDPublicKey (VAPID_PUBLIC_KEY) is not base64url"},
		{func(c *Config) { c.VAPIDPrivateKey = "AAAA" }, "VAPIDPrivateKey (VAPID_PRIVATE_KEY) is not a P-256 private key"},
		{func(c *Config) { c.VAPIDPrivateKey = otherPriv }, "VAPIDPublicKey (VAPID_PUBLIC_KEY) is not the public half of VAPIDPrivateKey (VAPID_PRIVATE_KEY)"},
		{func(c *Config) { c.Subject = "" }, "Subject (VAPID_SUBJECT) must be a mailto: or https: contact"},
		{func(c *Config) { c.Subject = "mailto:" }, "Subject (VAPID_SUBJECT)"},
		{func(c *Config) { c.Subject = "ops" }, "Subject (VAPID_SUBJECT)"},
		{func(c *Config) { c.MaxInFlight = -1 }, "MaxInFlight must be at least 1"},
		{func(c *Config) { c.RequestTimeout = -time.Second }, "RequestTimeout must not be negative"},
	} {
		c := valid
		tc.edit(&c)
		_, err := New(c)
		require.ErrorContains(t, err, tc.want)
	}

	for subject, want := range map[string]string{
		"mailto:ops@example.com":      "ops@example.com",
		"ops@example.com":             "ops@example.com",
		"https://example.com/contact": "https://example.com/contact",
	} {
		require.Equal(t, want, subscriber(subject))
	}
}

func TestTTL(t *testing.T) {
	t.Parallel()
	now := time.Now()
	m := &push.Message{ID: "msg_1", ExpiresAt: now.Add(90*time.Second + time.Millisecond)}
	require.Equal(t, 91, ttlSeconds(m, now))
	require.Equal(t, 1, ttlSeconds(m, m.ExpiresAt.Add(-time.Millisecond)), "never 0 while the message lives")
	require.Equal(t, 0, ttlSeconds(m, m.ExpiresAt.Add(time.Second)))
}

func TestReasonFor(t *testing.T) {
	t.Parallel()
	for status, want := range map[int]push.Reason{
		404: push.ReasonUnregistered,
		410: push.ReasonUnregistered,
		400: push.ReasonPayloadRejected,
		413: push.ReasonPayloadRejected,
		429: push.ReasonRateLimited,
		500: push.ReasonProviderUnavailable,
		502: push.ReasonProviderUnavailable,
		503: push.ReasonProviderUnavailable,
		401: push.ReasonCredentialsRefused,
		403: push.ReasonWrongApp,
		405: push.ReasonInternal,
		301: push.ReasonInternal,
	} {
		require.Equal(t, want, reasonFor(status), "status %d", status)
	}
}

func TestErrorReason(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		err  error
		want push.Reason
	}{
		{&transportError{err: context.DeadlineExceeded}, push.ReasonProviderUnavailable},
		{fmt.Errorf("post: %w", &transportError{err: errors.New("connection refused")}), push.ReasonProviderUnavailable},
		{webpush.ErrMaxPadExceeded, push.ReasonPayloadRejected},
		{errors.New("Unmarshal Error: Public key is not a valid point on the curve"), push.ReasonBadToken},
	} {
		require.Equal(t, tc.want, errorReason(tc.err), "%v", tc.err)
	}
}

// TestEgressRefusesInternalEndpoints sends to endpoints that name another
// address on this machine in every spelling a caller could try, and through
// an admitted host that redirects there: the other address never receives a
// connection, and each delivery fails endpoint_forbidden.
func TestEgressRefusesInternalEndpoints(t *testing.T) {
	t.Parallel()
	inside := pushtest.StartInside(t)
	port := inside.Port

	// A push service the operator admitted that answers every push with a
	// redirect to the inside address.
	redirector := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "https://127.0.0.1:"+port+"/steal", http.StatusTemporaryRedirect)
	}))
	t.Cleanup(redirector.Close)

	fp := pushtest.Start(t)
	_, p := harness().NewProvider(t, fp, pushtest.Limits{}, func(c *Config) {
		c.RootCAs.AddCert(redirector.Certificate())
		egress, err := push.NewEgressPolicy([]string{fp.Env[fake.EnvWebPushHosts], strings.TrimPrefix(redirector.URL, "https://")})
		require.NoError(t, err)
		c.Egress = egress
	})
	sub := fp.Subscribe(t, 1, false)[0]
	var targets []push.Target
	for _, endpoint := range []string{
		"https://127.0.0.1:" + port + "/x",
		"https://localhost:" + port + "/x",
		"https://127.0.0.2:" + port + "/x",
		"https://0.0.0.0:" + port + "/x",
		"https://[::ffff:127.0.0.1]:" + port + "/x",
		"https://[::ffff:7f00:1]:" + port + "/x",
		"https://[::1]:" + port + "/x",
		"http://127.0.0.1:" + port + "/x",
		redirector.URL + "/webpush/x",
	} {
		tg := sub
		tg.Token = endpoint
		targets = append(targets, tg)
	}
	results := make([]push.Result, len(targets))
	p.Send(context.Background(), pushtest.Message(t, "msg_9", false), targets, results, pushtest.AllowAll, nil)
	for i, r := range results {
		require.Equal(t, push.ReasonEndpointForbidden, r.Reason, "%s: %+v", targets[i].Token, r)
		require.False(t, r.Unanswered, "a refused endpoint is known not to have been sent to")
	}
	require.Contains(t, results[len(results)-1].Detail, "redirects are not followed")
	time.Sleep(100 * time.Millisecond)
	require.Zero(t, inside.Connections(), "no connection reached the inside address")
	require.Zero(t, fp.Stats(t).WebPush.Received)
}

// TestRichPayload follows every field of a payload to fakepush, which
// decrypts the push as the browser would: the plaintext names the display
// fields as the Notification API's options do, and the headers carry the
// Urgency asked for and the message's TTL.
func TestRichPayload(t *testing.T) {
	t.Parallel()
	b := setup(t)
	m := pushtest.NewContentMessage(t, "msg_rich", pushtest.RichContent(), time.Hour)
	got := b.SendDetailed(t, m)
	require.Equal(t, pushtest.JSON(t, `{
		"title": "Standup", "subtitle": "Team Blue", "body": "In five minutes",
		"icon": "https://cdn.example.com/icon.png", "image": "https://cdn.example.com/standup.png",
		"badge": "https://cdn.example.com/badge.png", "tag": "standup", "renotify": true,
		"requireInteraction": true,
		"actions": [{"action": "join", "title": "Join"}, {"action": "snooze", "title": "Snooze"}],
		"app_badge": 7, "url": "https://app.example.com/standup/42",
		"data": {"room": "blue"}, "herald_message_id": "msg_rich"
	}`), got.Body)
	require.Equal(t, "low", got.Headers["urgency"], "webpush.urgency overrides the priority's")
	require.Equal(t, "msg_rich", got.Headers["topic"])
	require.Contains(t, []string{"3600", "3599"}, got.Headers["ttl"], "the message's TTL reaches the push service")
	require.Equal(t, "aes128gcm", got.Headers["content-encoding"])

	t.Run("Silent", func(t *testing.T) {
		t.Parallel()
		m := pushtest.NewContentMessage(t, "msg_silent", pushtest.SilentContent(), time.Hour)
		got := b.SendDetailed(t, m)
		require.Equal(t, pushtest.JSON(t, `{"silent":true,"url":"https://app.example.com/inbox","data":{"sync":"inbox"},"herald_message_id":"msg_silent"}`), got.Body)
	})
}
