package fake

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"errors"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	firebase "firebase.google.com/go/v4"
	"firebase.google.com/go/v4/errorutils"
	"firebase.google.com/go/v4/messaging"
	"github.com/stretchr/testify/require"
	"google.golang.org/api/option"
)

const fcmToken = "cJ3xY0Zk:APA91bHuN2d0example-token_value"

func TestFCMAccepts(t *testing.T) {
	t.Parallel()
	b := setup(t)
	client := b.fcmClient(t, "")
	ttl := 90 * time.Second

	name, err := client.Send(context.Background(), &messaging.Message{
		Token:        fcmToken,
		Data:         map[string]string{"herald_message_id": "msg_1", "kind": "reminder"},
		Notification: &messaging.Notification{Title: "Hi", Body: "there"},
		Android:      &messaging.AndroidConfig{CollapseKey: "msg_1", Priority: "high", TTL: &ttl},
	})
	require.NoError(t, err)
	require.Regexp(t, `^projects/herald-fake/messages/0:\d+%[0-9a-f]+$`, name)

	receipts := b.srv.Receipts("msg_1")
	require.Len(t, receipts, 1)
	require.Equal(t, Receipt{Channel: "fcm", Token: fcmToken, App: DefaultApp, KeyID: b.srv.creds.fcmKeyID,
		CollapseKey: "msg_1", ReceivedAt: receipts[0].ReceivedAt}, receipts[0])

	// A dry run is validated and answered, not delivered.
	name, err = client.SendDryRun(context.Background(), &messaging.Message{Token: fcmToken, Data: map[string]string{"herald_message_id": "msg_2"}})
	require.NoError(t, err)
	require.Equal(t, "projects/herald-fake/messages/fake_message_id", name)
	require.Empty(t, b.srv.Receipts("msg_2"))
	require.Equal(t, ChannelStats{Received: 1, Accepted: 1, Warmups: 1}, b.stats(t).FCM, "a dry run is a warm-up, not a push")
}

func TestFCMRejectsLikeFCM(t *testing.T) {
	t.Parallel()
	b := setup(t)
	client := b.fcmClient(t, "")
	tests := []struct {
		name  string
		msg   *messaging.Message
		check func(error) bool
	}{
		{name: "dead token", msg: &messaging.Message{Token: "dead" + fcmToken}, check: messaging.IsUnregistered},
		{name: "malformed token", msg: &messaging.Message{Token: "has spaces and /slashes"}, check: messaging.IsInvalidArgument},
		{name: "reserved data key", msg: &messaging.Message{Token: fcmToken, Data: map[string]string{"from": "x"}}, check: messaging.IsInvalidArgument},
		{name: "too big", msg: &messaging.Message{Token: fcmToken, Data: map[string]string{"k": strings.Repeat("x", 4100)}}, check: messaging.IsInvalidArgument},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := client.Send(context.Background(), tt.msg)
			require.Error(t, err)
			require.True(t, tt.check(err), "unexpected error: %v", err)
		})
	}

	t.Run("unregistered body", func(t *testing.T) {
		t.Parallel()
		_, err := client.Send(context.Background(), &messaging.Message{Token: "dead" + fcmToken})
		require.True(t, errorutils.IsNotFound(err))
		resp := errorutils.HTTPResponse(err)
		require.NotNil(t, resp)
		require.Equal(t, http.StatusNotFound, resp.StatusCode)
	})

	t.Run("wrong project", func(t *testing.T) {
		t.Parallel()
		_, err := b.fcmClient(t, "someone-else").Send(context.Background(), &messaging.Message{Token: fcmToken})
		require.True(t, errorutils.IsPermissionDenied(err), "unexpected error: %v", err)
	})

	t.Run("no bearer", func(t *testing.T) {
		t.Parallel()
		// With an HTTP client given, the Google transport drops the credentials
		// file silently: the request goes out without a bearer token.
		app, err := firebase.NewApp(context.Background(), &firebase.Config{ProjectID: "herald-fake"},
			option.WithAuthCredentialsFile(option.ServiceAccount, b.env[EnvFCMCredentialsFile]),
			option.WithHTTPClient(b.client), option.WithEndpoint(b.env[EnvFCMEndpoint]))
		require.NoError(t, err)
		mc, err := app.Messaging(context.Background())
		require.NoError(t, err)
		_, err = mc.Send(context.Background(), &messaging.Message{Token: fcmToken})
		require.True(t, errorutils.IsUnauthenticated(err), "unexpected error: %v", err)
	})
}

// TestFCMRawRequests covers what the SDK's types cannot express.
func TestFCMRawRequests(t *testing.T) {
	t.Parallel()
	b := setup(t)
	access := b.accessToken(t)
	send := "/v1/projects/herald-fake/messages:send"
	tests := []struct {
		name, path, bearer, body string
		status                   int
		message                  string
	}{
		{name: "data value not a string", body: `{"message":{"token":"t1","data":{"n":1}}}`, status: 400, message: "Invalid value at 'message.data[0].value' (TYPE_STRING), 1"},
		{name: "bad ttl", body: `{"message":{"token":"t1","android":{"ttl":"30"}}}`, status: 400, message: "message.android.ttl"},
		{name: "fractional ttl", body: `{"message":{"token":"t1","android":{"ttl":"3.5s"}}}`, status: 200},
		{name: "camelCase names", body: `{"validateOnly":true,"message":{"token":"t1","android":{"collapseKey":"c","directBootOk":true}}}`, status: 200},
		{name: "unknown field", body: `{"message":{"token":"t1","colour":"red"}}`, status: 400, message: `Unknown name "colour"`},
		{name: "no target", body: `{"message":{"data":{"a":"b"}}}`, status: 400, message: "Recipient of the message is not set."},
		{name: "two targets", body: `{"message":{"token":"t1","topic":"news"}}`, status: 400, message: "Exactly one of token, topic or condition"},
		{name: "not JSON", body: `{"message":`, status: 400, message: "Invalid JSON payload"},
		{name: "android not an object", body: `{"message":{"token":"t1","android":"x"}}`, status: 400, message: "message.android"},
		{name: "bool not a bool", body: `{"validate_only":"yes","message":{"token":"t1"}}`, status: 400, message: "TYPE_BOOL"},
		{name: "names are case-sensitive", body: `{"Message":{"token":"t1"}}`, status: 400, message: `Unknown name "Message"`},
		{name: "null is absent", body: `{"message":{"token":"t1","android":null,"data":null}}`, status: 200},
		{name: "bad priority", body: `{"message":{"token":"t1","android":{"priority":"urgent"}}}`, status: 400, message: "message.android.priority"},
		{name: "notification title not a string", body: `{"message":{"token":"t1","notification":{"title":1}}}`, status: 400, message: "message.notification.title"},
		{name: "unknown notification field", body: `{"message":{"token":"t1","notification":{"subtitle":"s"}}}`, status: 400, message: `Unknown name "subtitle" at 'message.notification'`},
		{name: "color not #rrggbb", body: `{"message":{"token":"t1","android":{"notification":{"color":"orange"}}}}`, status: 400, message: "message.android.notification.color"},
		{name: "notification_count not an integer", body: `{"message":{"token":"t1","android":{"notification":{"notification_count":"7"}}}}`, status: 400, message: "message.android.notification.notification_count"},
		{name: "unknown android notification field", body: `{"message":{"token":"t1","android":{"notification":{"badge":7}}}}`, status: 400, message: `Unknown name "badge" at 'message.android.notification'`},
		{name: "bad visibility", body: `{"message":{"token":"t1","android":{"notification":{"visibility":"HIDDEN"}}}}`, status: 400, message: "message.android.notification.visibility"},
		{name: "bad web push urgency", body: `{"message":{"token":"t1","webpush":{"headers":{"Urgency":"urgent"}}}}`, status: 400, message: "Urgency"},
		{name: "web push header not a string", body: `{"message":{"token":"t1","webpush":{"headers":{"TTL":60}}}}`, status: 400, message: "message.webpush.headers"},
		{name: "web push link not https", body: `{"message":{"token":"t1","webpush":{"fcm_options":{"link":"http://x"}}}}`, status: 400, message: "https"},
		{name: "apns background without content-available", body: `{"message":{"token":"t1","apns":{"headers":{"apns-push-type":"background","apns-priority":"5"}}}}`, status: 400, message: "InvalidPushType"},
		{name: "apns background at priority 10", body: `{"message":{"token":"t1","apns":{"headers":{"apns-push-type":"background"},"payload":{"aps":{"content-available":1}}}}}`, status: 400, message: "BadPriority"},
		{name: "apns background", body: `{"message":{"token":"t1","apns":{"headers":{"apns-push-type":"background","apns-priority":"5"},"payload":{"aps":{"content-available":1}}}}}`, status: 200},
		{name: "rich android notification", body: `{"message":{"token":"t1","notification":{"title":"t","image":"https://x/i.png"},"android":{"notification":{"color":"#ff8800","notification_count":3,"channel_id":"c","visibility":"PUBLIC"}}}}`, status: 200},
		{name: "expired or forged bearer", bearer: "ya29.fake-AAAAAAAAAAAAAAAAAAAAAA.AAAAAAAAAAAAAAAAAAAAAA", body: `{"message":{"token":"t1"}}`, status: 401, message: "invalid authentication credentials"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			bearer := tt.bearer
			if bearer == "" {
				bearer = access
			}
			req, err := http.NewRequest(http.MethodPost, b.srv.URL()+send, strings.NewReader(tt.body))
			require.NoError(t, err)
			req.Header.Set("Authorization", "Bearer "+bearer)
			resp, err := b.client.Do(req)
			require.NoError(t, err)
			defer resp.Body.Close()
			require.Equal(t, tt.status, resp.StatusCode)
			if tt.status == http.StatusOK {
				return
			}
			var body struct {
				Error struct {
					Code    int
					Message string
					Status  string
					Details []map[string]string
				}
			}
			require.NoError(t, jsonDecode(resp.Body, &body))
			require.Equal(t, tt.status, body.Error.Code)
			require.Contains(t, body.Error.Message, tt.message)
			if tt.status == http.StatusBadRequest {
				require.Equal(t, "INVALID_ARGUMENT", body.Error.Status)
				require.Equal(t, []map[string]string{{"@type": fcmErrorType, "errorCode": "INVALID_ARGUMENT"}}, body.Error.Details)
			}
		})
	}
}

// TestFCMTokenEndpoint checks the OAuth JWT-bearer exchange against assertions
// the Google client libraries would never make.
func TestFCMTokenEndpoint(t *testing.T) {
	t.Parallel()
	b := setup(t)
	key := b.srv.creds.fcmKey
	otherKey, err := rsa.GenerateKey(rand.Reader, 2048)
	require.NoError(t, err)
	iss := b.srv.creds.clientEmail("herald-fake")
	aud := b.srv.URL() + "/token"
	now := time.Now().Unix()
	scope := "https://www.googleapis.com/auth/firebase.messaging"
	claims := func(edit func(map[string]any)) map[string]any {
		c := map[string]any{"iss": iss, "aud": aud, "scope": scope, "iat": now, "exp": now + 3600}
		if edit != nil {
			edit(c)
		}
		return c
	}
	tests := []struct {
		name, grant, assertion, errCode string
	}{
		{name: "valid", assertion: signJWT(t, key, nil, claims(nil))},
		{name: "wrong grant type", grant: "client_credentials", assertion: signJWT(t, key, nil, claims(nil)), errCode: "unsupported_grant_type"},
		{name: "signed by another key", assertion: signJWT(t, otherKey, nil, claims(nil)), errCode: "invalid_grant"},
		{name: "wrong audience", assertion: signJWT(t, key, nil, claims(func(c map[string]any) { c["aud"] = "https://oauth2.googleapis.com/token" })), errCode: "invalid_grant"},
		{name: "wrong issuer", assertion: signJWT(t, key, nil, claims(func(c map[string]any) { c["iss"] = "x@y.iam.gserviceaccount.com" })), errCode: "invalid_grant"},
		{name: "expired", assertion: signJWT(t, key, nil, claims(func(c map[string]any) { c["iat"], c["exp"] = now-7200, now-3600 })), errCode: "invalid_grant"},
		{name: "no FCM scope", assertion: signJWT(t, key, nil, claims(func(c map[string]any) { c["scope"] = "email" })), errCode: "invalid_scope"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			grant := tt.grant
			if grant == "" {
				grant = jwtBearerGrantType
			}
			resp, err := b.client.PostForm(aud, url.Values{"grant_type": {grant}, "assertion": {tt.assertion}})
			require.NoError(t, err)
			defer resp.Body.Close()
			var body struct {
				AccessToken string `json:"access_token"`
				TokenType   string `json:"token_type"`
				ExpiresIn   int    `json:"expires_in"`
				Error       string `json:"error"`
			}
			require.NoError(t, jsonDecode(resp.Body, &body))
			if tt.errCode != "" {
				require.Equal(t, http.StatusBadRequest, resp.StatusCode)
				require.Equal(t, tt.errCode, body.Error)
				return
			}
			require.Equal(t, http.StatusOK, resp.StatusCode)
			require.Equal(t, "Bearer", body.TokenType)
			require.Equal(t, 3600, body.ExpiresIn)
			require.True(t, b.srv.checkAccessToken("Bearer "+body.AccessToken))
		})
	}
}

// accessToken trades a fresh assertion for an access token.
func (b *bundle) accessToken(t testing.TB) string {
	t.Helper()
	now := time.Now().Unix()
	assertion := signJWT(t, b.srv.creds.fcmKey, nil, map[string]any{
		"iss": b.srv.creds.clientEmail("herald-fake"), "aud": b.srv.URL() + "/token",
		"scope": "https://www.googleapis.com/auth/firebase.messaging", "iat": now, "exp": now + 3600,
	})
	resp, err := b.client.PostForm(b.srv.URL()+"/token", url.Values{"grant_type": {jwtBearerGrantType}, "assertion": {assertion}})
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	var body struct {
		AccessToken string `json:"access_token"`
	}
	require.NoError(t, jsonDecode(resp.Body, &body))
	return body.AccessToken
}

// TestFCMSDKRetriesUnavailable documents a behaviour Herald's FCM provider must
// plan for: the SDK retries a 503 by itself (immediately, then after 1, 2 and 4
// seconds), and the only way to bound that is the context deadline.
func TestFCMSDKRetriesUnavailable(t *testing.T) {
	t.Parallel()
	b := setup(t)
	client := b.fcmClient(t, "")
	require.NoError(t, b.srv.SetControl(Control{Channel: "fcm", Mode: ModeUnavailable}))

	ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancel()
	_, err := client.Send(ctx, &messaging.Message{Token: fcmToken})
	require.Error(t, err)
	require.True(t, errors.Is(err, context.DeadlineExceeded) || strings.Contains(err.Error(), "deadline"), "got %v", err)
	st := b.srv.Stats().FCM
	require.GreaterOrEqual(t, st.Received, int64(3), "one send became several requests")
	require.Equal(t, st.Received, st.Rejected)
}

// TestFCMStrictAsFirebase: what Firebase refuses of a message for Apple
// devices and of its lifetime, fakepush refuses too, with 400
// INVALID_ARGUMENT naming the field, and takes what Firebase takes beside
// it: a data message goes to Apple only at apns-priority 5, android.ttl is
// at most four weeks, apns-collapse-id at most Apple's 64 bytes, and the
// image for Apple devices (apns.fcm_options.image) an https URL.
func TestFCMStrictAsFirebase(t *testing.T) {
	t.Parallel()
	b := setup(t)
	client := b.fcmClient(t, "")
	apnsAt := func(priority string) *messaging.APNSConfig {
		return &messaging.APNSConfig{Headers: map[string]string{"apns-priority": priority}}
	}
	ttl := func(d time.Duration) *messaging.AndroidConfig { return &messaging.AndroidConfig{TTL: &d} }
	data := map[string]string{"sync": "inbox"}
	tests := []struct {
		name  string
		msg   messaging.Message
		field string // empty: accepted
	}{
		{name: "data message at apns-priority 10", msg: messaging.Message{Data: data, APNS: apnsAt("10")}, field: "message.apns.headers"},
		{name: "data message with an empty notification at apns-priority 10", msg: messaging.Message{Data: data, Notification: &messaging.Notification{}, APNS: apnsAt("10")}, field: "message.apns.headers"},
		{name: "data message at apns-priority 5", msg: messaging.Message{Data: data, APNS: apnsAt("5")}},
		{name: "data message without apns-priority", msg: messaging.Message{Data: data}},
		{name: "notification at apns-priority 10", msg: messaging.Message{Data: data, Notification: &messaging.Notification{Title: "Hi"}, APNS: apnsAt("10")}},
		{name: "ttl over four weeks", msg: messaging.Message{Android: ttl(28*24*time.Hour + time.Second)}, field: "message.android.ttl"},
		{name: "ttl a fraction over four weeks", msg: messaging.Message{Android: ttl(28*24*time.Hour + time.Millisecond)}, field: "message.android.ttl"},
		{name: "ttl of four weeks", msg: messaging.Message{Android: ttl(28 * 24 * time.Hour)}},
		{name: "apns-collapse-id over 64 bytes", msg: messaging.Message{APNS: &messaging.APNSConfig{Headers: map[string]string{"apns-collapse-id": strings.Repeat("c", 65)}}}, field: "message.apns.headers"},
		{name: "apns-collapse-id of 64 bytes", msg: messaging.Message{APNS: &messaging.APNSConfig{Headers: map[string]string{"apns-collapse-id": strings.Repeat("c", 64)}}}},
		{name: "apns image not https", msg: messaging.Message{APNS: &messaging.APNSConfig{FCMOptions: &messaging.APNSFCMOptions{ImageURL: "http://cdn.example.com/a.png"}}}, field: "message.apns.fcm_options.image"},
		{name: "apns image", msg: messaging.Message{
			Notification: &messaging.Notification{Title: "Hi"},
			APNS: &messaging.APNSConfig{
				FCMOptions: &messaging.APNSFCMOptions{ImageURL: "https://cdn.example.com/a.png"},
				Payload:    &messaging.APNSPayload{Aps: &messaging.Aps{MutableContent: true}},
			},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			msg := tt.msg
			msg.Token = fcmToken
			_, err := client.Send(context.Background(), &msg)
			if tt.field == "" {
				require.NoError(t, err)
				return
			}
			require.True(t, messaging.IsInvalidArgument(err), "unexpected error: %v", err)
			require.Equal(t, http.StatusBadRequest, errorutils.HTTPResponse(err).StatusCode)
			require.ErrorContains(t, err, tt.field)
		})
	}
}
