package jobs

import (
	"testing"
	"time"

	"github.com/riverqueue/river"
	"github.com/stretchr/testify/require"

	"github.com/heraldpush/herald/jobs/push"
)

// throttledFor is a provider's 429 about one device, asking for d (none
// when zero).
func throttledFor(d time.Duration) push.Result {
	return push.Result{Reason: push.ReasonRateLimited, Detail: "429 TooManyRequests", TargetThrottled: true, RetryAfter: d}
}

func TestFanOutThrottledDeviceWaitsItsRetryAfter(t *testing.T) {
	t.Parallel()
	b := setupFanOut(t)
	c := b.dueNow(b.devices("apns-1", "apns-2", "fcm-1"))
	apns := &recordingSender{script: map[string][]push.Result{"apns-1": {throttledFor(30 * time.Second)}}}
	fcm := &recordingSender{}
	// Breakers that open at the first failure: a device's throttle must
	// not be one.
	breakers := openBreakers(time.Minute)
	w := b.worker(map[string]Sender{ChannelAPNs: apns, ChannelFCM: fcm}, FanOutConfig{Breakers: breakers})

	attempted := time.Now()
	res := b.work(w, c)
	require.Equal(t, river.EventKindJobSnoozed, res.EventKind, "the chunk waits for its throttled device")
	require.WithinDuration(t, attempted.Add(30*time.Second), res.Job.ScheduledAt, time.Second)
	require.Equal(t, []string{"apns-1", "apns-2"}, apns.sends())
	require.Equal(t, []string{"fcm-1"}, fcm.sends())
	b.requireStatus(c, "apns-1", "pending", push.ReasonRateLimited)
	b.requireStatus(c, "apns-2", "accepted", push.ReasonNone)
	st := breakers.For(ChannelAPNs, "").Status()
	require.Equal(t, BreakerClosed, st.State, "a device's throttle is no failure of the provider")
	require.Zero(t, st.Failures)

	// The wait is in the ledger: another attempt (any process's) that
	// comes early sends nothing to the throttled device, and snoozes again
	// until its time.
	targets := chunkTargets(t, b.q, c.args)
	require.Len(t, targets, 1)
	require.WithinDuration(t, b.clock.ToDB(attempted).Add(30*time.Second), targets[0].NotBefore, time.Second)
	res = b.work(w, c)
	require.Equal(t, river.EventKindJobSnoozed, res.EventKind)
	require.Empty(t, apns.sends(), "nothing is resent before the Retry-After")
	require.WithinDuration(t, attempted.Add(30*time.Second), res.Job.ScheduledAt, time.Second)
	m := b.settled(c.msg.ID)
	require.Equal(t, StateDispatching, m.State)
	require.EqualValues(t, 1, m.PendingCount)
}

func TestFanOutThrottledDeviceBacksOffWithoutRetryAfter(t *testing.T) {
	t.Parallel()
	b := setupFanOut(t)
	c := b.dueNow(b.devices("apns-1"))
	apns := &recordingSender{script: map[string][]push.Result{"apns-1": {throttledFor(0)}}}
	w := b.worker(map[string]Sender{ChannelAPNs: apns}, FanOutConfig{})

	attempted := time.Now()
	res := b.work(w, c)
	require.Equal(t, river.EventKindJobSnoozed, res.EventKind)
	// No sooner than the backoff after the attempt began; later by what the
	// attempt took on a busy machine.
	require.False(t, res.Job.ScheduledAt.Before(attempted.Add(throttleFirst-100*time.Millisecond)), "snoozed until %s", res.Job.ScheduledAt)
	require.WithinDuration(t, attempted.Add(throttleFirst), res.Job.ScheduledAt, 2*time.Second)
	// Once the backoff is over, the device is sent again and accepted.
	// The backoff runs from when the throttle was written (the ledger's
	// not_before, by the database's clock), which on a busy machine is
	// later than the attempt began.
	targets := chunkTargets(t, b.q, c.args)
	require.Len(t, targets, 1)
	time.Sleep(time.Until(targets[0].NotBefore.Add(-b.clock.Offset())) + 50*time.Millisecond)
	res = b.work(w, c)
	require.Equal(t, river.EventKindJobCompleted, res.EventKind)
	require.Equal(t, []string{"apns-1", "apns-1"}, apns.sends())
	b.requireStatus(c, "apns-1", "accepted", push.ReasonNone)
}

func TestFanOutThrottledPastExpiryExpires(t *testing.T) {
	t.Parallel()
	b := setupFanOut(t)
	lifetime := 1500 * time.Millisecond
	c := b.message(b.devices("https://push.example/w/1"), b.clock.Now(), lifetime)
	web := &recordingSender{script: map[string][]push.Result{"https://push.example/w/1": {throttledFor(time.Hour)}}}
	w := b.worker(map[string]Sender{ChannelWebPush: web}, FanOutConfig{})

	res := b.work(w, c)
	require.Equal(t, river.EventKindJobSnoozed, res.EventKind)
	require.False(t, res.Job.ScheduledAt.After(c.args.ExpiresAt.Add(time.Second)), "snoozed past the chunk's expiry")
	time.Sleep(time.Until(c.args.ExpiresAt.Add(-b.clock.Offset())) + 50*time.Millisecond)
	res = b.work(w, c)
	require.Equal(t, river.EventKindJobCompleted, res.EventKind)
	require.Len(t, web.sends(), 1, "never resent within its Retry-After")
	b.requireStatus(c, "https://push.example/w/1", "expired", push.ReasonRateLimited)
	require.Equal(t, StateExpired, b.settled(c.msg.ID).State)
}

func TestFanOutPausesAProviderForItsRetryAfter(t *testing.T) {
	t.Parallel()
	b := setupFanOut(t)
	c := b.dueNow(b.devices("fcm-1", "fcm-2"))
	quota := push.Result{Reason: push.ReasonRateLimited, Detail: "429 RESOURCE_EXHAUSTED QUOTA_EXCEEDED", RetryAfter: time.Minute}
	fcm := &recordingSender{script: map[string][]push.Result{"fcm-1": {quota}}}
	breakers := NewBreakers(BreakerConfig{}, Channels...)
	w := b.worker(map[string]Sender{ChannelFCM: fcm}, FanOutConfig{Breakers: breakers})

	attempted := time.Now()
	res := b.work(w, c)
	require.Equal(t, river.EventKindJobSnoozed, res.EventKind)
	require.Equal(t, []string{"fcm-1"}, fcm.sends(), "the pause holds back what comes after it")
	require.WithinDuration(t, attempted.Add(time.Minute), res.Job.ScheduledAt, time.Second)
	br := breakers.For(ChannelFCM, "")
	require.Equal(t, BreakerOpen, br.Status().State, "a provider-wide limit with Retry-After opens at once")
	require.Greater(t, br.RetryIn(), 59*time.Second)
	b.requireStatus(c, "fcm-1", "pending", push.ReasonRateLimited)
	b.requireStatus(c, "fcm-2", "pending", push.ReasonNone)
}

func TestBreakerPause(t *testing.T) {
	t.Parallel()
	now := time.Unix(1000, 0)
	br := NewBreaker(BreakerConfig{Threshold: 5, Cooldown: time.Second, Now: func() time.Time { return now }})
	br.Pause(10*time.Second, "503")
	require.Equal(t, BreakerOpen, br.Status().State)
	require.Equal(t, 10*time.Second, br.RetryIn())
	now = now.Add(9 * time.Second)
	require.False(t, br.Allow(), "paused past the cooldown")
	now = now.Add(time.Second)
	require.True(t, br.Allow(), "the probe goes once the pause is over")
	require.Equal(t, BreakerHalfOpen, br.Status().State)
	br.Success()
	require.Equal(t, BreakerClosed, br.Status().State)
}

func TestThrottleWait(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		retryAfter time.Duration
		attempts   int
		want       time.Duration
	}{
		{3 * time.Second, 0, 3 * time.Second},
		{3 * time.Second, 5, 3 * time.Second},
		{0, 0, time.Second},
		{0, 1, 2 * time.Second},
		{0, 3, 8 * time.Second},
		{0, 40, throttleMax},
	} {
		require.Equal(t, tc.want, throttleWait(push.Result{RetryAfter: tc.retryAfter}, tc.attempts), "%+v", tc)
	}
}

// TestThrottledWaitCountsWhatItSkipped is the attempt that skipped a device
// whose throttle had not run out when it began, and had by its end: the
// device is still to send, so the chunk must not complete without it.
func TestThrottledWaitCountsWhatItSkipped(t *testing.T) {
	t.Parallel()
	b := setupFanOut(t)
	w := b.worker(nil, FanOutConfig{})
	now := b.clock.Now()
	c := &running{
		FanOutArgs: FanOutArgs{ExpiresAt: now.Add(time.Hour)},
		Targets: []Target{
			{Target: push.Target{DeviceID: 1}, Channel: ChannelAPNs, NotBefore: now.Add(-time.Millisecond)},
			{Target: push.Target{DeviceID: 2}, Channel: ChannelAPNs},
		},
	}
	results := []push.Result{{}, {Accepted: true, At: time.Now()}}
	waiting, first := w.throttledWait(c, results)
	require.Equal(t, 1, waiting, "the skipped device waits still")
	require.False(t, first.After(now), "its time has come")
}
