package apns

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptrace"
	"net/url"
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
	p, err := New(cfg)
	require.NoError(t, err)
	t.Cleanup(p.Close)
	return &bundle{srv: srv, url: srv.URL(), client: srv.HTTPClient(), cfg: cfg, p: p}
}

// configFromEnv is what cmd/ does with the variables fakepush writes.
func configFromEnv(env map[string]string) Config {
	return Config{
		KeyFile: env[fake.EnvAPNsKeyFile],
		KeyID:   env[fake.EnvAPNsKeyID],
		TeamID:  env[fake.EnvAPNsTeamID],
		Topic:   env[fake.EnvAPNsTopic],
		Host:    env[fake.EnvAPNsHost],
	}
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
	return st.APNs
}

func (b *bundle) receipts(t testing.TB, messageID string) []fake.Receipt {
	t.Helper()
	var rs []fake.Receipt
	b.getJSON(t, "/_receipts?message_id="+url.QueryEscape(messageID), &rs)
	return rs
}

func message(t testing.TB, id string, urgent bool) *push.Message {
	t.Helper()
	m, err := push.NewMessage(id, urgent, push.Content{Title: "Reminder", Body: "Your appointment is at 09:00"}, time.Now().Add(time.Hour).Truncate(time.Second))
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

func hexTokens(n int) []string {
	tokens := make([]string, n)
	for i := range tokens {
		tokens[i] = fmt.Sprintf("%064x", i+1)
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
	tokens := hexTokens(3)

	before := time.Now()
	results := b.send(m, targets(tokens...))
	after := time.Now()

	for i, r := range results {
		require.True(t, r.Accepted, "target %d: %+v", i, r)
		require.Equal(t, push.ReasonNone, r.Reason)
		require.WithinRange(t, r.At, before, after)
	}
	receipts := b.receipts(t, m.ID)
	require.Len(t, receipts, 3)
	var got []string
	for _, rc := range receipts {
		require.Equal(t, "apns", rc.Channel)
		require.Equal(t, m.ID, rc.CollapseKey)
		got = append(got, rc.Token)
	}
	require.ElementsMatch(t, tokens, got)
}

// headerRecorder keeps the headers of every request it passes on.
type headerRecorder struct {
	base http.RoundTripper
	mu   sync.Mutex
	seen []http.Header
}

func (h *headerRecorder) RoundTrip(r *http.Request) (*http.Response, error) {
	h.mu.Lock()
	h.seen = append(h.seen, r.Header.Clone())
	h.mu.Unlock()
	return h.base.RoundTrip(r)
}

func TestSendHeaders(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *Config) { c.Connections = 1 })
	rec := &headerRecorder{base: b.p.clients[0].HTTPClient.Transport}
	b.p.clients[0].HTTPClient.Transport = rec

	for _, urgent := range []bool{true, false} {
		m := message(t, fmt.Sprintf("msg_%t", urgent), urgent)
		results := b.send(m, targets(hexTokens(1)...))
		require.True(t, results[0].Accepted, "%+v", results[0])

		h := rec.seen[len(rec.seen)-1]
		require.Equal(t, m.ID, h.Get("apns-collapse-id"))
		require.Equal(t, fmt.Sprint(m.ExpiresAt.Unix()), h.Get("apns-expiration"))
		require.Equal(t, "alert", h.Get("apns-push-type"))
		require.Equal(t, b.cfg.Topic, h.Get("apns-topic"))
		want := "5"
		if urgent {
			want = "10"
		}
		require.Equal(t, want, h.Get("apns-priority"))
	}
}

func TestSendFailures(t *testing.T) {
	t.Parallel()
	b := setup(t)
	m := message(t, "msg_2", false)
	live := hexTokens(1)[0]
	results := b.send(m, targets(
		live,
		"dead"+live[4:],
		"nothexatall",  // judged by the provider
		"abc/../"+live, // judged here: it would change the path
		"",
	))

	require.True(t, results[0].Accepted)
	want := []push.Reason{push.ReasonNone, push.ReasonUnregistered, push.ReasonBadToken, push.ReasonBadToken, push.ReasonBadToken}
	for i, r := range results {
		require.Equal(t, want[i], r.Reason, "target %d: %+v", i, r)
		require.False(t, r.At.IsZero(), "target %d has a definite outcome", i)
	}
	require.Contains(t, results[1].Detail, "Unregistered")
	require.Contains(t, results[2].Detail, "BadDeviceToken")
	require.Equal(t, int64(3), b.stats(t).Received, "tokens that would change the path are never sent")
}

func TestSendProviderTrouble(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		mode   string
		reason push.Reason
		detail string
	}{
		{"unavailable", push.ReasonProviderUnavailable, "503 ServiceUnavailable"},
		{"rate_limited", push.ReasonRateLimited, "429 TooManyRequests"},
	} {
		t.Run(tc.mode, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			b.control(t, `{"channel":"apns","mode":"`+tc.mode+`"}`)
			start := time.Now()
			results := b.send(message(t, "msg_3", true), targets(hexTokens(5)...))
			require.Less(t, time.Since(start), time.Second, "a failing provider answers at once and is not retried")
			for _, r := range results {
				require.False(t, r.Accepted)
				require.Equal(t, tc.reason, r.Reason)
				require.Equal(t, tc.detail, r.Detail)
				require.False(t, r.At.IsZero())
			}
			require.Equal(t, int64(5), b.stats(t).Received)
		})
	}
}

func TestSendTimeout(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *Config) { c.RequestTimeout = 100 * time.Millisecond })
	b.control(t, `{"channel":"apns","latency_ms":5000}`)
	start := time.Now()
	results := b.send(message(t, "msg_4", true), targets(hexTokens(3)...))
	require.Less(t, time.Since(start), 2*time.Second, "a hung provider does not hold the chunk")
	for _, r := range results {
		require.Equal(t, push.ReasonProviderUnavailable, r.Reason)
		require.Contains(t, r.Detail, "deadline exceeded")
		require.False(t, r.At.IsZero())
	}
}

func TestSendParked(t *testing.T) {
	t.Parallel()

	t.Run("BreakerOpen", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		results := make([]push.Result, 4)
		b.p.Send(context.Background(), message(t, "msg_5", true), targets(hexTokens(4)...), results, func() bool { return false })
		for _, r := range results {
			require.Equal(t, push.Result{Reason: push.ReasonProviderUnavailable, Detail: "parked: circuit breaker open"}, r)
		}
		require.Zero(t, b.stats(t).Received)
	})

	t.Run("OpensMidway", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		var asked atomic.Int32
		allow := func() bool { return asked.Add(1) <= 2 }
		results := make([]push.Result, 5)
		b.p.Send(context.Background(), message(t, "msg_6", true), targets(hexTokens(5)...), results, allow)
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

// inFlightTrace counts requests between getting a connection and reading
// the first byte of their answer, and keeps the peak.
func inFlightTrace(ctx context.Context, now, peak *atomic.Int64) context.Context {
	return httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		GotConn: func(httptrace.GotConnInfo) {
			n := now.Add(1)
			for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
			}
		},
		GotFirstResponseByte: func() { now.Add(-1) },
	})
}

func TestSendManyTargets(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *Config) { c.MaxInFlight = 16 })
	b.control(t, `{"channel":"apns","latency_ms":2}`)
	var now, peak atomic.Int64
	ctx := inFlightTrace(context.Background(), &now, &peak)
	m := message(t, "msg_7", false)

	// Two chunks at once share the Provider's limit.
	done := make(chan []push.Result, 2)
	for range 2 {
		go func() {
			ts := targets(hexTokens(2000)...)
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
	b.p.Send(ctx, message(t, "msg_8", true), targets(hexTokens(n)...), results, allowAll)
	for _, r := range results {
		require.True(t, r.Accepted)
	}
	return reused
}

func TestWarm(t *testing.T) {
	t.Parallel()

	t.Run("Warmed", func(t *testing.T) {
		t.Parallel()
		b := setup(t, func(c *Config) { c.Connections = 3 })
		require.NoError(t, b.p.Warm(context.Background()))
		require.Equal(t, int64(3), b.stats(t).Received, "one request per connection")
		// One push per connection: round robin puts each on its own.
		require.Equal(t, []bool{true, true, true}, firstSendReused(t, b, 3))
	})

	t.Run("Cold", func(t *testing.T) {
		t.Parallel()
		b := setup(t, func(c *Config) { c.Connections = 1 })
		require.Equal(t, []bool{false}, firstSendReused(t, b, 1))
	})

	t.Run("Unreachable", func(t *testing.T) {
		t.Parallel()
		b := setup(t, func(c *Config) { c.Host = "https://127.0.0.1:1" })
		require.ErrorContains(t, b.p.Warm(context.Background()), "apns: warm connection 0")
	})
}

func TestConfig(t *testing.T) {
	t.Parallel()
	valid := Config{KeyFile: "k.p8", KeyID: "K", TeamID: "T", Topic: "com.example"}

	got := valid.withDefaults()
	require.Equal(t, DefaultHost, got.Host)
	require.Equal(t, DefaultConnections, got.Connections)
	require.Equal(t, DefaultMaxInFlight, got.MaxInFlight)
	require.Equal(t, DefaultRequestTimeout, got.RequestTimeout)
	require.NoError(t, got.validate())
	require.LessOrEqual(t, DefaultMaxInFlight, DefaultConnections*maxStreamsPerConnection/2,
		"the default leaves each connection half of Apple's streams")

	for _, tc := range []struct {
		edit func(*Config)
		want string
	}{
		{func(c *Config) { c.KeyFile = "" }, "KeyFile (APNS_KEY_FILE) is required"},
		{func(c *Config) { c.KeyID = "" }, "KeyID (APNS_KEY_ID) is required"},
		{func(c *Config) { c.TeamID = "" }, "TeamID (APNS_TEAM_ID) is required"},
		{func(c *Config) { c.Topic = "" }, "Topic (APNS_TOPIC) is required"},
		{func(c *Config) { c.Host = "http://api.push.apple.com" }, "Host (APNS_HOST) must be an https:// URL"},
		{func(c *Config) { c.Connections = -1 }, "Connections must be at least 1"},
		{func(c *Config) { c.MaxInFlight = -1 }, "MaxInFlight must be at least 1"},
		{func(c *Config) { c.Connections, c.MaxInFlight = 1, 1001 }, "MaxInFlight 1001 exceeds Connections × 1000 streams"},
		{func(c *Config) { c.RequestTimeout = -time.Second }, "RequestTimeout must not be negative"},
	} {
		c := valid
		tc.edit(&c)
		_, err := New(c)
		require.ErrorContains(t, err, tc.want)
	}

	_, err := New(valid)
	require.ErrorContains(t, err, "KeyFile (APNS_KEY_FILE) k.p8", "a missing key file is named")
}

func TestReasonFor(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		status int
		reason string
		want   push.Reason
	}{
		{410, "Unregistered", push.ReasonUnregistered},
		{410, "ExpiredToken", push.ReasonUnregistered},
		{410, "", push.ReasonUnregistered},
		{400, "BadDeviceToken", push.ReasonBadToken},
		{400, "MissingDeviceToken", push.ReasonBadToken},
		{400, "DeviceTokenNotForTopic", push.ReasonInternal},
		{413, "PayloadTooLarge", push.ReasonPayloadRejected},
		{413, "", push.ReasonPayloadRejected},
		{400, "PayloadEmpty", push.ReasonPayloadRejected},
		{400, "BadPayload", push.ReasonPayloadRejected},
		{429, "TooManyRequests", push.ReasonRateLimited},
		{429, "TooManyProviderTokenUpdates", push.ReasonRateLimited},
		{429, "", push.ReasonRateLimited},
		{500, "InternalServerError", push.ReasonProviderUnavailable},
		{503, "ServiceUnavailable", push.ReasonProviderUnavailable},
		{503, "Shutdown", push.ReasonProviderUnavailable},
		{400, "IdleTimeout", push.ReasonProviderUnavailable},
		{502, "", push.ReasonProviderUnavailable},
		{403, "InvalidProviderToken", push.ReasonInternal},
		{403, "ExpiredProviderToken", push.ReasonInternal},
		{403, "MissingProviderToken", push.ReasonInternal},
		{403, "BadCertificate", push.ReasonInternal},
		{400, "TopicDisallowed", push.ReasonInternal},
		{400, "BadTopic", push.ReasonInternal},
		{400, "MissingTopic", push.ReasonInternal},
		{400, "BadCollapseId", push.ReasonInternal},
		{400, "BadExpirationDate", push.ReasonInternal},
		{400, "BadPriority", push.ReasonInternal},
		{400, "InvalidPushType", push.ReasonInternal},
		{404, "BadPath", push.ReasonInternal},
		{405, "MethodNotAllowed", push.ReasonInternal},
		{418, "SomethingNew", push.ReasonInternal},
	} {
		require.Equal(t, tc.want, reasonFor(tc.status, tc.reason), "%d %s", tc.status, tc.reason)
	}
}

func TestErrorReason(t *testing.T) {
	t.Parallel()
	// What apns2 returns when the payload is not JSON: no retry will fix it.
	_, err := json.Marshal(marshalsTo("{"))
	require.Equal(t, push.ReasonPayloadRejected, errorReason(err))
	// An undecodable answer is the provider's trouble.
	require.Equal(t, push.ReasonProviderUnavailable, errorReason(json.Unmarshal([]byte("{"), new(any))))
	require.Equal(t, push.ReasonProviderUnavailable, errorReason(context.DeadlineExceeded))
	require.Equal(t, push.ReasonProviderUnavailable, errorReason(&url.Error{Op: "Post", URL: "https://x", Err: fmt.Errorf("connection refused")}))
}

type marshalsTo string

func (m marshalsTo) MarshalJSON() ([]byte, error) { return []byte(m), nil }
