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
	}
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
		pushtest.Trouble{Mode: fake.ModeUnavailable, Reason: push.ReasonProviderUnavailable, Detail: `503 {"code":503,"errno":201,"error":"Service Unavailable","message":"Service temporarily unavailable."}`},
		pushtest.Trouble{Mode: fake.ModeRateLimited, Reason: push.ReasonRateLimited, Detail: `429 {"code":429,"errno":900,"error":"Too Many Requests","message":"Too many requests for this subscription."}`},
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
	want := []push.Reason{push.ReasonNone, push.ReasonUnregistered, push.ReasonUnregistered, push.ReasonBadToken, push.ReasonBadToken}
	for i, r := range results {
		require.Equal(t, want[i], r.Reason, "target %d: %+v", i, r)
		require.False(t, r.At.IsZero())
	}
	require.Contains(t, results[1].Detail, "410 ")
	require.Contains(t, results[1].Detail, "Subscription has expired or been unsubscribed.")
	require.Contains(t, results[2].Detail, "404 ")
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
		401: push.ReasonInternal,
		403: push.ReasonInternal,
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
