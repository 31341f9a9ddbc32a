package webpush

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	webpush "github.com/SherClockHolmes/webpush-go"
	"github.com/stretchr/testify/require"

	"github.com/heraldpush/herald/jobs/push"
	"github.com/heraldpush/herald/jobs/push/fake"
)

// bundle is what most tests need: an in-process fakepush, a client that
// trusts it for its control endpoints, and a Provider pointed at it.
type bundle struct {
	srv    *fake.Server
	url    string
	client *http.Client
	cfg    Config
	p      *Provider
}

func setup(t testing.TB, configure ...func(*Config)) *bundle {
	t.Helper()
	srv, err := fake.New(fake.Config{Addr: "127.0.0.1:0", TLSDir: t.TempDir()})
	require.NoError(t, err)
	require.NoError(t, srv.Start(context.Background()))
	t.Cleanup(func() { srv.Close() })
	cfg := configFromEnv(srv.Env())
	cfg.RootCAs = srv.CertPool()
	for _, c := range configure {
		c(&cfg)
	}
	p, err := New(cfg)
	require.NoError(t, err)
	t.Cleanup(p.Close)
	return &bundle{srv: srv, url: srv.URL(), client: srv.HTTPClient(), cfg: cfg, p: p}
}

// configFromEnv is what cmd/ does with the variables fakepush writes.
func configFromEnv(env map[string]string) Config {
	return Config{
		VAPIDPublicKey:  env[fake.EnvVAPIDPublicKey],
		VAPIDPrivateKey: env[fake.EnvVAPIDPrivateKey],
		Subject:         env[fake.EnvVAPIDSubject],
	}
}

func (b *bundle) post(t testing.TB, path, body string, want int) []byte {
	t.Helper()
	resp, err := b.client.Post(b.url+path, "application/json", strings.NewReader(body))
	require.NoError(t, err)
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, want, resp.StatusCode, string(data))
	return data
}

func (b *bundle) control(t testing.TB, body string) { b.post(t, "/_control", body, http.StatusOK) }

// subscribe mints subscriptions over HTTP, as a browser's would be made.
func (b *bundle) subscribe(t testing.TB, n int, dead bool) []push.Target {
	t.Helper()
	ts := make([]push.Target, n)
	for i := range ts {
		var sub fake.Subscription
		require.NoError(t, json.Unmarshal(b.post(t, "/_webpush/subscriptions", fmt.Sprintf(`{"dead":%t}`, dead), http.StatusCreated), &sub))
		ts[i] = push.Target{DeviceID: int64(i + 1), Token: sub.Endpoint, P256dh: sub.Keys.P256dh, Auth: sub.Keys.Auth}
	}
	return ts
}

func (b *bundle) getJSON(t testing.TB, path string, v any) {
	t.Helper()
	resp, err := b.client.Get(b.url + path)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.NoError(t, json.NewDecoder(resp.Body).Decode(v))
}

func (b *bundle) stats(t testing.TB) fake.ChannelStats {
	t.Helper()
	var st fake.Stats
	b.getJSON(t, "/_stats", &st)
	return st.WebPush
}

func (b *bundle) receipts(t testing.TB, messageID string) []fake.Receipt {
	t.Helper()
	var rs []fake.Receipt
	b.getJSON(t, "/_receipts?message_id="+url.QueryEscape(messageID), &rs)
	return rs
}

func message(t testing.TB, id string, urgent bool) *push.Message {
	t.Helper()
	m, err := push.NewMessage(id, urgent, push.Content{Title: "Reminder", Body: "Your appointment is at 09:00"}, time.Now().Add(time.Hour))
	require.NoError(t, err)
	return m
}

func allowAll() bool { return true }

func (b *bundle) send(ctx context.Context, m *push.Message, ts []push.Target) []push.Result {
	results := make([]push.Result, len(ts))
	b.p.Send(ctx, m, ts, results, allowAll)
	return results
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

func TestSendAccepted(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rec := &bodyRecorder{base: b.p.client.Transport}
	b.p.client.Transport = rec
	m := message(t, "msg_1", true)
	// Spare capacity in the shared payload is where webpush-go v1.4.0 would
	// write its padding if it were handed the payload itself.
	payload := bytes.Clone(m.WebPush)
	m.WebPush = append(make([]byte, 0, 4096), m.WebPush...)
	ts := b.subscribe(t, 3, false)

	before := time.Now()
	results := b.send(context.Background(), m, ts)
	after := time.Now()

	for i, r := range results {
		require.True(t, r.Accepted, "target %d: %+v", i, r)
		require.WithinRange(t, r.At, before, after)
	}
	require.Equal(t, payload, m.WebPush, "the shared payload is left as it was")
	require.Equal(t, payload, m.WebPush[:cap(m.WebPush)][:len(payload)])

	// fakepush decrypted every body to find its herald_message_id.
	receipts := b.receipts(t, m.ID)
	require.Len(t, receipts, 3)
	var got, want []string
	for _, rc := range receipts {
		require.Equal(t, "webpush", rc.Channel)
		require.Equal(t, m.ID, rc.CollapseKey, "Topic is the message id")
		got = append(got, rc.Token)
	}
	for _, tg := range ts {
		want = append(want, tg.Token)
	}
	require.ElementsMatch(t, want, got)

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
	b.p.padRecords = true
	rec := &bodyRecorder{base: b.p.client.Transport}
	b.p.client.Transport = rec
	m := message(t, "msg_2", false)
	results := b.send(context.Background(), m, b.subscribe(t, 1, false))
	require.True(t, results[0].Accepted, "%+v", results[0])
	require.Len(t, rec.bodies[0], 4096)
	require.Equal(t, "normal", rec.header[0].Get("Urgency"))
	require.Len(t, b.receipts(t, m.ID), 1)
}

func TestSendFailures(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ts := append(b.subscribe(t, 1, false), b.subscribe(t, 1, true)...)
	unknown := ts[0]
	unknown.Token = b.url + "/webpush/unknownsubscription0000000000"
	badKey := ts[0]
	badKey.P256dh = "AAAA"
	plain := ts[0]
	plain.Token = strings.Replace(plain.Token, "https://", "http://", 1)
	ts = append(ts, unknown, badKey, plain)

	results := b.send(context.Background(), message(t, "msg_3", false), ts)
	require.True(t, results[0].Accepted, "%+v", results[0])
	want := []push.Reason{push.ReasonNone, push.ReasonUnregistered, push.ReasonUnregistered, push.ReasonBadToken, push.ReasonBadToken}
	for i, r := range results {
		require.Equal(t, want[i], r.Reason, "target %d: %+v", i, r)
		require.False(t, r.At.IsZero())
	}
	require.Contains(t, results[1].Detail, "410 ")
	require.Contains(t, results[1].Detail, "Subscription has expired or been unsubscribed.")
	require.Contains(t, results[2].Detail, "404 ")
	require.Equal(t, int64(3), b.stats(t).Received, "broken keys and plain http are never sent")
}

func TestSendProviderTrouble(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		mode   string
		reason push.Reason
		detail string
	}{
		{"unavailable", push.ReasonProviderUnavailable, "503 "},
		{"rate_limited", push.ReasonRateLimited, "429 "},
	} {
		t.Run(tc.mode, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			ts := b.subscribe(t, 3, false)
			b.control(t, `{"channel":"webpush","mode":"`+tc.mode+`"}`)
			start := time.Now()
			results := b.send(context.Background(), message(t, "msg_4", true), ts)
			require.Less(t, time.Since(start), time.Second)
			for _, r := range results {
				require.Equal(t, tc.reason, r.Reason)
				require.True(t, strings.HasPrefix(r.Detail, tc.detail), r.Detail)
				require.False(t, r.At.IsZero())
			}
			require.Equal(t, int64(3), b.stats(t).Received, "no retries")
		})
	}
}

func TestSendTimeout(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *Config) { c.RequestTimeout = 200 * time.Millisecond })
	ts := b.subscribe(t, 3, false)
	b.control(t, `{"channel":"webpush","latency_ms":5000}`)
	start := time.Now()
	results := b.send(context.Background(), message(t, "msg_5", true), ts)
	require.Less(t, time.Since(start), 2*time.Second, "a hung provider does not hold the chunk")
	for _, r := range results {
		require.Equal(t, push.ReasonProviderUnavailable, r.Reason)
		require.Contains(t, r.Detail, "deadline exceeded")
	}
}

func TestSendParked(t *testing.T) {
	t.Parallel()

	t.Run("BreakerOpen", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		ts := b.subscribe(t, 4, false)
		results := make([]push.Result, len(ts))
		b.p.Send(context.Background(), message(t, "msg_6", true), ts, results, func() bool { return false })
		for _, r := range results {
			require.Equal(t, push.Result{Reason: push.ReasonProviderUnavailable, Detail: "parked: circuit breaker open"}, r)
		}
		require.Zero(t, b.stats(t).Received)
	})

	t.Run("OpensMidway", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		ts := b.subscribe(t, 5, false)
		var asked atomic.Int32
		results := make([]push.Result, len(ts))
		b.p.Send(context.Background(), message(t, "msg_7", true), ts, results, func() bool { return asked.Add(1) <= 2 })
		require.True(t, results[0].Accepted)
		require.True(t, results[1].Accepted)
		for _, r := range results[2:] {
			require.True(t, r.At.IsZero(), "parked sends are not attempted")
			require.Equal(t, push.ReasonProviderUnavailable, r.Reason)
		}
		require.Equal(t, int32(3), asked.Load(), "allow is not asked again once it refused")
		require.Equal(t, int64(2), b.stats(t).Received)
	})
}

func TestSendManyTargets(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *Config) { c.MaxInFlight = 16 })
	b.control(t, `{"channel":"webpush","latency_ms":2}`)
	var now, peak atomic.Int64
	var reused atomic.Int64
	ctx := httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{
		GotConn: func(info httptrace.GotConnInfo) {
			if info.Reused {
				reused.Add(1)
			}
			n := now.Add(1)
			for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
			}
		},
		GotFirstResponseByte: func() { now.Add(-1) },
	})
	m := message(t, "msg_8", false)
	subs := b.subscribe(t, 50, false)

	// Two chunks at once share the Provider's limit.
	done := make(chan []push.Result, 2)
	for range 2 {
		go func() {
			ts := make([]push.Target, 2000)
			for i := range ts {
				ts[i] = subs[i%len(subs)]
			}
			results := make([]push.Result, len(ts))
			b.p.Send(ctx, m, ts, results, allowAll)
			done <- results
		}()
	}
	for range 2 {
		select {
		case results := <-done:
			for i, r := range results {
				require.True(t, r.Accepted, "target %d: %+v", i, r)
			}
		case <-time.After(60 * time.Second):
			t.Fatal("Send hung")
		}
	}
	require.LessOrEqual(t, peak.Load(), int64(16))
	require.Greater(t, peak.Load(), int64(1), "requests ran concurrently")
	require.Equal(t, int64(4000), b.stats(t).Accepted)
	// HTTP/2 multiplexes the burst: at worst the first request of each slot
	// dialed, instead of one connection per request beyond two idle ones.
	require.GreaterOrEqual(t, reused.Load(), int64(4000-16))
}

func TestWarm(t *testing.T) {
	t.Parallel()
	b := setup(t)
	require.NoError(t, b.p.Warm(context.Background()))
	require.Zero(t, b.stats(t).Received)
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

func TestTTLAndTopic(t *testing.T) {
	t.Parallel()
	now := time.Now()
	m := &push.Message{ID: "msg_1", ExpiresAt: now.Add(90*time.Second + time.Millisecond)}
	require.Equal(t, 91, ttlSeconds(m, now))
	require.Equal(t, 1, ttlSeconds(m, m.ExpiresAt.Add(-time.Millisecond)), "never 0 while the message lives")
	require.Equal(t, 0, ttlSeconds(m, m.ExpiresAt.Add(time.Second)))

	require.Equal(t, "msg_9223372036854775807", topicOf("msg_9223372036854775807"))
	long := topicOf(strings.Repeat("x", 33))
	require.Len(t, long, 32)
	require.True(t, isBase64URL(long))
	require.NotEqual(t, topicOf("msg.1"), topicOf("msg.2"))
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
