package fake

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"firebase.google.com/go/v4/errorutils"
	"firebase.google.com/go/v4/messaging"
	"github.com/sideshow/apns2"
	"github.com/stretchr/testify/require"
)

func TestControlModesReachTheSDKs(t *testing.T) {
	t.Parallel()
	b := setup(t)
	apns := b.apnsClient(t)
	fcm := b.fcmClient(t, "")
	sub := b.subscribe(t, false)
	push := func() (*apns2.Response, int, error) {
		res, err := apns.Push(&apns2.Notification{DeviceToken: apnsToken, Topic: b.env[EnvAPNsTopic], Payload: []byte(`{"aps":{}}`)})
		require.NoError(t, err)
		_, fcmErr := fcm.Send(context.Background(), &messaging.Message{Token: fcmToken})
		status, _ := sendWebPush(t, sub, b.webpushOptions(), `{}`)
		return res, status, fcmErr
	}

	// Retry-After beyond two minutes stops the Firebase SDK from retrying the
	// 503 by itself (see TestFCMSDKRetriesUnavailable).
	for _, ch := range []string{"apns", "fcm", "webpush"} {
		code, body := b.postJSON(t, "/_control", `{"channel":"`+ch+`","mode":"unavailable","retry_after_s":600}`)
		require.Equal(t, http.StatusOK, code, body)
		require.JSONEq(t, `{"channel":"`+ch+`","mode":"unavailable","latency_ms":0,"retry_after_s":600}`, body)
	}
	res, wpStatus, fcmErr := push()
	require.Equal(t, http.StatusServiceUnavailable, res.StatusCode)
	require.Equal(t, apns2.ReasonServiceUnavailable, res.Reason)
	require.True(t, messaging.IsUnavailable(fcmErr), "got %v", fcmErr)
	require.Equal(t, "600", errorutils.HTTPResponse(fcmErr).Header.Get("Retry-After"))
	require.Equal(t, http.StatusServiceUnavailable, wpStatus)

	for _, ch := range []string{"apns", "fcm", "webpush"} {
		require.NoError(t, b.srv.SetControl(Control{Channel: ch, Mode: ModeRateLimited, RetryAfterS: new(int)}))
	}
	res, wpStatus, fcmErr = push()
	require.Equal(t, http.StatusTooManyRequests, res.StatusCode)
	require.Equal(t, apns2.ReasonTooManyRequests, res.Reason)
	require.True(t, messaging.IsQuotaExceeded(fcmErr), "got %v", fcmErr)
	require.Equal(t, "1", errorutils.HTTPResponse(fcmErr).Header.Get("Retry-After"))
	require.Equal(t, http.StatusTooManyRequests, wpStatus)

	for _, ch := range []string{"apns", "fcm", "webpush"} {
		require.NoError(t, b.srv.SetControl(Control{Channel: ch, Mode: ModeOK}))
	}
	res, wpStatus, fcmErr = push()
	require.Equal(t, http.StatusOK, res.StatusCode)
	require.NoError(t, fcmErr)
	require.Equal(t, http.StatusCreated, wpStatus)

	st := b.stats(t)
	for _, cs := range []ChannelStats{st.APNs, st.FCM, st.WebPush} {
		require.Equal(t, ChannelStats{Received: 3, Accepted: 1, Rejected: 2}, cs)
	}
}

func TestControlLatency(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *Config) { c.Latency = 5 * time.Millisecond })
	apns := b.apnsClient(t)
	n := &apns2.Notification{DeviceToken: apnsToken, Topic: b.env[EnvAPNsTopic], Payload: []byte(`{"aps":{}}`)}
	_, err := apns.Push(n) // connect and warm up outside the timing
	require.NoError(t, err)

	latency := 300
	require.NoError(t, b.srv.SetControl(Control{Channel: "apns", LatencyMS: &latency}))
	start := time.Now()
	res, err := apns.Push(n)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, res.StatusCode)
	require.GreaterOrEqual(t, time.Since(start), 300*time.Millisecond)

	// A client that gives up during the latency is neither accepted nor rejected,
	// and its handler returns at once rather than sleeping on.
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, err = apns.PushWithContext(ctx, n)
	require.Error(t, err)
	require.Never(t, func() bool {
		return b.srv.Stats().APNs.Accepted > 2
	}, 450*time.Millisecond, 10*time.Millisecond, "the abandoned push was completed after its client left")
	require.Equal(t, ChannelStats{Received: 3, Accepted: 2}, b.srv.Stats().APNs)

	// The other channels kept the configured latency.
	require.Equal(t, 5, b.srv.Controls()[FCM].LatencyMS)
}

func TestControlRejectsBadInput(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, body := range []string{
		`{"channel":"sms","mode":"ok"}`,
		`{"channel":"apns","mode":"sleepy"}`,
		`{"channel":"apns","latency_ms":-1}`,
		`{"channel":"apns","retry_after_s":-1}`,
		`{"channel":"apns","colour":"red"}`,
		`{"channel":`,
	} {
		code, resp := b.postJSON(t, "/_control", body)
		require.Equal(t, http.StatusBadRequest, code, body)
		require.Contains(t, resp, `"error"`)
	}
	var controls []ChannelControl
	b.getJSON(t, "/_control", &controls)
	require.Equal(t, []ChannelControl{
		{Channel: "apns", Mode: ModeOK}, {Channel: "fcm", Mode: ModeOK}, {Channel: "webpush", Mode: ModeOK},
	}, controls, "nothing changed")
}

func TestDuplicatesAndReset(t *testing.T) {
	t.Parallel()
	b := setup(t)
	apns := b.apnsClient(t)
	fcm := b.fcmClient(t, "")
	sub := b.subscribe(t, false)
	send := func(token, msgID string) {
		res, err := apns.Push(&apns2.Notification{DeviceToken: token, Topic: b.env[EnvAPNsTopic],
			Payload: []byte(`{"aps":{},"herald_message_id":"` + msgID + `"}`)})
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, res.StatusCode)
		_, err = fcm.Send(context.Background(), &messaging.Message{Token: token, Data: map[string]string{"herald_message_id": msgID}})
		require.NoError(t, err)
		s := sub
		if token != apnsToken {
			s = b.subscribe(t, false)
		}
		status, _ := sendWebPush(t, s, b.webpushOptions(), `{"herald_message_id":"`+msgID+`"}`)
		require.Equal(t, http.StatusCreated, status)
	}
	send(apnsToken, "m1")
	send(apnsToken, "m1")  // the duplicate
	send(apnsToken, "m2")  // same device, another message
	send("abcdef12", "m1") // another device, same message

	st := b.stats(t)
	for _, cs := range []ChannelStats{st.APNs, st.FCM, st.WebPush} {
		require.Equal(t, ChannelStats{Received: 4, Accepted: 4, Duplicates: 1}, cs)
	}
	require.Positive(t, st.Process.Requests)
	require.Positive(t, st.Process.CPUMicros)

	var receipts []map[string]string
	b.getJSON(t, "/_receipts?message_id=m1", &receipts)
	require.Len(t, receipts, 9)
	for _, r := range receipts {
		ts, err := time.Parse(time.RFC3339Nano, r["received_at"])
		require.NoError(t, err)
		require.True(t, strings.HasSuffix(r["received_at"], "Z"), "UTC")
		require.WithinDuration(t, time.Now(), ts, time.Minute)
	}
	code, body := b.postJSON(t, "/_control", `{"channel":"fcm","mode":"unavailable"}`)
	require.Equal(t, http.StatusOK, code, body)

	code, _ = b.postJSON(t, "/_reset", "")
	require.Equal(t, http.StatusNoContent, code)
	st = b.stats(t)
	require.Equal(t, Stats{Process: st.Process, Connections: ConnStats{Open: st.Connections.Open}}, st,
		"the connections still open are not traffic: Reset counts the opened ones from zero")
	b.getJSON(t, "/_receipts?message_id=m1", &receipts)
	require.Empty(t, receipts)
	require.Equal(t, ModeOK, b.srv.Controls()[FCM].Mode, "reset restores the modes")

	// After a reset the same push is new again.
	send(apnsToken, "m1")
	require.Equal(t, int64(0), b.stats(t).APNs.Duplicates)

	resp, err := b.client.Get(b.srv.URL() + "/_receipts")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusBadRequest, resp.StatusCode, "message_id is required")

	resp, err = b.client.Get(b.srv.URL() + "/_receipts?message_id=m1&detail=yes")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusBadRequest, resp.StatusCode, "detail is 1 or 0")
	var detailed []Receipt
	b.getJSON(t, "/_receipts?message_id=m1&detail=1", &detailed)
	for _, r := range detailed {
		require.NotEmpty(t, r.Headers, "%s: the last pushes keep their details", r.Channel)
	}
	require.Len(t, detailed, 3)
}

// TestInFlight counts a push while fakepush holds it for the injected
// latency, and no longer once it has been answered.
func TestInFlight(t *testing.T) {
	t.Parallel()
	b := setup(t)
	apns := b.apnsClient(t)
	code, body := b.postJSON(t, "/_control", `{"channel":"apns","latency_ms":400}`)
	require.Equal(t, http.StatusOK, code, body)
	require.Zero(t, b.stats(t).Process.InFlight)

	done := make(chan int, 1)
	go func() {
		res, err := apns.Push(&apns2.Notification{DeviceToken: apnsToken, Topic: b.env[EnvAPNsTopic], Payload: []byte(`{"aps":{}}`)})
		if err != nil {
			done <- 0
			return
		}
		done <- res.StatusCode
	}()
	require.Eventually(t, func() bool { return b.stats(t).Process.InFlight == 1 }, 5*time.Second, 5*time.Millisecond)
	require.Equal(t, http.StatusOK, <-done)
	// The handler ends a moment after its answer is on the wire.
	require.Eventually(t, func() bool { return b.stats(t).Process.InFlight == 0 }, 5*time.Second, 5*time.Millisecond)
}

// TestStatsCountWarmupsApart sends what Herald's providers send to warm
// their connections before any push (an APNs push without a device token, to
// either environment's host; an FCM dry run to a topic; a HEAD of a push
// service's root) and then one real push per channel: /_stats counts the
// warm-ups on their own, so a fresh Herald's fakepush shows no pushes, and no
// rejections, until something is sent.
func TestStatsCountWarmupsApart(t *testing.T) {
	t.Parallel()
	b := setup(t)
	apns := b.apnsClient(t)
	sandbox := b.apnsClient(t)
	sandbox.Host = b.env[EnvAPNsSandboxHost]
	fcm := b.fcmClient(t, "")

	for _, c := range []*apns2.Client{apns, sandbox} {
		res, err := c.Push(&apns2.Notification{Topic: b.env[EnvAPNsTopic], PushType: apns2.PushTypeAlert, Payload: []byte(`{}`)})
		require.NoError(t, err)
		require.Equal(t, http.StatusBadRequest, res.StatusCode, "Apple's answer to a push without a token")
		require.Equal(t, apns2.ReasonMissingDeviceToken, res.Reason)
	}
	_, err := fcm.SendDryRun(context.Background(), &messaging.Message{Topic: "herald-warm", Data: map[string]string{"herald": "warm"}})
	require.NoError(t, err)
	req, err := http.NewRequest(http.MethodHead, b.url+"/", nil)
	require.NoError(t, err)
	resp, err := b.client.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)

	st := b.stats(t)
	require.Equal(t, ChannelStats{Warmups: 2}, st.APNs)
	require.Equal(t, ChannelStats{Warmups: 1}, st.FCM)
	require.Equal(t, ChannelStats{Warmups: 1}, st.WebPush)
	require.Zero(t, st.Process.Requests, "warm-ups are not push requests")

	res, err := apns.Push(&apns2.Notification{DeviceToken: apnsToken, Topic: b.env[EnvAPNsTopic], Payload: []byte(`{"aps":{}}`)})
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, res.StatusCode)
	_, err = fcm.Send(context.Background(), &messaging.Message{Token: fcmToken})
	require.NoError(t, err)
	st = b.stats(t)
	require.Equal(t, ChannelStats{Received: 1, Accepted: 1, Warmups: 2}, st.APNs)
	require.Equal(t, ChannelStats{Received: 1, Accepted: 1, Warmups: 1}, st.FCM)

	b.srv.Reset()
	require.Equal(t, Stats{}.APNs, b.stats(t).APNs, "Reset clears the warm-ups too")
}
