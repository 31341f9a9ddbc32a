package fcm

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

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
	p, err := New(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(p.Close)
	return &bundle{srv: srv, url: srv.URL(), client: srv.HTTPClient(), cfg: cfg, p: p}
}

// configFromEnv is what cmd/ does with the variables fakepush writes.
func configFromEnv(env map[string]string) Config {
	return Config{CredentialsFile: env[fake.EnvFCMCredentialsFile], Endpoint: env[fake.EnvFCMEndpoint]}
}

func (b *bundle) control(t testing.TB, body string) {
	t.Helper()
	resp, err := b.client.Post(b.url+"/_control", "application/json", strings.NewReader(body))
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
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
	return st.FCM
}

func (b *bundle) receipts(t testing.TB, messageID string) []fake.Receipt {
	t.Helper()
	var rs []fake.Receipt
	b.getJSON(t, "/_receipts?message_id="+url.QueryEscape(messageID), &rs)
	return rs
}

func message(t testing.TB, id string, urgent bool) *push.Message {
	t.Helper()
	m, err := push.NewMessage(id, urgent, push.Content{Title: "Reminder", Body: "Your appointment is at 09:00", Data: map[string]string{"kind": "appointment"}},
		time.Now().Add(time.Hour).Truncate(time.Second))
	require.NoError(t, err)
	return m
}

func targets(tokens ...string) []push.Target {
	ts := make([]push.Target, len(tokens))
	for i, tok := range tokens {
		ts[i] = push.Target{DeviceID: int64(i + 1), Token: tok}
	}
	return ts
}

func fcmTokens(n int) []string {
	tokens := make([]string, n)
	for i := range tokens {
		tokens[i] = fmt.Sprintf("fcm:%060x", i+1)
	}
	return tokens
}

func allowAll() bool { return true }

func (b *bundle) send(m *push.Message, ts []push.Target) []push.Result {
	results := make([]push.Result, len(ts))
	b.p.Send(context.Background(), m, ts, results, allowAll)
	return results
}

func TestSendAccepted(t *testing.T) {
	t.Parallel()
	b := setup(t)
	m := message(t, "msg_1", true)
	tokens := fcmTokens(3)

	before := time.Now()
	results := b.send(m, targets(tokens...))
	after := time.Now()

	for i, r := range results {
		require.True(t, r.Accepted, "target %d: %+v", i, r)
		require.WithinRange(t, r.At, before, after)
	}
	// Receipts are found by the herald_message_id in the data, and carry
	// the Android collapse key.
	receipts := b.receipts(t, m.ID)
	require.Len(t, receipts, 3)
	var got []string
	for _, rc := range receipts {
		require.Equal(t, "fcm", rc.Channel)
		require.Equal(t, m.ID, rc.CollapseKey)
		got = append(got, rc.Token)
	}
	require.ElementsMatch(t, tokens, got)
}

func TestMessage(t *testing.T) {
	t.Parallel()
	m := message(t, "msg_2", true)
	now := m.ExpiresAt.Add(-90*time.Second - 300*time.Millisecond)
	p := &Provider{}

	msg := p.message(m, now)
	require.Equal(t, m.FCMData, msg.Data)
	require.Equal(t, "msg_2", msg.Data[push.MessageIDKey])
	require.Equal(t, "Reminder", msg.Notification.Title)
	require.Equal(t, "msg_2", msg.Android.CollapseKey)
	require.Equal(t, "msg_2", msg.Android.Notification.Tag)
	require.Equal(t, "high", msg.Android.Priority)
	require.Equal(t, 91*time.Second, *msg.Android.TTL, "the remaining lifetime, rounded up")
	require.Equal(t, map[string]string{
		"apns-collapse-id": "msg_2",
		"apns-priority":    "10",
		"apns-expiration":  fmt.Sprint(m.ExpiresAt.Unix()),
	}, msg.APNS.Headers)
	require.Equal(t, map[string]string{"TTL": "91", "Urgency": "high", "Topic": "msg_2"}, msg.Webpush.Headers)

	m.Urgent = false
	msg = p.message(m, now)
	require.Equal(t, "normal", msg.Android.Priority)
	require.Equal(t, "5", msg.APNS.Headers["apns-priority"])
	require.Equal(t, "normal", msg.Webpush.Headers["Urgency"])

	msg = p.message(m, m.ExpiresAt.Add(time.Second))
	require.Zero(t, *msg.Android.TTL, "expired: now or never")
}

func TestTopicOf(t *testing.T) {
	t.Parallel()
	require.Equal(t, "msg_9223372036854775807", topicOf("msg_9223372036854775807"))
	long := topicOf(strings.Repeat("x", 40))
	require.Len(t, long, 32)
	require.True(t, isBase64URL(long))
	require.Len(t, topicOf("msg.1"), 32, "a character outside base64url is hashed away")
}

func TestSendFailures(t *testing.T) {
	t.Parallel()
	b := setup(t)
	live := fcmTokens(1)[0]
	results := b.send(message(t, "msg_3", false), targets(live, "dead"+live, "not a token!", ""))

	require.True(t, results[0].Accepted, "%+v", results[0])
	want := []push.Reason{push.ReasonNone, push.ReasonUnregistered, push.ReasonBadToken, push.ReasonBadToken}
	for i, r := range results {
		require.Equal(t, want[i], r.Reason, "target %d: %+v", i, r)
		require.False(t, r.At.IsZero())
	}
	require.Equal(t, "404 NOT_FOUND UNREGISTERED: Requested entity was not found.", results[1].Detail)
	require.Contains(t, results[2].Detail, "not a valid FCM registration token")
	require.Equal(t, int64(3), b.stats(t).Received, "an empty token is never sent")
}

func TestSendProviderTrouble(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		mode   string
		reason push.Reason
		detail string
	}{
		{"unavailable", push.ReasonProviderUnavailable, "503 UNAVAILABLE"},
		{"rate_limited", push.ReasonRateLimited, "429 RESOURCE_EXHAUSTED QUOTA_EXCEEDED"},
	} {
		t.Run(tc.mode, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			require.NoError(t, b.p.Warm(context.Background()))
			b.control(t, `{"channel":"fcm","mode":"`+tc.mode+`"}`)
			before := b.stats(t).Received

			start := time.Now()
			results := b.send(message(t, "msg_4", true), targets(fcmTokens(1)...))
			// Left to itself the SDK would retry a 503 four times over
			// about seven seconds.
			require.Less(t, time.Since(start), 500*time.Millisecond)
			require.Equal(t, before+1, b.stats(t).Received, "exactly one request")

			r := results[0]
			require.Equal(t, tc.reason, r.Reason)
			require.Contains(t, r.Detail, tc.detail)
			require.False(t, r.At.IsZero())
		})
	}
}

func TestSendNoConnection(t *testing.T) {
	t.Parallel()
	// The token endpoint (fakepush) answers; FCM itself is unreachable. The
	// SDK would retry a transport error four times over about seven seconds.
	b := setup(t, func(c *Config) { c.Endpoint = "https://127.0.0.1:1/v1" })
	start := time.Now()
	results := b.send(message(t, "msg_5", true), targets(fcmTokens(2)...))
	require.Less(t, time.Since(start), 500*time.Millisecond)
	for _, r := range results {
		require.Equal(t, push.ReasonProviderUnavailable, r.Reason)
		require.Contains(t, r.Detail, "no answer from FCM")
		require.Contains(t, r.Detail, "connection refused")
	}
}

func TestSendCredentialsRefused(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *Config) {
		data, err := os.ReadFile(c.CredentialsFile)
		require.NoError(t, err)
		var sa map[string]any
		require.NoError(t, json.Unmarshal(data, &sa))
		sa["client_email"] = "someone-else@herald-fake.iam.gserviceaccount.com"
		data, err = json.Marshal(sa)
		require.NoError(t, err)
		c.CredentialsFile = filepath.Join(t.TempDir(), "sa.json")
		require.NoError(t, os.WriteFile(c.CredentialsFile, data, 0o600))
	})
	start := time.Now()
	results := b.send(message(t, "msg_6", true), targets(fcmTokens(1)...))
	require.Less(t, time.Since(start), 500*time.Millisecond)
	require.Equal(t, push.ReasonInternal, results[0].Reason)
	require.Contains(t, results[0].Detail, "401 UNAUTHENTICATED: fetch access token")
	require.Contains(t, results[0].Detail, "account not found")
	require.ErrorContains(t, b.p.Warm(context.Background()), "fcm: warm: fetch access token")
}

func TestSendTimeout(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *Config) { c.RequestTimeout = 200 * time.Millisecond })
	require.NoError(t, b.p.Warm(context.Background()))
	b.control(t, `{"channel":"fcm","latency_ms":5000}`)
	start := time.Now()
	results := b.send(message(t, "msg_7", true), targets(fcmTokens(3)...))
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
		results := make([]push.Result, 4)
		b.p.Send(context.Background(), message(t, "msg_8", true), targets(fcmTokens(4)...), results, func() bool { return false })
		for _, r := range results {
			require.Equal(t, push.Result{Reason: push.ReasonProviderUnavailable, Detail: "parked: circuit breaker open"}, r)
		}
		require.Zero(t, b.stats(t).Received)
	})

	t.Run("OpensMidway", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		var asked atomic.Int32
		results := make([]push.Result, 5)
		b.p.Send(context.Background(), message(t, "msg_9", true), targets(fcmTokens(5)...), results, func() bool { return asked.Add(1) <= 2 })
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
	b.control(t, `{"channel":"fcm","latency_ms":2}`)
	var now, peak atomic.Int64
	ctx := httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{
		GotConn: func(httptrace.GotConnInfo) {
			n := now.Add(1)
			for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
			}
		},
		GotFirstResponseByte: func() { now.Add(-1) },
	})
	m := message(t, "msg_10", false)

	// Two chunks at once share the Provider's limit.
	done := make(chan []push.Result, 2)
	for range 2 {
		go func() {
			ts := targets(fcmTokens(2000)...)
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
}

// firstSendReused reports, for each request of one Send, whether it ran on a
// connection that had been used before.
func firstSendReused(t *testing.T, b *bundle, n int) []bool {
	t.Helper()
	var mu sync.Mutex
	var reused []bool
	ctx := httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{
		GotConn: func(info httptrace.GotConnInfo) {
			mu.Lock()
			reused = append(reused, info.Reused)
			mu.Unlock()
		},
	})
	results := make([]push.Result, n)
	b.p.Send(ctx, message(t, "msg_11", true), targets(fcmTokens(n)...), results, allowAll)
	for _, r := range results {
		require.True(t, r.Accepted)
	}
	return reused
}

func TestWarm(t *testing.T) {
	t.Parallel()

	t.Run("Warmed", func(t *testing.T) {
		t.Parallel()
		b := setup(t, func(c *Config) { c.MaxInFlight = 250 })
		require.Len(t, b.p.sends.transports, 3, "a connection per 100 in flight")
		require.NoError(t, b.p.Warm(context.Background()))
		st := b.stats(t)
		require.Equal(t, int64(3), st.Accepted, "one dry run per connection")
		require.Equal(t, []bool{true, true, true}, firstSendReused(t, b, 3))
		require.Empty(t, b.receipts(t, ""), "a dry run delivers nothing")
	})

	t.Run("Cold", func(t *testing.T) {
		t.Parallel()
		b := setup(t, func(c *Config) { c.MaxInFlight = 100 })
		require.Equal(t, []bool{false}, firstSendReused(t, b, 1))
	})
}

func TestConfig(t *testing.T) {
	t.Parallel()
	valid := Config{CredentialsFile: "sa.json"}

	got := valid.withDefaults()
	require.Equal(t, DefaultEndpoint, got.Endpoint)
	require.Equal(t, DefaultMaxInFlight, got.MaxInFlight)
	require.Equal(t, DefaultRequestTimeout, got.RequestTimeout)
	require.NoError(t, got.validate())
	require.Equal(t, "https://fcm.example/v1", Config{Endpoint: "https://fcm.example/v1/"}.withDefaults().Endpoint)

	for _, tc := range []struct {
		edit func(*Config)
		want string
	}{
		{func(c *Config) { c.CredentialsFile = "" }, "CredentialsFile (FCM_CREDENTIALS_FILE) is required"},
		{func(c *Config) { c.Endpoint = "https://fcm.googleapis.com" }, "Endpoint (FCM_ENDPOINT) must be an https:// URL ending in /v1"},
		{func(c *Config) { c.Endpoint = "http://fcm.googleapis.com/v1" }, "Endpoint (FCM_ENDPOINT) must be an https:// URL ending in /v1"},
		{func(c *Config) { c.MaxInFlight = -1 }, "MaxInFlight must be at least 1"},
		{func(c *Config) { c.RequestTimeout = -time.Second }, "RequestTimeout must not be negative"},
		{func(c *Config) {}, "CredentialsFile (FCM_CREDENTIALS_FILE): open sa.json"},
	} {
		c := valid
		tc.edit(&c)
		_, err := New(context.Background(), c)
		require.ErrorContains(t, err, tc.want)
	}

	noProject := filepath.Join(t.TempDir(), "sa.json")
	require.NoError(t, os.WriteFile(noProject, []byte(`{"type":"service_account","client_email":"a@b","private_key":"x","token_uri":"https://t"}`), 0o600))
	_, err := New(context.Background(), Config{CredentialsFile: noProject})
	require.ErrorContains(t, err, "has no project_id")
}

func TestReasonFor(t *testing.T) {
	t.Parallel()
	body := func(code int, status, fcmCode, message string) string {
		details := ""
		if fcmCode != "" {
			details = fmt.Sprintf(`,"details":[{"@type":"type.googleapis.com/google.firebase.fcm.v1.FcmError","errorCode":%q}]`, fcmCode)
		}
		return fmt.Sprintf(`{"error":{"code":%d,"message":%q,"status":%q%s}}`, code, message, status, details)
	}
	for _, tc := range []struct {
		status int
		body   string
		want   push.Reason
		detail string
	}{
		{404, body(404, "NOT_FOUND", "UNREGISTERED", "Requested entity was not found."), push.ReasonUnregistered,
			"404 NOT_FOUND UNREGISTERED: Requested entity was not found."},
		{403, body(403, "PERMISSION_DENIED", "SENDER_ID_MISMATCH", "SenderId mismatch"), push.ReasonInternal,
			"403 PERMISSION_DENIED SENDER_ID_MISMATCH: SenderId mismatch"},
		{400, body(400, "INVALID_ARGUMENT", "INVALID_ARGUMENT", "The registration token is not a valid FCM registration token"), push.ReasonBadToken,
			"400 INVALID_ARGUMENT: The registration token is not a valid FCM registration token"},
		{400, body(400, "INVALID_ARGUMENT", "INVALID_ARGUMENT", "Message is too big"), push.ReasonPayloadRejected,
			"400 INVALID_ARGUMENT: Message is too big"},
		{400, body(400, "INVALID_ARGUMENT", "", "Invalid JSON payload received."), push.ReasonPayloadRejected,
			"400 INVALID_ARGUMENT: Invalid JSON payload received."},
		{413, "", push.ReasonPayloadRejected, "413"},
		{429, body(429, "RESOURCE_EXHAUSTED", "QUOTA_EXCEEDED", "Quota exceeded."), push.ReasonRateLimited,
			"429 RESOURCE_EXHAUSTED QUOTA_EXCEEDED: Quota exceeded."},
		{429, "", push.ReasonRateLimited, "429"},
		{503, body(503, "UNAVAILABLE", "UNAVAILABLE", "The service is currently unavailable."), push.ReasonProviderUnavailable,
			"503 UNAVAILABLE: The service is currently unavailable."},
		{500, body(500, "INTERNAL", "INTERNAL", "Internal error."), push.ReasonProviderUnavailable,
			"500 INTERNAL: Internal error."},
		{502, "<html>Bad Gateway</html>", push.ReasonProviderUnavailable, "502"},
		{401, body(401, "UNAUTHENTICATED", "THIRD_PARTY_AUTH_ERROR", "Auth error from APNS or Web Push Service"), push.ReasonInternal,
			"401 UNAUTHENTICATED THIRD_PARTY_AUTH_ERROR: Auth error from APNS or Web Push Service"},
		{401, body(401, "UNAUTHENTICATED", "", "Request had invalid authentication credentials."), push.ReasonInternal,
			"401 UNAUTHENTICATED: Request had invalid authentication credentials."},
		{403, body(403, "PERMISSION_DENIED", "", "Permission 'cloudmessaging.messages.create' denied"), push.ReasonInternal,
			"403 PERMISSION_DENIED: Permission 'cloudmessaging.messages.create' denied"},
		{404, body(404, "NOT_FOUND", "", "Requested entity was not found."), push.ReasonInternal,
			"404 NOT_FOUND: Requested entity was not found."},
	} {
		reason, detail := reasonFor(tc.status, []byte(tc.body))
		require.Equal(t, tc.want, reason, tc.body)
		require.Equal(t, tc.detail, detail)
	}
}

func TestClassify(t *testing.T) {
	t.Parallel()
	reason, detail := classify(context.DeadlineExceeded)
	require.Equal(t, push.ReasonProviderUnavailable, reason)
	require.Equal(t, "context deadline exceeded", detail)
	reason, _ = classify(fmt.Errorf("exactly one of token, topic or condition must be specified"))
	require.Equal(t, push.ReasonInternal, reason, "the SDK refused the message before sending it")
}
