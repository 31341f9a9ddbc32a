package fake

import (
	"context"
	"io"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"firebase.google.com/go/v4/errorutils"
	"firebase.google.com/go/v4/messaging"
	"github.com/sideshow/apns2"
	"github.com/stretchr/testify/require"
)

func TestThrottleAnswersPerDevice(t *testing.T) {
	t.Parallel()
	now := time.Now()
	var clock atomic.Pointer[time.Time]
	clock.Store(&now)
	set := func(t time.Time) { clock.Store(&t) }
	b := setup(t, func(c *Config) { c.Now = func() time.Time { return *clock.Load() } })
	apns := b.apnsClient(t)
	fcm := b.fcmClient(t, "")
	sub, other := b.subscribe(t, false), b.subscribe(t, false)
	otherAPNs := "ffff" + apnsToken[4:]

	for _, c := range []Control{
		{Channel: "apns", Throttle: &Throttle{Tokens: []string{apnsToken}}},
		{Channel: "fcm", Throttle: &Throttle{Tokens: []string{fcmToken}, RetryAfterS: 3}},
		{Channel: "webpush", Throttle: &Throttle{Tokens: []string{sub.Endpoint}, RetryAfterS: 3}},
	} {
		require.NoError(t, b.srv.SetControl(c))
	}
	pushAPNs := func(token string) *apns2.Response {
		res, err := apns.Push(&apns2.Notification{DeviceToken: token, Topic: b.env[EnvAPNsTopic], Payload: []byte(`{"aps":{}}`)})
		require.NoError(t, err)
		return res
	}
	pushFCM := func(token string) error {
		_, err := fcm.Send(context.Background(), &messaging.Message{Token: token})
		return err
	}

	// The throttled devices are answered 429 as each provider answers it.
	res := pushAPNs(apnsToken)
	require.Equal(t, http.StatusTooManyRequests, res.StatusCode)
	require.Equal(t, apns2.ReasonTooManyRequests, res.Reason)
	err := pushFCM(fcmToken)
	require.True(t, messaging.IsQuotaExceeded(err), "got %v", err)
	resp := errorutils.HTTPResponse(err)
	require.Equal(t, "3", resp.Header.Get("Retry-After"))
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Contains(t, string(body), "google.rpc.QuotaFailure")
	require.Contains(t, string(body), "Device message rate exceeded")
	status, _ := sendWebPush(t, sub, b.webpushOptions(), `{}`)
	require.Equal(t, http.StatusTooManyRequests, status)

	// Everyone else is served.
	require.Equal(t, http.StatusOK, pushAPNs(otherAPNs).StatusCode)
	require.NoError(t, pushFCM("other-"+fcmToken))
	status, _ = sendWebPush(t, other, b.webpushOptions(), `{}`)
	require.Equal(t, http.StatusCreated, status)

	// A push before the Retry-After is over is early, and refused again.
	set(now.Add(2 * time.Second))
	err = pushFCM(fcmToken)
	require.True(t, messaging.IsQuotaExceeded(err), "got %v", err)
	require.Equal(t, "1", errorutils.HTTPResponse(err).Header.Get("Retry-After"), "what is left of the wait")
	// Once it is over, the device is served again.
	set(now.Add(3 * time.Second))
	require.Equal(t, http.StatusOK, pushAPNs(apnsToken).StatusCode)
	require.NoError(t, pushFCM(fcmToken))
	status, _ = sendWebPush(t, sub, b.webpushOptions(), `{}`)
	require.Equal(t, http.StatusCreated, status)

	st := b.stats(t)
	require.Equal(t, [3]int64{1, 2, 1}, [3]int64{st.APNs.Throttled, st.FCM.Throttled, st.WebPush.Throttled})
	require.Equal(t, [3]int64{0, 1, 0}, [3]int64{st.APNs.Early, st.FCM.Early, st.WebPush.Early})
	var listed []ThrottledDevice
	b.getJSON(t, "/_throttled", &listed)
	require.Len(t, listed, 3)
	for _, d := range listed {
		if d.Channel == "fcm" {
			require.True(t, d.Last429.Equal(now), "the last 429 that started a wait: %v", d.Last429)
			d.Last429 = time.Time{}
			require.Equal(t, ThrottledDevice{Channel: "fcm", Token: fcmToken, Answered429: 2, Early: 1, RetryAfterS: 3}, d)
		}
	}

	// A share picks the devices by a hash a client can compute too.
	require.NoError(t, b.srv.SetControl(Control{Channel: "apns", Throttle: &Throttle{Share: 1}}))
	require.Equal(t, http.StatusTooManyRequests, pushAPNs(otherAPNs).StatusCode)
	require.True(t, InThrottleShare(otherAPNs, 1))
	require.False(t, InThrottleShare(otherAPNs, 0))
	// An empty throttle removes it.
	require.NoError(t, b.srv.SetControl(Control{Channel: "apns", Throttle: &Throttle{}}))
	require.Equal(t, http.StatusOK, pushAPNs(otherAPNs).StatusCode)

	code, answer := b.postJSON(t, "/_control", `{"channel":"fcm","throttle":{"share":2}}`)
	require.Equal(t, http.StatusBadRequest, code)
	require.Contains(t, answer, "throttle.share")
}
