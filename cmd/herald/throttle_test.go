package main

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/heraldpush/herald/api/client"
	"github.com/heraldpush/herald/cmd/herald/heraldbench"
	"github.com/heraldpush/herald/jobs/push/apns"
	"github.com/heraldpush/herald/jobs/push/fake"
	fcmpkg "github.com/heraldpush/herald/jobs/push/fcm"
)

// These tests hold Herald to the providers' throttles as fakepush answers
// them: a 429 about one device (APNs TooManyRequests, a Web Push 429) makes
// only that device's delivery wait, for the Retry-After or a backoff, and
// never counts toward a breaker; a provider-wide quota (FCM QUOTA_EXCEEDED)
// pauses the provider for at least the Retry-After.

// watchBreaker records every state of channel's breaker that
// /v1/providers shows until the test ends, and returns a function that
// reports the states seen other than closed.
func (e *e2e) watchBreaker(channel string) func() []client.BreakerState {
	e.t.Helper()
	var (
		mu   sync.Mutex
		seen []client.BreakerState
		stop atomic.Bool
		done = make(chan struct{})
	)
	go func() {
		defer close(done)
		for !stop.Load() {
			if st := e.providers()[channel].State; st != client.BreakerStateClosed {
				mu.Lock()
				seen = append(seen, st)
				mu.Unlock()
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()
	e.t.Cleanup(func() { stop.Store(true); <-done })
	return func() []client.BreakerState {
		mu.Lock()
		defer mu.Unlock()
		return append([]client.BreakerState(nil), seen...)
	}
}

// apnsUsers registers one user per token, each with that APNs device.
func (e *e2e) apnsUsers(prefix string, tokens []string) []string {
	e.t.Helper()
	var users []string
	var batch []client.DeviceRegistration
	for i, tok := range tokens {
		u := fmt.Sprintf("%s%d", prefix, i)
		users = append(users, u)
		batch = append(batch, client.DeviceRegistration{UserID: u, Channel: client.ChannelAPNs, Token: new(tok)})
	}
	e.registerDevices(batch)
	return users
}

func TestThrottledAPNsTokensLeaveOthersOnTime(t *testing.T) {
	t.Parallel()
	e := startE2E(t, nil)
	// As many throttled tokens as the breaker's threshold: counted as the
	// provider's failures, their 429s would open APNs' breaker for every
	// device.
	var throttledTokens []string
	for range 5 {
		throttledTokens = append(throttledTokens, hexToken(""))
	}
	throttledUsers := e.apnsUsers("slow", throttledTokens)
	healthyUsers := e.apnsUsers("ok", []string{hexToken(""), hexToken(""), hexToken("")})
	require.NoError(t, e.fake.SetControl(fake.Control{Channel: "apns", Throttle: &fake.Throttle{Tokens: throttledTokens, Times: 2}}))
	states := e.watchBreaker("apns")

	slow := e.send(client.NewMessage{Audience: toUsers(throttledUsers...), Payload: titled("throttled")}).MessageID
	require.Eventually(t, func() bool { return e.fake.Stats().APNs.Throttled >= int64(len(throttledTokens)) },
		10*time.Second, 10*time.Millisecond, "fakepush throttles the tokens")
	// While those wait, messages to the other devices go out.
	var healthy []string
	for _, u := range healthyUsers {
		healthy = append(healthy, e.send(client.NewMessage{Audience: toUsers(u), Payload: titled("on time")}).MessageID)
	}
	for _, id := range healthy {
		st := e.settle(id, 30*time.Second)
		require.Equal(t, client.DeliveryCounts{Total: 1, Accepted: 1}, st.Deliveries)
	}
	st := e.settle(slow, 60*time.Second)
	require.Equal(t, client.DeliveryCounts{Total: 5, Accepted: 5}, st.Deliveries, "the throttled devices get it once their throttles are over")

	require.Empty(t, states(), "a device's throttle never touches the provider's breaker")
	apns := e.providers()["apns"]
	require.Zero(t, apns.Failures, "a device's 429 is no failure of APNs")
	require.Zero(t, e.fake.Stats().APNs.Early, "no throttled token was sent to again before its backoff")
	// The healthy messages were accepted before any throttled device was.
	lastHealthy := time.Time{}
	for _, id := range healthy {
		for _, d := range e.deliveries(id, client.DeliveryStatusAccepted) {
			lastHealthy = laterOf(lastHealthy, *d.AcceptedAt)
		}
	}
	for _, d := range e.deliveries(slow, client.DeliveryStatusAccepted) {
		require.True(t, d.AcceptedAt.After(lastHealthy), "a throttled device waited; the healthy ones did not wait for it")
	}
}

func laterOf(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

func TestWebPushThrottleIsResentNoSoonerThanRetryAfter(t *testing.T) {
	t.Parallel()
	e := startE2E(t, nil)
	const retryAfter = 2
	throttledSub, err := e.fake.MintSubscription(false)
	require.NoError(t, err)
	healthySub, err := e.fake.MintSubscription(false)
	require.NoError(t, err)
	e.registerDevice(client.DeviceRegistration{UserID: "slow", Channel: client.ChannelWebPush, Subscription: webPush(throttledSub)})
	e.registerDevice(client.DeviceRegistration{UserID: "ok", Channel: client.ChannelWebPush, Subscription: webPush(healthySub)})
	require.NoError(t, e.fake.SetControl(fake.Control{Channel: "webpush", Throttle: &fake.Throttle{
		Tokens: []string{throttledSub.Endpoint}, RetryAfterS: retryAfter,
	}}))
	states := e.watchBreaker("webpush")

	id := e.send(client.NewMessage{Audience: toUsers("slow", "ok"), Payload: titled("hi")}).MessageID
	st := e.settle(id, 30*time.Second)
	require.Equal(t, client.DeliveryCounts{Total: 2, Accepted: 2}, st.Deliveries)

	throttled := e.fake.Throttled()
	require.Len(t, throttled, 1)
	require.Equal(t, 1, throttled[0].Answered429, "one 429, then the resend was accepted")
	require.Zero(t, throttled[0].Early, "nothing was resent before the Retry-After")
	var healthyAt, throttledAt time.Time
	for _, r := range e.fake.Receipts(id) {
		switch r.Token {
		case healthySub.Endpoint:
			healthyAt = r.ReceivedAt
		case throttledSub.Endpoint:
			throttledAt = r.ReceivedAt
		}
	}
	require.False(t, throttledAt.IsZero() || healthyAt.IsZero(), "both subscriptions got the push")
	require.False(t, throttledAt.Before(throttled[0].Last429.Add(retryAfter*time.Second)),
		"resent %s after its 429, which asked for %d s", throttledAt.Sub(throttled[0].Last429), retryAfter)
	require.True(t, healthyAt.Before(throttledAt), "the other subscription did not wait for the throttled one")
	require.Empty(t, states(), "a subscription's 429 never opens its push service's breaker")
}

func TestFCMQuotaExceededPausesFCM(t *testing.T) {
	t.Parallel()
	e := startE2E(t, nil)
	const retryAfter = 2
	var batch []client.DeviceRegistration
	var users []string
	for i := range 3 {
		u := fmt.Sprintf("u%d", i)
		users = append(users, u)
		batch = append(batch, client.DeviceRegistration{UserID: u, Channel: client.ChannelFCM, Token: new(fmt.Sprintf("fcm-quota-%d", i))})
	}
	e.registerDevices(batch)
	// FCM's project-wide quota: every send is answered 429 QUOTA_EXCEEDED
	// with Retry-After.
	require.NoError(t, e.fake.SetControl(fake.Control{Channel: "fcm", Mode: fake.ModeRateLimited, RetryAfterS: new(retryAfter)}))

	before := e.fake.Stats().FCM.Received
	e.send(client.NewMessage{Priority: new(client.PriorityBulk), Audience: toUsers(users...), Payload: titled("quota")})
	var firstAt time.Time
	require.Eventually(t, func() bool {
		if e.fake.Stats().FCM.Rejected > 0 {
			firstAt = time.Now()
			return true
		}
		return false
	}, 10*time.Second, 5*time.Millisecond, "FCM answers the quota")
	// The first answers' burst: the requests already in flight when the
	// first 429 came back.
	time.Sleep(200 * time.Millisecond)
	burst := e.fake.Stats().FCM.Received - before
	require.LessOrEqual(t, burst, int64(len(users)))
	// No FCM request for at least the Retry-After.
	for time.Since(firstAt) < (retryAfter+1)*time.Second {
		require.Equal(t, burst, e.fake.Stats().FCM.Received-before, "FCM was sent to again before its Retry-After")
		time.Sleep(50 * time.Millisecond)
	}
	fcm := e.providers()["fcm"]
	require.Equal(t, client.BreakerStateOpen, fcm.State, "paused: FCM asks for at least a minute after QUOTA_EXCEEDED")

	// FCM throttled Herald as a whole: its client's bound on requests in
	// flight halved (once a round trip, so once or twice for the burst),
	// and APNs' did not move.
	families, err := heraldbench.ScrapeMetrics(e.base)
	require.NoError(t, err)
	limit := func(channel string) float64 {
		return heraldbench.MetricSum(families, "herald_provider_in_flight_limit", map[string]string{"channel": channel, "lane": "bulk"})
	}
	require.Less(t, limit("fcm"), float64(fcmpkg.DefaultMaxInFlight))
	require.GreaterOrEqual(t, limit("fcm"), float64(fcmpkg.DefaultMaxInFlight/4))
	require.EqualValues(t, apns.DefaultMaxInFlight, limit("apns"))
}

func TestThrottledPastExpiryExpires(t *testing.T) {
	t.Parallel()
	e := startE2E(t, nil)
	sub, err := e.fake.MintSubscription(false)
	require.NoError(t, err)
	e.registerDevice(client.DeviceRegistration{UserID: "slow", Channel: client.ChannelWebPush, Subscription: webPush(sub)})
	require.NoError(t, e.fake.SetControl(fake.Control{Channel: "webpush", Throttle: &fake.Throttle{
		Tokens: []string{sub.Endpoint}, RetryAfterS: 60,
	}}))

	now := time.Now()
	id := e.send(client.NewMessage{
		DispatchAt: &now, ExpiresAt: new(now.Add(3 * time.Second)),
		Audience: toUsers("slow"), Payload: titled("too late"),
	}).MessageID
	st := e.settle(id, 30*time.Second)
	require.Equal(t, client.MessageStateExpired, st.State)
	require.Equal(t, client.DeliveryCounts{Total: 1, Expired: 1}, st.Deliveries)
	expired := e.deliveries(id, client.DeliveryStatusExpired)
	require.Len(t, expired, 1)
	require.Equal(t, new(client.ReasonRateLimited), expired[0].Reason, "it expired waiting for its throttle")
	require.Zero(t, e.fake.Stats().WebPush.Early, "it was never resent within its Retry-After")
	require.Equal(t, int64(1), e.fake.Stats().WebPush.Throttled)
}
