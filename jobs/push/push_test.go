package push

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/heraldpush/herald/jobs/receipt"
)

func TestWebPushTopic(t *testing.T) {
	t.Parallel()
	require.Equal(t, "msg_9223372036854775807", WebPushTopic("msg_9223372036854775807"))
	for _, id := range []string{strings.Repeat("x", 33), strings.Repeat("x", 40)} {
		long := WebPushTopic(id)
		require.Len(t, long, 32)
		require.True(t, isBase64URL(long))
	}
	require.Len(t, WebPushTopic("msg.1"), 32, "a character outside base64url is hashed away")
	require.NotEqual(t, WebPushTopic("msg.1"), WebPushTopic("msg.2"))
}

func TestStatusReason(t *testing.T) {
	t.Parallel()
	for status, want := range map[int]Reason{
		429: ReasonRateLimited,
		500: ReasonProviderUnavailable,
		502: ReasonProviderUnavailable,
		503: ReasonProviderUnavailable,
		400: ReasonInternal,
		401: ReasonInternal,
		403: ReasonInternal,
		404: ReasonInternal,
		301: ReasonInternal,
	} {
		require.Equal(t, want, StatusReason(status), "status %d", status)
	}
}

func TestParseRetryAfter(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		in   string
		want time.Duration
	}{
		{"", 0},
		{"3", 3 * time.Second},
		{" 60 ", time.Minute},
		{"-5", 0},
		{"99999999999", 24 * time.Hour},
		{"Wed, 02 Dec 2026 00:00:30 GMT", 30 * time.Second},
		{"Tue, 01 Dec 2026 23:59:00 GMT", 0},
		{"soon", 0},
	} {
		require.Equal(t, tc.want, ParseRetryAfter(tc.in, now), "%q", tc.in)
	}
}

// TestWithReceipt splices a token into an encoded object, which stays JSON
// with every member it had, and adds what ReceiptLen says.
func TestWithReceipt(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ obj, token, want string }{
		{`{"aps":{"alert":"x"},"herald_message_id":"msg_1"}`, "tok", `{"herald_receipt":"tok","aps":{"alert":"x"},"herald_message_id":"msg_1"}`},
		{`{}`, "tok", `{"herald_receipt":"tok"}`},
		{`{"a":"b"}`, "", `{"a":"b"}`},
	} {
		got := WithReceipt([]byte("prefix:"), []byte(tc.obj), tc.token)
		require.Equal(t, "prefix:"+tc.want, string(got))
		require.True(t, json.Valid(got[len("prefix:"):]))
		if tc.obj != `{}` {
			require.Len(t, tc.want, len(tc.obj)+ReceiptLen(tc.token))
		}
	}
}

// BenchmarkSignReceipts measures what the chunk worker adds to a slice of
// 500 targets with receipts on: each target's token, signed into one
// buffer. One operation is one target.
//
//	go test -run '^$' -bench 'SignReceipts|WithReceipt' ./jobs/push/
func BenchmarkSignReceipts(b *testing.B) {
	signer, err := receipt.NewSigner([]byte(strings.Repeat("k", receipt.KeySize)))
	require.NoError(b, err)
	ts := make([]Target, 500)
	for i := range ts {
		ts[i].DeviceID = int64(1_000_000 + i)
	}
	expires := time.Now().Add(time.Hour)
	b.ReportAllocs()
	for b.Loop() {
		SignReceipts(signer, 123_456, expires, ts)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(ts)), "ns/target")
}

// BenchmarkWithReceipt measures the per-device splice of a token into an
// APNs payload encoded once, as the APNs provider makes it.
func BenchmarkWithReceipt(b *testing.B) {
	payload, err := APNsPayload(Content{Title: "Reminder", Body: "Your appointment is at 09:00", Data: map[string]string{"kind": "appointment"}}, "msg_123456")
	require.NoError(b, err)
	token := strings.Repeat("t", 40)
	b.ReportAllocs()
	for b.Loop() {
		_ = WithReceipt(make([]byte, 0, len(payload)+ReceiptLen(token)), payload, token)
	}
}

// TestEveryAlertAsksForTheServiceExtension: iOS runs an app's notification
// service extension, where the app sends its delivered receipt, only for
// an alert whose aps has mutable-content; a background push has no alert
// and wakes the app itself.
func TestEveryAlertAsksForTheServiceExtension(t *testing.T) {
	for _, c := range []Content{{Title: "t"}, {Body: "b", Image: "https://example.com/i.png"}, {Title: "t", Data: map[string]string{"k": "v"}}} {
		raw, err := APNsPayload(c, "m1")
		require.NoError(t, err)
		var body struct {
			APS map[string]any `json:"aps"`
		}
		require.NoError(t, json.Unmarshal(raw, &body))
		require.Equal(t, 1.0, body.APS["mutable-content"], "%+v", c)
	}
	raw, err := APNsPayload(Content{Data: map[string]string{"k": "v"}}, "m1")
	require.NoError(t, err)
	require.NotContains(t, string(raw), "mutable-content", "a background push")
}

// TestFCMDataDrawnByApp: a message that asks for data-only delivery and
// has something to show carries every display field in its FCM data, as a
// string under its payload field's name, for the app to draw; any other
// message carries only the caller's data, the link and the message id.
func TestFCMDataDrawnByApp(t *testing.T) {
	t.Parallel()
	badge, zero := 7, 0
	full := Content{
		Title: "Standup", Subtitle: "Team Blue", Body: "In five minutes", Data: map[string]string{"room": "blue"},
		Image: "https://cdn.example.com/standup.png", URL: "https://app.example.com/standup/42",
		Sound: "chime", Badge: &badge, Category: "MEETING", ThreadID: "standups",
		FCM: &FCMOptions{DataOnly: true, AndroidChannelID: "meetings", AndroidPriority: "high", Tag: "standup", Color: "#ff8800", Icon: "ic_meeting"},
	}
	for _, tc := range []struct {
		name       string
		content    Content
		drawnByApp bool
		want       map[string]string
	}{
		{"every display field", full, true, map[string]string{
			"room": "blue", "title": "Standup", "subtitle": "Team Blue", "body": "In five minutes",
			"image": "https://cdn.example.com/standup.png", "url": "https://app.example.com/standup/42",
			"sound": "chime", "badge": "7", "category": "MEETING",
			"tag": "standup", "android_channel_id": "meetings", "color": "#ff8800", "icon": "ic_meeting",
			MessageIDKey: "m1",
		}},
		{"a title alone; no tag of the message id", Content{Title: "Hi", FCM: &FCMOptions{DataOnly: true}}, true,
			map[string]string{"title": "Hi", MessageIDKey: "m1"}},
		{"a badge of 0 clears", Content{Body: "b", Badge: &zero, FCM: &FCMOptions{DataOnly: true}}, true,
			map[string]string{"body": "b", "badge": "0", MessageIDKey: "m1"}},
		{"not asked: a notification", func() Content { c := full; f := *c.FCM; f.DataOnly = false; c.FCM = &f; return c }(), false,
			map[string]string{"room": "blue", "url": "https://app.example.com/standup/42", MessageIDKey: "m1"}},
		{"nothing to show: data alone", Content{Data: map[string]string{"sync": "inbox"}, Category: "SYNC", FCM: &FCMOptions{DataOnly: true, Tag: "inbox"}}, false,
			map[string]string{"sync": "inbox", MessageIDKey: "m1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			require.Equal(t, tc.drawnByApp, tc.content.DrawnByApp())
			require.Equal(t, tc.want, FCMData(tc.content, "m1"))
			for k := range tc.want {
				if k != "room" && k != "sync" && k != MessageIDKey {
					require.True(t, IsFCMDisplayKey(k), "%s is reserved with data_only", k)
				}
			}
		})
	}
	require.False(t, IsFCMDisplayKey("room"))
}

// TestCheckSizeCountsTheDataOnlyEncoding: with data_only the display
// fields travel in FCM's data and, for Apple devices, the title and body
// in the alert too, so a payload whose notification fits can be over
// FCM's limit drawn by the app.
func TestCheckSizeCountsTheDataOnlyEncoding(t *testing.T) {
	t.Parallel()
	c := Content{Title: strings.Repeat("t", 1300), Body: strings.Repeat("b", 1300), Subtitle: strings.Repeat("s", 300)}
	require.NoError(t, CheckSize(c))
	c.FCM = &FCMOptions{DataOnly: true}
	var size *SizeError
	require.ErrorAs(t, CheckSize(c), &size)
	require.Equal(t, "fcm", size.Channel)
	require.Greater(t, size.Size, 2*2600, "the title and body counted twice: in the data, and in the Apple alert")
}
