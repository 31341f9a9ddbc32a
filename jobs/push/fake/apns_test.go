package fake

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sideshow/apns2"
	"github.com/stretchr/testify/require"
)

const apnsToken = "a0b1c2d3e4f5a6b7c8d9e0f1a2b3c4d5e6f7a8b9c0d1e2f3a4b5c6d7e8f9a0b1"

func TestAPNsAccepts(t *testing.T) {
	t.Parallel()
	b := setup(t)
	client := b.apnsClient(t)

	res, err := client.Push(&apns2.Notification{
		DeviceToken: apnsToken,
		Topic:       b.env[EnvAPNsTopic],
		ApnsID:      "0b4e2a9c-8e4a-4c3b-9f2d-7a1b2c3d4e5f",
		CollapseID:  "msg_1",
		Priority:    apns2.PriorityHigh,
		Expiration:  time.Now().Add(time.Hour),
		PushType:    apns2.PushTypeAlert,
		Payload:     []byte(`{"aps":{"alert":{"title":"Hi","body":"there"}},"herald_message_id":"msg_1"}`),
	})
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, res.StatusCode, res.Reason)
	require.Equal(t, "0b4e2a9c-8e4a-4c3b-9f2d-7a1b2c3d4e5f", res.ApnsID, "apns-id is echoed")

	// Without an apns-id, APNs makes one up.
	res, err = client.Push(&apns2.Notification{DeviceToken: apnsToken, Topic: b.env[EnvAPNsTopic], Payload: []byte(`{"aps":{}}`)})
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, res.StatusCode)
	require.True(t, isCanonicalUUID(res.ApnsID), res.ApnsID)

	receipts := b.srv.Receipts("msg_1")
	require.Len(t, receipts, 1)
	require.Equal(t, "apns", receipts[0].Channel)
	require.Equal(t, apnsToken, receipts[0].Token)
	require.Equal(t, "msg_1", receipts[0].CollapseKey)
	require.WithinDuration(t, time.Now(), receipts[0].ReceivedAt, 5*time.Second)
	require.Equal(t, ChannelStats{Received: 2, Accepted: 2}, b.stats(t).APNs)
}

func TestAPNsRejectsLikeApple(t *testing.T) {
	t.Parallel()
	b := setup(t)
	topic := b.env[EnvAPNsTopic]
	otherKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	own := b.srv.creds.apnsKey
	kid, team := b.env[EnvAPNsKeyID], b.env[EnvAPNsTeamID]
	now := time.Now().Unix()

	ok := func() *apns2.Notification {
		return &apns2.Notification{DeviceToken: apnsToken, Topic: topic, Payload: []byte(`{"aps":{"alert":"x"}}`)}
	}
	tests := []struct {
		name   string
		bearer string // a hand-made provider token; empty uses the SDK's own
		noAuth bool
		edit   func(n *apns2.Notification)
		status int
		reason string
	}{
		{name: "dead token", edit: func(n *apns2.Notification) { n.DeviceToken = "dead" + apnsToken[4:] }, status: 410, reason: apns2.ReasonUnregistered},
		{name: "non-hex token", edit: func(n *apns2.Notification) { n.DeviceToken = "not-a-hex-token" }, status: 400, reason: apns2.ReasonBadDeviceToken},
		{name: "wrong topic", edit: func(n *apns2.Notification) { n.Topic = "com.example.other" }, status: 400, reason: apns2.ReasonTopicDisallowed},
		{name: "missing topic", edit: func(n *apns2.Notification) { n.Topic = "" }, status: 400, reason: apns2.ReasonMissingTopic},
		{name: "voip needs .voip topic", edit: func(n *apns2.Notification) { n.PushType = apns2.PushTypeVOIP }, status: 400, reason: apns2.ReasonTopicDisallowed},
		{name: "unknown push type", edit: func(n *apns2.Notification) { n.PushType = "shout" }, status: 400, reason: "InvalidPushType"},
		{name: "oversize payload", edit: func(n *apns2.Notification) {
			n.Payload = []byte(`{"aps":{"alert":"` + strings.Repeat("x", 4096) + `"}}`)
		}, status: 413, reason: apns2.ReasonPayloadTooLarge},
		{name: "payload without aps", edit: func(n *apns2.Notification) { n.Payload = []byte(`{"alert":"x"}`) }, status: 400, reason: "BadPayload"},
		{name: "long collapse id", edit: func(n *apns2.Notification) { n.CollapseID = strings.Repeat("c", 65) }, status: 400, reason: apns2.ReasonBadCollapseID},
		{name: "bad priority", edit: func(n *apns2.Notification) { n.Priority = 7 }, status: 400, reason: apns2.ReasonBadPriority},
		{name: "bad apns-id", edit: func(n *apns2.Notification) { n.ApnsID = "not-a-uuid" }, status: 400, reason: apns2.ReasonBadMessageID},
		{name: "missing provider token", noAuth: true, status: 403, reason: apns2.ReasonMissingProviderToken},
		{name: "token signed by another key", bearer: signJWT(t, otherKey, map[string]any{"kid": kid}, map[string]any{"iss": team, "iat": now}), status: 403, reason: apns2.ReasonInvalidProviderToken},
		{name: "token with wrong kid", bearer: signJWT(t, own, map[string]any{"kid": "ABCDEFGHIJ"}, map[string]any{"iss": team, "iat": now}), status: 403, reason: apns2.ReasonInvalidProviderToken},
		{name: "token with wrong team", bearer: signJWT(t, own, map[string]any{"kid": kid}, map[string]any{"iss": "ABCDEFGHIJ", "iat": now}), status: 403, reason: apns2.ReasonInvalidProviderToken},
		{name: "token older than an hour", bearer: signJWT(t, own, map[string]any{"kid": kid}, map[string]any{"iss": team, "iat": now - 3700}), status: 403, reason: apns2.ReasonExpiredProviderToken},
		{name: "garbage token", bearer: "not.a.jwt", status: 403, reason: apns2.ReasonInvalidProviderToken},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			client := b.apnsClient(t)
			switch {
			case tt.bearer != "":
				client = b.apnsClientWithBearer(t, tt.bearer)
			case tt.noAuth:
				client.Token = nil
			}
			n := ok()
			if tt.edit != nil {
				tt.edit(n)
			}
			res, err := client.Push(n)
			require.NoError(t, err)
			require.Equal(t, tt.status, res.StatusCode)
			require.Equal(t, tt.reason, res.Reason)
			if tt.status == http.StatusGone {
				require.WithinDuration(t, time.Now(), res.Timestamp.Time, 5*time.Second, "410 carries a timestamp")
			}
		})
	}
	t.Cleanup(func() {
		st := b.srv.Stats().APNs
		require.Equal(t, ChannelStats{Received: int64(len(tests)), Rejected: int64(len(tests))}, st)
	})
}

// TestAPNsRawRequests covers what apns2 cannot send: it always marshals valid
// JSON and always uses POST on the device path.
func TestAPNsRawRequests(t *testing.T) {
	t.Parallel()
	b := setup(t)
	bearer := b.apnsClient(t).Token.GenerateIfExpired()

	tests := []struct {
		name, method, path, body, reason string
		pushType, priority               string
		status                           int
	}{
		{name: "empty payload", method: "POST", path: "/3/device/" + apnsToken, body: "", status: 400, reason: "PayloadEmpty"},
		{name: "invalid JSON", method: "POST", path: "/3/device/" + apnsToken, body: `{"aps":`, status: 400, reason: "BadPayload"},
		{name: "aps not a dictionary", method: "POST", path: "/3/device/" + apnsToken, body: `{"aps":"x"}`, status: 400, reason: "BadPayload"},
		{name: "GET", method: "GET", path: "/3/device/" + apnsToken, status: 405, reason: "MethodNotAllowed"},
		{name: "unknown path", method: "POST", path: "/3/devices/" + apnsToken, body: `{"aps":{}}`, status: 404, reason: "BadPath"},
		{name: "no token", method: "POST", path: "/3/device/", body: `{"aps":{}}`, status: 400, reason: "MissingDeviceToken"},
		{name: "badge not an integer", method: "POST", path: "/3/device/" + apnsToken, body: `{"aps":{"badge":"3"}}`, status: 400, reason: "BadPayload"},
		{name: "negative badge", method: "POST", path: "/3/device/" + apnsToken, body: `{"aps":{"badge":-1}}`, status: 400, reason: "BadPayload"},
		{name: "unknown interruption level", method: "POST", path: "/3/device/" + apnsToken, body: `{"aps":{"alert":"x","interruption-level":"urgent"}}`, status: 400, reason: "BadPayload"},
		{name: "relevance over 1", method: "POST", path: "/3/device/" + apnsToken, body: `{"aps":{"alert":"x","relevance-score":1.5}}`, status: 400, reason: "BadPayload"},
		{name: "critical volume over 1", method: "POST", path: "/3/device/" + apnsToken, body: `{"aps":{"sound":{"critical":1,"name":"a","volume":2}}}`, status: 400, reason: "BadPayload"},
		{name: "alert title not a string", method: "POST", path: "/3/device/" + apnsToken, body: `{"aps":{"alert":{"title":1}}}`, status: 400, reason: "BadPayload"},
		{name: "background with an alert", method: "POST", path: "/3/device/" + apnsToken, pushType: "background", priority: "5", body: `{"aps":{"content-available":1,"alert":"x"}}`, status: 400, reason: "InvalidPushType"},
		{name: "background with a badge", method: "POST", path: "/3/device/" + apnsToken, pushType: "background", priority: "5", body: `{"aps":{"content-available":1,"badge":1}}`, status: 400, reason: "InvalidPushType"},
		{name: "background without content-available", method: "POST", path: "/3/device/" + apnsToken, pushType: "background", priority: "5", body: `{"aps":{}}`, status: 400, reason: "InvalidPushType"},
		{name: "background at priority 10", method: "POST", path: "/3/device/" + apnsToken, pushType: "background", priority: "10", body: `{"aps":{"content-available":1}}`, status: 400, reason: "BadPriority"},
		{name: "background without priority", method: "POST", path: "/3/device/" + apnsToken, pushType: "background", body: `{"aps":{"content-available":1}}`, status: 400, reason: "BadPriority"},
		{name: "background", method: "POST", path: "/3/device/" + apnsToken, pushType: "background", priority: "5", body: `{"aps":{"content-available":1}}`, status: 200},
		{name: "rich alert", method: "POST", path: "/3/device/" + apnsToken, body: `{"aps":{"alert":{"title":"t","subtitle":"s","body":"b"},"badge":0,"sound":{"critical":1,"name":"default","volume":0.5},"interruption-level":"time-sensitive","relevance-score":1,"mutable-content":1}}`, status: 200},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			req, err := http.NewRequest(tt.method, b.srv.URL()+tt.path, strings.NewReader(tt.body))
			require.NoError(t, err)
			req.Header.Set("authorization", "bearer "+bearer)
			req.Header.Set("apns-topic", b.env[EnvAPNsTopic])
			if tt.pushType != "" {
				req.Header.Set("apns-push-type", tt.pushType)
			}
			if tt.priority != "" {
				req.Header.Set("apns-priority", tt.priority)
			}
			resp, err := b.client.Do(req)
			require.NoError(t, err)
			defer resp.Body.Close()
			require.Equal(t, 2, resp.ProtoMajor, "served over HTTP/2")
			require.Equal(t, tt.status, resp.StatusCode)
			if tt.status == http.StatusOK {
				return
			}
			var body struct{ Reason string }
			require.NoError(t, jsonDecode(resp.Body, &body))
			require.Equal(t, tt.reason, body.Reason)
		})
	}
}

func TestAPNsVoIPTopicAndLimit(t *testing.T) {
	t.Parallel()
	b := setup(t)
	res, err := b.apnsClient(t).Push(&apns2.Notification{
		DeviceToken: apnsToken,
		Topic:       b.env[EnvAPNsTopic] + ".voip",
		PushType:    apns2.PushTypeVOIP,
		// VoIP payloads may reach 5 KiB.
		Payload: []byte(`{"aps":{},"pad":"` + strings.Repeat("x", 4500) + `"}`),
	})
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, res.StatusCode, res.Reason)
}

// TestAPNsStrictAsApple: what Apple refuses of a request's headers and of
// its provider tokens, fakepush refuses too, with Apple's status and
// reason: a header repeated (400 DuplicateHeaders), a connection whose
// provider token changes within 20 minutes of the last one's issue (429
// TooManyProviderTokenUpdates), and a location push whose topic lacks
// .location-query (400 TopicDisallowed).
func TestAPNsStrictAsApple(t *testing.T) {
	t.Parallel()
	b := setup(t)
	topic := b.env[EnvAPNsTopic]
	own := b.srv.creds.apnsKey
	kid, team := b.env[EnvAPNsKeyID], b.env[EnvAPNsTeamID]
	now := time.Now().Unix()
	tokenAt := func(iat int64) string {
		return signJWT(t, own, map[string]any{"kid": kid}, map[string]any{"iss": team, "iat": iat})
	}
	notification := func() *apns2.Notification {
		return &apns2.Notification{DeviceToken: apnsToken, Topic: topic, Payload: []byte(`{"aps":{"alert":"x"}}`)}
	}

	t.Run("DuplicateHeaders", func(t *testing.T) {
		t.Parallel()
		bearer := tokenAt(now)
		for _, header := range []string{"apns-priority", "apns-topic", "apns-collapse-id", "authorization"} {
			req, err := http.NewRequest(http.MethodPost, b.srv.URL()+"/3/device/"+apnsToken, strings.NewReader(`{"aps":{"alert":"x"}}`))
			require.NoError(t, err)
			req.Header.Set("authorization", "bearer "+bearer)
			req.Header.Set("apns-topic", topic)
			req.Header.Set("apns-priority", "10")
			req.Header.Set("apns-collapse-id", "msg_1")
			req.Header.Add(header, req.Header.Get(header))
			resp, err := b.client.Do(req)
			require.NoError(t, err)
			var body struct{ Reason string }
			require.NoError(t, jsonDecode(resp.Body, &body))
			resp.Body.Close()
			require.Equal(t, http.StatusBadRequest, resp.StatusCode, header)
			require.Equal(t, "DuplicateHeaders", body.Reason, header)
		}
	})

	t.Run("TooManyProviderTokenUpdates", func(t *testing.T) {
		t.Parallel()
		// One client, one connection: its first token 25 minutes old.
		client := b.apnsClientWithBearer(t, tokenAt(now-25*60))
		push := func(bearer string) *apns2.Response {
			client.Token.Bearer = bearer
			res, err := client.Push(notification())
			require.NoError(t, err)
			return res
		}
		res := push(client.Token.Bearer)
		require.Equal(t, http.StatusOK, res.StatusCode, res.Reason)
		// Ten minutes after it: too soon.
		res = push(tokenAt(now - 15*60))
		require.Equal(t, http.StatusTooManyRequests, res.StatusCode)
		require.Equal(t, apns2.ReasonTooManyProviderTokenUpdates, res.Reason)
		// Twenty-five minutes after it: a new token is due.
		res = push(tokenAt(now))
		require.Equal(t, http.StatusOK, res.StatusCode, res.Reason)
		// Another connection starts afresh.
		other := b.apnsClientWithBearer(t, tokenAt(now-60))
		res, err := other.Push(notification())
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, res.StatusCode, res.Reason)
	})

	t.Run("LocationTopic", func(t *testing.T) {
		t.Parallel()
		client := b.apnsClient(t)
		n := notification()
		n.PushType, n.Payload = apns2.PushTypeLocation, []byte(`{"aps":{}}`)
		res, err := client.Push(n)
		require.NoError(t, err)
		require.Equal(t, http.StatusBadRequest, res.StatusCode)
		require.Equal(t, apns2.ReasonTopicDisallowed, res.Reason)
		n.Topic = topic + ".location-query"
		res, err = client.Push(n)
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, res.StatusCode, res.Reason)
	})
}
