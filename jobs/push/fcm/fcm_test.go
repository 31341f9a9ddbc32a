package fcm

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"firebase.google.com/go/v4/messaging"
	"github.com/stretchr/testify/require"

	"github.com/heraldpush/herald/jobs/push"
	"github.com/heraldpush/herald/jobs/push/fake"
	"github.com/heraldpush/herald/jobs/push/pushtest"
)

// harness describes this package to pushtest's shared tests and benchmark.
func harness() *pushtest.Harness[Config, *Provider] {
	return &pushtest.Harness[Config, *Provider]{
		Channel: fake.FCM,
		Config:  configFromEnv,
		New:     func(c Config) (*Provider, error) { return New(context.Background(), c) },
		// Tokens that fakepush takes for FCM registration tokens.
		Targets: pushtest.TokenTargets("fcm:%060x"),
	}
}

// setup starts an in-process fakepush and a Provider pointed at it.
func setup(t testing.TB, configure ...func(*Config)) *pushtest.Bundle[Config, *Provider] {
	return harness().Setup(t, configure...)
}

// configFromEnv is what cmd/ does with the variables fakepush writes.
func configFromEnv(env map[string]string, roots *x509.CertPool, limits pushtest.Limits) Config {
	return Config{
		CredentialsFile: env[fake.EnvFCMCredentialsFile],
		Endpoint:        env[fake.EnvFCMEndpoint],
		RootCAs:         roots,
		MaxInFlight:     limits.MaxInFlight,
		RequestTimeout:  limits.RequestTimeout,
	}
}

// TestSend runs the scenarios pushtest holds for every provider, with what
// this one makes of fakepush's failure modes.
func TestSend(t *testing.T) {
	t.Parallel()
	harness().Run(t,
		pushtest.Trouble{Mode: fake.ModeUnavailable, Reason: push.ReasonProviderUnavailable, Detail: "503 UNAVAILABLE: The service is currently unavailable."},
		pushtest.Trouble{Mode: fake.ModeRateLimited, Reason: push.ReasonRateLimited, Detail: "429 RESOURCE_EXHAUSTED QUOTA_EXCEEDED: Quota exceeded for quota metric 'Send requests' and limit 'Send requests per minute'."},
	)
}

func TestMessage(t *testing.T) {
	t.Parallel()
	m := pushtest.Message(t, "msg_2", true)
	now := m.ExpiresAt.Add(-90*time.Second - 300*time.Millisecond)
	p := &Provider{}

	msg := p.message(m, now)
	require.Equal(t, m.FCMData, msg.Data)
	require.Equal(t, "msg_2", msg.Data[push.MessageIDKey])
	require.Equal(t, "Reminder", msg.Notification.Title)
	require.Empty(t, msg.Android.CollapseKey, "a notification folds on its tag")
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

func TestSendFailures(t *testing.T) {
	t.Parallel()
	b := setup(t)
	live := b.Targets(t, 1)[0].Token
	results := b.Send(pushtest.Message(t, "msg_3", false), pushtest.Targets(live, "dead"+live, "not a token!", ""))

	require.True(t, results[0].Accepted, "%+v", results[0])
	want := []push.Reason{push.ReasonNone, push.ReasonUnregistered, push.ReasonBadToken, push.ReasonBadToken}
	for i, r := range results {
		require.Equal(t, want[i], r.Reason, "target %d: %+v", i, r)
		require.False(t, r.At.IsZero())
	}
	require.Equal(t, "404 NOT_FOUND UNREGISTERED: Requested entity was not found.", results[1].Detail)
	require.Contains(t, results[2].Detail, "not a valid FCM registration token")
	require.Equal(t, int64(3), b.Stats(t).Received, "an empty token is never sent")
}

func TestSendNoConnection(t *testing.T) {
	t.Parallel()
	// The token endpoint (fakepush) answers; FCM itself drops every
	// connection as it comes. The SDK would retry a transport error four
	// times over about seven seconds: no more connections than pushes shows
	// that the provider does not, without timing anything.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	var accepted atomic.Int64
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			c.Close()
		}
	}()
	b := setup(t, func(c *Config) { c.Endpoint = "https://" + ln.Addr().String() + "/v1" })
	ts := b.Targets(t, 2)
	results := b.Send(pushtest.Message(t, "msg_5", true), ts)
	for _, r := range results {
		require.Equal(t, push.ReasonProviderUnavailable, r.Reason)
		require.Contains(t, r.Detail, "no answer from FCM")
	}
	require.NotZero(t, accepted.Load(), "the sends reached the listener")
	require.LessOrEqual(t, accepted.Load(), int64(len(ts)), "a dropped connection is not retried")
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
	results := b.Send(pushtest.Message(t, "msg_6", true), b.Targets(t, 1))
	require.Equal(t, push.ReasonCredentialsRefused, results[0].Reason)
	require.Contains(t, results[0].Detail, "401 UNAUTHENTICATED: fetch access token")
	require.Contains(t, results[0].Detail, "account not found")
	require.ErrorContains(t, b.P.Warm(context.Background()), "fcm: warm: fetch access token")
}

func TestWarm(t *testing.T) {
	t.Parallel()

	t.Run("Warmed", func(t *testing.T) {
		t.Parallel()
		b := setup(t, func(c *Config) { c.MaxInFlight = 250 })
		require.Len(t, b.P.sends.transports, 3, "a connection per 100 in flight")
		require.NoError(t, b.P.Warm(context.Background()))
		st := b.Stats(t)
		require.Equal(t, fake.ChannelStats{Warmups: 3}, st, "one dry run per connection, and no push")
		require.Equal(t, []bool{true, true, true}, pushtest.FirstSendReused(t, b, 3))
		require.Empty(t, b.Receipts(t, ""), "a dry run delivers nothing")
	})

	t.Run("Cold", func(t *testing.T) {
		t.Parallel()
		b := setup(t, func(c *Config) { c.MaxInFlight = 100 })
		require.Equal(t, []bool{false}, pushtest.FirstSendReused(t, b, 1))
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
		{403, body(403, "PERMISSION_DENIED", "SENDER_ID_MISMATCH", "SenderId mismatch"), push.ReasonWrongApp,
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
		{401, body(401, "UNAUTHENTICATED", "", "Request had invalid authentication credentials."), push.ReasonCredentialsRefused,
			"401 UNAUTHENTICATED: Request had invalid authentication credentials."},
		{403, body(403, "PERMISSION_DENIED", "", "Permission 'cloudmessaging.messages.create' denied"), push.ReasonCredentialsRefused,
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
	r := classify(context.DeadlineExceeded, time.Now())
	require.Equal(t, push.ReasonProviderUnavailable, r.Reason)
	require.Equal(t, "timeout", r.Detail, "the error's class, never its text")
	require.True(t, r.Unanswered)
	r = classify(fmt.Errorf("exactly one of token, topic or condition must be specified"), time.Now())
	require.Equal(t, push.ReasonInternal, r.Reason, "the SDK refused the message before sending it")
	require.False(t, r.Unanswered)
}

// TestRichPayload follows every field of a payload to fakepush: each
// arrives in the FCM v1 message field Google documents, and the message's
// TTL as android.ttl, apns-expiration and the Web Push TTL.
func TestRichPayload(t *testing.T) {
	t.Parallel()
	b := setup(t)
	m := pushtest.NewContentMessage(t, "msg_rich", pushtest.RichContent(), time.Hour)
	got := b.SendDetailed(t, m)
	android := got.Body["android"].(map[string]any)
	require.Contains(t, []any{"3600s", "3599s"}, android["ttl"], "the message's TTL reaches FCM")
	delete(android, "ttl")
	apnsHeaders := got.Body["apns"].(map[string]any)["headers"].(map[string]any)
	require.Equal(t, fmt.Sprint(m.ExpiresAt.Unix()), apnsHeaders["apns-expiration"])
	webHeaders := got.Body["webpush"].(map[string]any)["headers"].(map[string]any)
	require.Contains(t, []any{"3600", "3599"}, webHeaders["TTL"])
	delete(webHeaders, "TTL")
	delete(got.Body, "token")
	require.Equal(t, pushtest.JSON(t, `{
		"data": {"room": "blue", "url": "https://app.example.com/standup/42", "herald_message_id": "msg_rich"},
		"notification": {"title": "Standup", "body": "In five minutes", "image": "https://cdn.example.com/standup.png"},
		"android": {
			"priority": "high",
			"notification": {
				"tag": "standup", "channel_id": "meetings", "color": "#ff8800", "icon": "ic_meeting",
				"sound": "chime.caf", "notification_count": 7, "click_action": "MEETING"
			}
		},
		"apns": {
			"headers": {"apns-collapse-id": "msg_rich", "apns-priority": "5", "apns-expiration": "`+fmt.Sprint(m.ExpiresAt.Unix())+`"},
			"payload": {"aps": {"mutable-content": 1}},
			"fcm_options": {"image": "https://cdn.example.com/standup.png"}
		},
		"webpush": {"headers": {"Urgency": "low", "Topic": "msg_rich"}}
	}`), got.Body)

	t.Run("Silent", func(t *testing.T) {
		t.Parallel()
		m := pushtest.NewContentMessage(t, "msg_silent", pushtest.SilentContent(), time.Hour)
		got := b.SendDetailed(t, m)
		require.NotContains(t, got.Body, "notification", "a silent message is data only")
		require.NotContains(t, got.Body["android"], "notification")
		require.NotContains(t, got.Body["android"], "collapse_key", "collapsible only when fcm.tag asks")
		require.Equal(t, map[string]any{"sync": "inbox", "url": "https://app.example.com/inbox", "herald_message_id": "msg_silent"}, got.Body["data"])
		apnsHeaders := got.Body["apns"].(map[string]any)["headers"].(map[string]any)
		require.Equal(t, "background", apnsHeaders["apns-push-type"])
		require.Equal(t, "5", apnsHeaders["apns-priority"])
		require.Equal(t, map[string]any{"aps": map[string]any{"content-available": 1.0}}, got.Body["apns"].(map[string]any)["payload"])
	})
}

func TestThrottleOf(t *testing.T) {
	t.Parallel()
	const (
		project = `{"error":{"code":429,"status":"RESOURCE_EXHAUSTED","details":[{"@type":"type.googleapis.com/google.firebase.fcm.v1.FcmError","errorCode":"QUOTA_EXCEEDED"}]}}`
		device  = `{"error":{"code":429,"status":"RESOURCE_EXHAUSTED","details":[{"@type":"type.googleapis.com/google.firebase.fcm.v1.FcmError","errorCode":"QUOTA_EXCEEDED"},` +
			`{"@type":"type.googleapis.com/google.rpc.QuotaFailure","violations":[{"subject":"device","description":"Device message rate exceeded."}]}]}}`
		unavailable = `{"error":{"code":503,"status":"UNAVAILABLE","details":[{"@type":"type.googleapis.com/google.firebase.fcm.v1.FcmError","errorCode":"UNAVAILABLE"}]}}`
	)
	for _, tc := range []struct {
		name       string
		body       string
		retryAfter time.Duration
		want       time.Duration
		device     bool
	}{
		{"the project's rate: at least a minute", project, 3 * time.Second, time.Minute, false},
		{"the project's rate: a longer Retry-After holds", project, 2 * time.Minute, 2 * time.Minute, false},
		{"one device's rate", device, 3 * time.Second, 3 * time.Second, true},
		{"one device's rate without Retry-After backs off", device, 0, 0, true},
		{"unavailable: its Retry-After", unavailable, 5 * time.Second, 5 * time.Second, false},
		{"not Google's body", `<html>`, 0, 0, false},
	} {
		got, device := throttleOf([]byte(tc.body), tc.retryAfter)
		require.Equal(t, tc.want, got, tc.name)
		require.Equal(t, tc.device, device, tc.name)
	}
}

// dataOnly is a payload of data alone, neither silent nor showing anything.
func dataOnly() push.Content {
	return push.Content{Data: map[string]string{"sync": "inbox"}}
}

// TestDataOnlyGoesToAppleAsABackgroundPush: a payload of data alone,
// urgent, is a data message, which Firebase takes for Apple devices only at
// apns-priority 5: no notification block (an empty one would make it a
// notification that shows nothing), and APNs' background push,
// content-available alone. Android still gets it at high priority.
func TestDataOnlyGoesToAppleAsABackgroundPush(t *testing.T) {
	t.Parallel()
	b := setup(t)
	m, err := push.NewMessage("msg_data", true, dataOnly(), time.Now().Add(time.Hour))
	require.NoError(t, err)
	got := b.SendDetailed(t, m)
	require.NotContains(t, got.Body, "notification")
	android := got.Body["android"].(map[string]any)
	require.Equal(t, "high", android["priority"])
	require.NotContains(t, android, "notification")
	apns := got.Body["apns"].(map[string]any)
	headers := apns["headers"].(map[string]any)
	require.Equal(t, "5", headers["apns-priority"])
	require.Equal(t, "background", headers["apns-push-type"])
	require.Equal(t, map[string]any{"aps": map[string]any{"content-available": 1.0}}, apns["payload"])
}

// TestImageReachesAppleDevices: an image goes to Apple devices through FCM
// as apns.fcm_options.image with mutable-content, which lets the app's
// notification service extension fetch it; notification.image alone
// reaches Android only.
func TestImageReachesAppleDevices(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := push.Content{Title: "Standup", Image: "https://cdn.example.com/standup.png"}
	got := b.SendDetailed(t, pushtest.NewContentMessage(t, "msg_image", c, time.Hour))
	require.Equal(t, map[string]any{"title": "Standup", "image": c.Image}, got.Body["notification"])
	apns := got.Body["apns"].(map[string]any)
	require.Equal(t, map[string]any{"image": c.Image}, apns["fcm_options"])
	require.Equal(t, map[string]any{"aps": map[string]any{"mutable-content": 1.0}}, apns["payload"])
}

// TestCollapseKeyOnlyWhereAsked: no message carries a collapse key of its
// own id. FCM keeps at most four collapse keys for an offline device, so a
// device offline for more than four data messages would keep an arbitrary
// four of them; Firebase ignores the key on notifications, whose second
// copy folds on their tag. A data message collapses only under the
// fcm.tag its caller gave.
func TestCollapseKeyOnlyWhereAsked(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tagged := dataOnly()
	tagged.FCM = &push.FCMOptions{Tag: "inbox"}
	for _, tc := range []struct {
		id          string
		content     push.Content
		collapseKey any // nil: none
		tag         any
	}{
		{"msg_notification", push.Content{Title: "Reminder"}, nil, "msg_notification"},
		{"msg_silent", pushtest.SilentContent(), nil, nil},
		{"msg_data", dataOnly(), nil, nil},
		{"msg_tagged", tagged, "inbox", nil},
	} {
		got := b.SendDetailed(t, pushtest.NewContentMessage(t, tc.id, tc.content, time.Hour))
		android := got.Body["android"].(map[string]any)
		require.Equal(t, tc.collapseKey, android["collapse_key"], tc.id)
		var tag any
		if n, ok := android["notification"].(map[string]any); ok {
			tag = n["tag"]
		}
		require.Equal(t, tc.tag, tag, tc.id)
	}
}

// TestTTLAtMostFourWeeks: a message of the longest lifetime sent a moment
// before its time still goes with a TTL FCM takes, four weeks, not the
// second over it that rounding up would make.
func TestTTLAtMostFourWeeks(t *testing.T) {
	t.Parallel()
	b := setup(t)
	m, err := push.NewMessage("msg_long", false, push.Content{Title: "Renew"}, time.Now().Add(28*24*time.Hour+500*time.Millisecond))
	require.NoError(t, err)
	got := b.SendDetailed(t, m)
	require.Equal(t, "2419200s", got.Body["android"].(map[string]any)["ttl"])
}

// drawnByApp is the rich payload asking for data-only delivery.
func drawnByApp() push.Content {
	c := pushtest.RichContent()
	f := *c.FCM
	f.DataOnly = true
	c.FCM = &f
	return c
}

// TestMessageDrawnByApp maps a message that asks for data-only delivery:
// on Android a data message (no notification block, no
// android.notification) at the message's priority, collapsible only under
// fcm.tag; on Apple devices the alert the apns block carries itself.
func TestMessageDrawnByApp(t *testing.T) {
	t.Parallel()
	p := &Provider{}
	plain := push.Content{Title: "Hi", Body: "there", FCM: &push.FCMOptions{DataOnly: true}}
	imageOnly := push.Content{Image: "https://cdn.example.com/a.png", FCM: &push.FCMOptions{DataOnly: true}}
	for _, tc := range []struct {
		name            string
		content         push.Content
		urgent          bool
		androidPriority string
		collapseKey     string
		apnsPriority    string
		alert           *messaging.ApsAlert
		apnsImage       string
	}{
		{"urgent", plain, true, "high", "", "10", &messaging.ApsAlert{Title: "Hi", Body: "there"}, ""},
		{"normal: Doze may hold it", plain, false, "normal", "", "5", &messaging.ApsAlert{Title: "Hi", Body: "there"}, ""},
		{"android_priority overrides", drawnByApp(), false, "high", "standup", "5", &messaging.ApsAlert{Title: "Standup", Body: "In five minutes"}, "https://cdn.example.com/standup.png"},
		{"no title or body: no alert", imageOnly, false, "normal", "", "5", nil, "https://cdn.example.com/a.png"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			m, err := push.NewMessage("msg_d", tc.urgent, tc.content, time.Now().Add(time.Hour))
			require.NoError(t, err)
			msg := p.message(m, time.Now())
			require.Nil(t, msg.Notification, "no notification block: Android hands it to the app")
			require.Nil(t, msg.Android.Notification)
			require.Equal(t, tc.androidPriority, msg.Android.Priority)
			require.Equal(t, tc.collapseKey, msg.Android.CollapseKey)
			require.Equal(t, m.FCMData, msg.Data)
			require.Equal(t, tc.content.Title, msg.Data["title"], "the display fields are in the data")
			require.Equal(t, tc.apnsPriority, msg.APNS.Headers["apns-priority"])
			require.Empty(t, msg.APNS.Headers["apns-push-type"], "an alert to Apple devices, not a background push")
			require.Equal(t, &messaging.Aps{Alert: tc.alert, MutableContent: true}, msg.APNS.Payload.Aps)
			if tc.apnsImage == "" {
				require.Nil(t, msg.APNS.FCMOptions)
			} else {
				require.Equal(t, tc.apnsImage, msg.APNS.FCMOptions.ImageURL)
			}
		})
	}
}

// TestDataOnlyReachesFakepush follows a rich payload that asks for
// data-only delivery through the Firebase SDK to fakepush: the message FCM
// received has no notification block and no android.notification, carries
// every display field in its data beside the receipt, and still has an
// alert for Apple devices.
func TestDataOnlyReachesFakepush(t *testing.T) {
	t.Parallel()
	b := setup(t)
	m := pushtest.NewContentMessage(t, "msg_drawn", drawnByApp(), time.Hour)
	targets := b.Targets(t, 1)
	targets[0].Receipt = "AQG-receipt"
	require.True(t, b.Send(m, targets)[0].Accepted)
	rs := b.DetailedReceipts(t, m.ID)
	require.Len(t, rs, 1)
	var got map[string]any
	require.NoError(t, json.Unmarshal(rs[0].Body, &got))

	android := got["android"].(map[string]any)
	require.Contains(t, []any{"3600s", "3599s"}, android["ttl"])
	delete(android, "ttl")
	apnsHeaders := got["apns"].(map[string]any)["headers"].(map[string]any)
	require.Equal(t, fmt.Sprint(m.ExpiresAt.Unix()), apnsHeaders["apns-expiration"])
	delete(apnsHeaders, "apns-expiration")
	delete(got["webpush"].(map[string]any)["headers"].(map[string]any), "TTL")
	delete(got, "token")
	require.Equal(t, pushtest.JSON(t, `{
		"data": {
			"room": "blue", "url": "https://app.example.com/standup/42",
			"title": "Standup", "subtitle": "Team Blue", "body": "In five minutes",
			"image": "https://cdn.example.com/standup.png", "sound": "chime.caf", "badge": "7", "category": "MEETING",
			"tag": "standup", "android_channel_id": "meetings", "color": "#ff8800", "icon": "ic_meeting",
			"herald_message_id": "msg_drawn", "herald_receipt": "AQG-receipt"
		},
		"android": {"priority": "high", "collapse_key": "standup"},
		"apns": {
			"headers": {"apns-collapse-id": "msg_drawn", "apns-priority": "5"},
			"payload": {"aps": {"alert": {"title": "Standup", "body": "In five minutes"}, "mutable-content": 1}},
			"fcm_options": {"image": "https://cdn.example.com/standup.png"}
		},
		"webpush": {"headers": {"Urgency": "low", "Topic": "msg_drawn"}}
	}`), got)
}

// TestDataOnlyUrgentReachesApple: FCM takes a data message to Apple devices
// only at apns-priority 5 (fakepush refuses it at 10, as Firebase does); an
// urgent message drawn by the app on Android carries its own alert for
// Apple, so it goes at 10.
func TestDataOnlyUrgentReachesApple(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := push.Content{Title: "Now", FCM: &push.FCMOptions{DataOnly: true}}
	m, err := push.NewMessage("msg_drawn_urgent", true, c, time.Now().Add(time.Hour))
	require.NoError(t, err)
	got := b.SendDetailed(t, m)
	require.NotContains(t, got.Body, "notification")
	apns := got.Body["apns"].(map[string]any)
	require.Equal(t, "10", apns["headers"].(map[string]any)["apns-priority"])
	require.Equal(t, map[string]any{"alert": map[string]any{"title": "Now"}, "mutable-content": 1.0}, apns["payload"].(map[string]any)["aps"])
}
