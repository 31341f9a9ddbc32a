package fake

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/base64"
	"net/http"
	"strings"
	"testing"
	"time"

	webpush "github.com/SherClockHolmes/webpush-go"
	"github.com/stretchr/testify/require"
)

func TestWebPushAccepts(t *testing.T) {
	t.Parallel()
	b := setup(t)
	sub := b.subscribe(t, false)
	require.True(t, strings.HasPrefix(sub.Endpoint, b.srv.URL()+"/webpush/"), sub.Endpoint)

	opts := b.webpushOptions()
	opts.Topic = "msg1"
	opts.Urgency = webpush.UrgencyHigh
	resp, err := webpush.SendNotification([]byte(`{"title":"Hi","body":"there","herald_message_id":"msg_1"}`), sub, opts)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusCreated, resp.StatusCode)
	require.Equal(t, 2, resp.ProtoMajor)
	require.True(t, strings.HasPrefix(resp.Header.Get("Location"), b.srv.URL()+"/_webpush/messages/"))

	// Herald may also nest the id in "data".
	status, body := sendWebPush(t, sub, b.webpushOptions(), `{"title":"Hi","data":{"herald_message_id":"msg_2"}}`)
	require.Equal(t, http.StatusCreated, status, body)

	receipts := b.srv.Receipts("msg_1")
	require.Len(t, receipts, 1)
	require.Equal(t, "webpush", receipts[0].Channel)
	require.Equal(t, sub.Endpoint, receipts[0].Token, "a Web Push device is known by its endpoint")
	require.Equal(t, "msg1", receipts[0].CollapseKey)
	require.Len(t, b.srv.Receipts("msg_2"), 1)
	require.Equal(t, ChannelStats{Received: 2, Accepted: 2}, b.stats(t).WebPush)
}

func TestWebPushRejectsLikeAPushService(t *testing.T) {
	t.Parallel()
	b := setup(t)
	sub := b.subscribe(t, false)
	otherPriv, otherPub, err := webpush.GenerateVAPIDKeys()
	require.NoError(t, err)

	tests := []struct {
		name    string
		sub     func() *webpush.Subscription
		opts    func(o *webpush.Options)
		tamper  func(r *http.Request, body []byte) []byte
		status  int
		message string
	}{
		{name: "dead subscription", sub: func() *webpush.Subscription { return b.subscribe(t, true) }, status: 410},
		{name: "unknown subscription", sub: func() *webpush.Subscription {
			forged := *sub
			forged.Endpoint = sub.Endpoint[:len(sub.Endpoint)-3] + "AAA"
			return &forged
		}, status: 404},
		{name: "bad VAPID signature", opts: func(o *webpush.Options) { o.VAPIDPrivateKey = otherPriv }, status: 401, message: "signature"},
		{name: "another application server key", opts: func(o *webpush.Options) { o.VAPIDPrivateKey, o.VAPIDPublicKey = otherPriv, otherPub }, status: 403},
		{name: "corrupted ciphertext", tamper: func(_ *http.Request, body []byte) []byte {
			body[len(body)-20] ^= 0xff
			return body
		}, status: 400, message: "decrypt"},
		{name: "missing TTL", tamper: func(r *http.Request, body []byte) []byte {
			r.Header.Del("TTL")
			return body
		}, status: 400, message: "TTL"},
		{name: "bad urgency", tamper: func(r *http.Request, body []byte) []byte {
			r.Header.Set("Urgency", "urgent")
			return body
		}, status: 400, message: "Urgency"},
		{name: "long topic", opts: func(o *webpush.Options) { o.Topic = strings.Repeat("t", 33) }, status: 400, message: "Topic"},
		{name: "topic outside base64url", opts: func(o *webpush.Options) { o.Topic = "msg 1" }, status: 400, message: "Topic"},
		// webpush-go pads every body to its record size; 5000 exceeds the limit.
		{name: "oversize body", opts: func(o *webpush.Options) { o.RecordSize = 5000 }, status: 413},
		{name: "wrong encoding", tamper: func(r *http.Request, body []byte) []byte {
			r.Header.Set("Content-Encoding", "aesgcm")
			return body
		}, status: 400, message: "aes128gcm"},
		{name: "no VAPID header", tamper: func(r *http.Request, body []byte) []byte {
			r.Header.Del("Authorization")
			return body
		}, status: 401},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			target := sub
			if tt.sub != nil {
				target = tt.sub()
			}
			opts := b.webpushOptions()
			if tt.opts != nil {
				tt.opts(opts)
			}
			if tt.tamper != nil {
				opts.HTTPClient = b.tamper(t, tt.tamper)
			}
			status, body := sendWebPush(t, target, opts, `{"herald_message_id":"m"}`)
			require.Equal(t, tt.status, status, body)
			require.Contains(t, body, tt.message)
			require.Contains(t, body, `"code":`)
		})
	}
	t.Cleanup(func() {
		st := b.srv.Stats().WebPush
		require.Equal(t, ChannelStats{Received: int64(len(tests)), Rejected: int64(len(tests))}, st)
	})
}

// TestWebPushVAPIDClaims checks the claims webpush-go always gets right
// (it hard-codes exp to 12 h and derives aud itself) with hand-made tokens.
func TestWebPushVAPIDClaims(t *testing.T) {
	t.Parallel()
	b := setup(t)
	sub := b.subscribe(t, false)
	vapidKey := b.srv.creds.vapidKey
	k := b.env[EnvVAPIDPublicKey]
	now := time.Now().Unix()
	otherKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	claims := func(edit func(map[string]any)) map[string]any {
		c := map[string]any{"aud": b.srv.URL(), "exp": now + 3600, "sub": "mailto:ops@example.com"}
		if edit != nil {
			edit(c)
		}
		return c
	}
	tests := []struct {
		name   string
		header string
		status int
	}{
		{name: "valid", header: "vapid t=" + signJWT(t, vapidKey, nil, claims(nil)) + ", k=" + k, status: 201},
		{name: "https subject", header: "vapid t=" + signJWT(t, vapidKey, nil, claims(func(c map[string]any) { c["sub"] = "https://herald.example" })) + ", k=" + k, status: 201},
		{name: "wrong audience", header: "vapid t=" + signJWT(t, vapidKey, nil, claims(func(c map[string]any) { c["aud"] = "https://push.example.net" })) + ", k=" + k, status: 401},
		{name: "expired", header: "vapid t=" + signJWT(t, vapidKey, nil, claims(func(c map[string]any) { c["exp"] = now - 10 })) + ", k=" + k, status: 401},
		{name: "exp beyond 24 h", header: "vapid t=" + signJWT(t, vapidKey, nil, claims(func(c map[string]any) { c["exp"] = now + 25*3600 })) + ", k=" + k, status: 401},
		{name: "no subject", header: "vapid t=" + signJWT(t, vapidKey, nil, claims(func(c map[string]any) { delete(c, "sub") })) + ", k=" + k, status: 401},
		{name: "k is not the signer", header: "vapid t=" + signJWT(t, otherKey, nil, claims(nil)) + ", k=" + k, status: 401},
		{name: "old WebPush scheme", header: "WebPush " + signJWT(t, vapidKey, nil, claims(nil)), status: 401},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			req, err := http.NewRequest(http.MethodPost, sub.Endpoint, nil)
			require.NoError(t, err)
			req.Header.Set("Authorization", tt.header)
			req.Header.Set("TTL", "60")
			resp, err := b.client.Do(req)
			require.NoError(t, err)
			defer resp.Body.Close()
			require.Equal(t, tt.status, resp.StatusCode)
		})
	}
}

func TestDecryptRoundTrip(t *testing.T) {
	t.Parallel()
	b := setup(t)
	sub, err := b.srv.MintSubscription(false)
	require.NoError(t, err)
	id := sub.Endpoint[strings.LastIndexByte(sub.Endpoint, '/')+1:]
	require.True(t, b.srv.knownSubscription(id))
	// Another last character: one id in 64 already ends in x.
	other := "x"
	if strings.HasSuffix(id, other) {
		other = "y"
	}
	require.False(t, b.srv.knownSubscription(id[:len(id)-1]+other))
	keys, err := b.srv.subscriptionKeys(id)
	require.NoError(t, err)
	require.Equal(t, sub.Keys.P256dh, base64.RawURLEncoding.EncodeToString(keys.pub), "keys are derived again identically")

	// Capture the body webpush-go sends and decrypt it directly.
	var captured []byte
	opts := b.webpushOptions()
	opts.RecordSize = 200
	opts.HTTPClient = b.tamper(t, func(_ *http.Request, body []byte) []byte {
		captured = append([]byte(nil), body...)
		return body
	})
	wsub := &webpush.Subscription{Endpoint: sub.Endpoint, Keys: webpush.Keys{P256dh: sub.Keys.P256dh, Auth: sub.Keys.Auth}}
	status, _ := sendWebPush(t, wsub, opts, "hello, device")
	require.Equal(t, http.StatusCreated, status)
	plain, err := decryptAES128GCM(captured, keys, nil)
	require.NoError(t, err)
	require.Equal(t, "hello, device", string(plain))

	for _, n := range []int{0, 20, 85, 100} {
		_, err := decryptAES128GCM(captured[:n], keys, nil)
		require.Error(t, err, "truncated to %d bytes", n)
	}
}

func TestWebPushDecryptSampling(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *Config) { c.DecryptOneIn = 2 })
	sub := b.subscribe(t, false)
	// A corrupted body gets through when its decryption is sampled out, and the
	// Topic then stands in for the message id; every second one is decrypted
	// and rejected.
	opts := b.webpushOptions()
	opts.Topic = "msg9"
	opts.HTTPClient = b.tamper(t, func(_ *http.Request, body []byte) []byte {
		body[len(body)-1] ^= 0xff
		return body
	})
	created := 0
	for range 6 {
		if status, _ := sendWebPush(t, sub, opts, `{"herald_message_id":"msg9"}`); status == http.StatusCreated {
			created++
		}
	}
	require.Equal(t, 3, created)
	require.Len(t, b.srv.Receipts("msg9"), 3)
	require.Equal(t, ChannelStats{Received: 6, Accepted: 3, Rejected: 3, Duplicates: 2}, b.srv.Stats().WebPush)
}
