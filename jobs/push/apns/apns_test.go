package apns

import (
	"context"
	"crypto/ecdsa"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sideshow/apns2/token"
	"github.com/stretchr/testify/require"

	"github.com/heraldpush/herald/jobs/push"
	"github.com/heraldpush/herald/jobs/push/fake"
	"github.com/heraldpush/herald/jobs/push/pushtest"
)

// harness describes this package to pushtest's shared tests and benchmark.
func harness() *pushtest.Harness[Config, *Provider] {
	return &pushtest.Harness[Config, *Provider]{
		Channel: fake.APNs,
		Config:  configFromEnv,
		New:     New,
		// Tokens shaped like Apple's: 64 hex digits.
		Targets: pushtest.TokenTargets("%064x"),
	}
}

// setup starts an in-process fakepush and a Provider pointed at it.
func setup(t testing.TB, configure ...func(*Config)) *pushtest.Bundle[Config, *Provider] {
	return harness().Setup(t, configure...)
}

// configFromEnv is what cmd/ does with the variables fakepush writes.
func configFromEnv(env map[string]string, roots *x509.CertPool, limits pushtest.Limits) Config {
	return Config{
		KeyFile:        env[fake.EnvAPNsKeyFile],
		KeyID:          env[fake.EnvAPNsKeyID],
		TeamID:         env[fake.EnvAPNsTeamID],
		Topic:          env[fake.EnvAPNsTopic],
		Host:           env[fake.EnvAPNsHost],
		SandboxHost:    env[fake.EnvAPNsSandboxHost],
		RootCAs:        roots,
		MaxInFlight:    limits.MaxInFlight,
		RequestTimeout: limits.RequestTimeout,
	}
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
	rec := &headerRecorder{base: b.P.clients[0].HTTPClient.Transport}
	b.P.clients[0].HTTPClient.Transport = rec

	for _, urgent := range []bool{true, false} {
		m := pushtest.Message(t, fmt.Sprintf("msg_%t", urgent), urgent)
		results := b.Send(m, b.Targets(t, 1))
		require.True(t, results[0].Accepted, "%+v", results[0])

		h := rec.seen[len(rec.seen)-1]
		require.Equal(t, m.ID, h.Get("apns-collapse-id"))
		require.Equal(t, fmt.Sprint(m.ExpiresAt.Unix()), h.Get("apns-expiration"))
		require.Equal(t, "alert", h.Get("apns-push-type"))
		require.Equal(t, b.Cfg.Topic, h.Get("apns-topic"))
		want := "5"
		if urgent {
			want = "10"
		}
		require.Equal(t, want, h.Get("apns-priority"))
	}
}

// TestSend runs the scenarios pushtest holds for every provider, with what
// this one makes of fakepush's failure modes.
func TestSend(t *testing.T) {
	t.Parallel()
	harness().Run(t,
		pushtest.Trouble{Mode: fake.ModeUnavailable, Reason: push.ReasonProviderUnavailable, Detail: "503 ServiceUnavailable"},
		pushtest.Trouble{Mode: fake.ModeRateLimited, Reason: push.ReasonRateLimited, Detail: "429 TooManyRequests"},
	)
}

func TestSendFailures(t *testing.T) {
	t.Parallel()
	b := setup(t)
	m := pushtest.Message(t, "msg_2", false)
	live := b.Targets(t, 1)[0].Token
	results := b.Send(m, pushtest.Targets(
		live,
		"dead"+live[4:],
		"nothexatall",  // judged here: Apple's tokens are hex
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
	require.Equal(t, int64(2), b.Stats(t).Received, "tokens that are not hex are never sent")
}

// TestSendSandbox checks that a sandbox token goes to the sandbox host
// alone, and that a token sent to the host of the other environment, which
// answers BadDeviceToken as Apple does, fails wrong_environment: not a dead
// token, so nothing evicts the device.
func TestSendSandbox(t *testing.T) {
	t.Parallel()
	b := setup(t)
	m := pushtest.Message(t, "msg_sandbox", false)
	tokens := b.Targets(t, 2)
	debug, release := tokens[0].Token, tokens[1].Token
	b.Post(t, "/_apns/sandbox-tokens", `{"tokens":["`+debug+`"]}`, http.StatusNoContent)

	results := b.Send(m, []push.Target{
		{DeviceID: 1, Token: debug, Sandbox: true},
		{DeviceID: 2, Token: release},
		{DeviceID: 3, Token: debug},                  // registered as production
		{DeviceID: 4, Token: release, Sandbox: true}, // registered as sandbox
	})
	require.True(t, results[0].Accepted, "%+v", results[0])
	require.True(t, results[1].Accepted, "%+v", results[1])
	for _, r := range results[2:] {
		require.Equal(t, push.ReasonWrongEnvironment, r.Reason, "%+v", r)
		require.False(t, r.Reason.Evicts())
		require.False(t, r.Reason.Transient())
	}
	receipts := b.Receipts(t, m.ID)
	require.Len(t, receipts, 2)
	byToken := map[string]string{}
	for _, r := range receipts {
		byToken[r.Token] = r.Environment
	}
	require.Equal(t, map[string]string{debug: "sandbox", release: "production"}, byToken)
}

func TestWarm(t *testing.T) {
	t.Parallel()

	t.Run("Warmed", func(t *testing.T) {
		t.Parallel()
		b := setup(t, func(c *Config) { c.Connections = 3 })
		require.NoError(t, b.P.Warm(context.Background()))
		require.Equal(t, fake.ChannelStats{Warmups: 3}, b.Stats(t), "one warm-up per connection, and no push")
		// One push per connection: round robin puts each on its own.
		require.Equal(t, []bool{true, true, true}, pushtest.FirstSendReused(t, b, 3))
	})

	t.Run("Cold", func(t *testing.T) {
		t.Parallel()
		b := setup(t, func(c *Config) { c.Connections = 1 })
		require.Equal(t, []bool{false}, pushtest.FirstSendReused(t, b, 1))
	})

	t.Run("Unreachable", func(t *testing.T) {
		t.Parallel()
		b := setup(t, func(c *Config) { c.Host = "https://127.0.0.1:1" })
		require.ErrorContains(t, b.P.Warm(context.Background()), "apns: warm connection 0")
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
		{400, "BadDeviceToken", push.ReasonWrongEnvironment},
		{400, "MissingDeviceToken", push.ReasonBadToken},
		{400, "DeviceTokenNotForTopic", push.ReasonWrongApp},
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
		{403, "InvalidProviderToken", push.ReasonCredentialsRefused},
		{403, "ExpiredProviderToken", push.ReasonInternal},
		{403, "MissingProviderToken", push.ReasonInternal},
		{403, "BadCertificate", push.ReasonInternal},
		{400, "TopicDisallowed", push.ReasonCredentialsRefused},
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

// TestRichPayload follows every field of a payload to fakepush: each
// arrives under the aps key or custom key Apple documents, with the push
// type, priority and expiry headers that go with it.
func TestRichPayload(t *testing.T) {
	t.Parallel()
	b := setup(t)
	m := pushtest.NewContentMessage(t, "msg_rich", pushtest.RichContent(), time.Hour)
	got := b.SendDetailed(t, m)
	require.Equal(t, pushtest.JSON(t, `{
		"aps": {
			"alert": {"title": "Standup", "subtitle": "Team Blue", "body": "In five minutes"},
			"badge": 7,
			"sound": {"critical": 1, "name": "chime.caf", "volume": 0.5},
			"thread-id": "standups",
			"category": "MEETING",
			"mutable-content": 1,
			"target-content-id": "standup-42",
			"interruption-level": "critical",
			"relevance-score": 0.75
		},
		"room": "blue",
		"url": "https://app.example.com/standup/42",
		"image": "https://cdn.example.com/standup.png",
		"herald_message_id": "msg_rich"
	}`), got.Body)
	require.Equal(t, "alert", got.Headers["apns-push-type"])
	require.Equal(t, "5", got.Headers["apns-priority"], "a bulk message")
	require.Equal(t, "msg_rich", got.Headers["apns-collapse-id"])
	require.Equal(t, fmt.Sprint(m.ExpiresAt.Unix()), got.Headers["apns-expiration"], "the message's TTL reaches APNs")
	require.Equal(t, "bearer (redacted)", got.Headers["authorization"])

	t.Run("Silent", func(t *testing.T) {
		t.Parallel()
		m, err := push.NewMessage("msg_silent", true, pushtest.SilentContent(), time.Now().Add(time.Hour))
		require.NoError(t, err)
		got := b.SendDetailed(t, m)
		require.Equal(t, pushtest.JSON(t, `{"aps":{"content-available":1},"sync":"inbox","url":"https://app.example.com/inbox","herald_message_id":"msg_silent"}`), got.Body)
		require.Equal(t, "background", got.Headers["apns-push-type"])
		require.Equal(t, "5", got.Headers["apns-priority"], "a background push goes at 5 even when urgent")
	})

	// Data and nothing to show, not marked silent: an alert push would carry
	// an empty alert, which shows nothing and does not wake the app, so it
	// goes as the background push it is, as it does through FCM.
	t.Run("DataOnly", func(t *testing.T) {
		t.Parallel()
		m, err := push.NewMessage("msg_data", true, push.Content{Data: map[string]string{"sync": "inbox"}}, time.Now().Add(time.Hour))
		require.NoError(t, err)
		got := b.SendDetailed(t, m)
		require.Equal(t, pushtest.JSON(t, `{"aps":{"content-available":1},"sync":"inbox","herald_message_id":"msg_data"}`), got.Body)
		require.Equal(t, "background", got.Headers["apns-push-type"])
		require.Equal(t, "5", got.Headers["apns-priority"], "a background push goes at 5 even when urgent")
	})
}

// providerToken signs a provider token issued at iat with the key of cfg,
// as apns2 would have at that time.
func providerToken(t testing.TB, cfg Config, iat int64) string {
	t.Helper()
	key, err := token.AuthKeyFromFile(cfg.KeyFile)
	require.NoError(t, err)
	enc := base64.RawURLEncoding
	input := enc.EncodeToString(fmt.Appendf(nil, `{"alg":"ES256","kid":%q}`, cfg.KeyID)) + "." +
		enc.EncodeToString(fmt.Appendf(nil, `{"iss":%q,"iat":%d}`, cfg.TeamID, iat))
	sum := sha256.Sum256([]byte(input))
	r, s, err := ecdsa.Sign(rand.Reader, key, sum[:])
	require.NoError(t, err)
	return input + "." + enc.EncodeToString(append(r.FillBytes(make([]byte, 32)), s.FillBytes(make([]byte, 32))...))
}

// TestExpiredProviderTokenRenewedAndResent: a provider token Apple finds
// older than an hour, though apns2 took it for fresh (the host's clock
// jumped, or the process was suspended), is answered 403
// ExpiredProviderToken; the provider signs a new one and sends each push
// once more, and every push is taken. The new token is signed once for
// the whole burst: fakepush, as Apple, answers 429
// TooManyProviderTokenUpdates to a connection whose token changes again
// within 20 minutes.
func TestExpiredProviderTokenRenewedAndResent(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *Config) { c.Connections = 1 })
	stale := providerToken(t, b.Cfg, time.Now().Add(-61*time.Minute).Unix())
	b.P.token.Lock()
	b.P.token.Bearer, b.P.token.IssuedAt = stale, time.Now().Unix()
	b.P.token.Unlock()

	m := pushtest.Message(t, "msg_expired_token", true)
	ts := b.Targets(t, 20)
	b.SendAccepted(t, m, ts)
	// A push that starts after the token was renewed is taken at once.
	st := b.Stats(t)
	require.Equal(t, int64(len(ts)), st.Accepted)
	require.Positive(t, st.Rejected, "the stale token was refused")
	require.Equal(t, st.Accepted+st.Rejected, st.Received, "each push refused at most once, then taken")
	require.NotEqual(t, stale, b.P.token.GenerateIfExpired())

	t.Run("ExpiredAgain", func(t *testing.T) {
		t.Parallel()
		// Apple's clock two hours ahead of the host's: every token the
		// host signs is expired on arrival. One resend, then the answer.
		var ahead atomic.Int64
		fp := pushtest.Start(t, func(c *fake.Config) {
			c.Now = func() time.Time { return time.Now().Add(time.Duration(ahead.Load())) }
		})
		_, p := harness().NewProvider(t, fp, pushtest.Limits{}, func(c *Config) { c.Connections = 1 })
		ahead.Store(int64(2 * time.Hour))
		results := make([]push.Result, 3)
		p.Send(context.Background(), m, ts[:3], results, pushtest.AllowAll, nil)
		for _, r := range results {
			require.Equal(t, push.ReasonInternal, r.Reason, "%+v", r)
			require.Equal(t, "403 ExpiredProviderToken", r.Detail)
		}
		require.Equal(t, fake.ChannelStats{Received: 6, Rejected: 6}, fp.Stats(t).APNs, "one resend a push")
	})
}
