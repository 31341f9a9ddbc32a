package jobs

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/riverqueue/river"
	"github.com/stretchr/testify/require"

	"github.com/heraldpush/herald/db"
	"github.com/heraldpush/herald/jobs/push"
	"github.com/heraldpush/herald/jobs/push/apns"
	"github.com/heraldpush/herald/jobs/push/fake"
	"github.com/heraldpush/herald/jobs/push/pushtest"
	"github.com/heraldpush/herald/jobs/push/webpush"
)

// sandboxToken is the APNs token of a debug build's device, which fakepush
// is told is the sandbox's.
const sandboxToken = "5a4db0c0ffee" + "0123456789abcdef0123456789abcdef0123456789abcdef0123"

// providerInstant is a message due at an instant a minute ahead to an APNs
// sandbox device and a Web Push subscription, with the real APNs and Web
// Push clients of a worker pointed at a fakepush that neither has talked to
// yet: as at a daily instant, whose connections went idle and were closed
// long before.
type providerInstant struct {
	b  *fanOutBundle
	fp *pushtest.Fakepush
	c  chunkJob
	at time.Time
}

func setupProviderInstant(t *testing.T) *providerInstant {
	t.Helper()
	ctx := context.Background()
	b := setupFanOut(t)
	fp := pushtest.Start(t)
	fp.Post(t, "/_apns/sandbox-tokens", `{"tokens":["`+sandboxToken+`"]}`, 204)
	sub := fp.Subscribe(t, 1, false)[0]
	users := []string{"debug-phone", "browser"}
	require.NoError(t, b.q.EnsureUsers(ctx, users))
	_, err := b.q.RegisterDevices(ctx, db.RegisterDevicesParams{
		UserIds: users, Channels: []string{ChannelAPNs, ChannelWebPush}, Tokens: []string{sandboxToken, sub.Token},
		P256dhs: []string{"", sub.P256dh}, Auths: []string{"", sub.Auth}, Environments: []string{"sandbox", "production"},
	})
	require.NoError(t, err)
	at := b.clock.Now().Add(time.Minute).Truncate(time.Millisecond)
	c := b.message(users, at, time.Hour)
	_, err = db.PromoteDueJobs(ctx, b.db.Pool, []string{QueueBulk}, 2*time.Minute, 100)
	require.NoError(t, err)
	c.job = b.job(c.job.ID)
	return &providerInstant{b: b, fp: fp, c: c, at: at}
}

// providers are a worker's APNs and Web Push clients of fp, as cmd/herald
// builds them from the variables fakepush writes; none has connected.
func (p *providerInstant) providers(t *testing.T) map[string]Sender {
	t.Helper()
	env := p.fp.Env
	a, err := apns.New(apns.Config{
		KeyFile: env[fake.EnvAPNsKeyFile], KeyID: env[fake.EnvAPNsKeyID], TeamID: env[fake.EnvAPNsTeamID], Topic: env[fake.EnvAPNsTopic],
		Host: env[fake.EnvAPNsHost], SandboxHost: env[fake.EnvAPNsSandboxHost], RootCAs: p.fp.CertPool(),
	})
	require.NoError(t, err)
	t.Cleanup(a.Close)
	egress, err := push.NewEgressPolicy(strings.Split(env[fake.EnvWebPushHosts], ","))
	require.NoError(t, err)
	w, err := webpush.New(webpush.Config{
		VAPIDPublicKey: env[fake.EnvVAPIDPublicKey], VAPIDPrivateKey: env[fake.EnvVAPIDPrivateKey], Subject: env[fake.EnvVAPIDSubject],
		RootCAs: p.fp.CertPool(), Egress: egress,
	})
	require.NoError(t, err)
	t.Cleanup(w.Close)
	return map[string]Sender{ChannelAPNs: a, ChannelWebPush: w}
}

// TestWarmOpensTheProviderConnectionsOfAnInstant: at an instant whose
// provider connections are closed, the first push to an APNs sandbox device
// and the first to a push service each open a connection, a TLS handshake
// inside the instant's second; the instant's warm-up (FanOutWorker.Warm, a
// minute ahead here) opens them instead, so that its pushes open none.
func TestWarmOpensTheProviderConnectionsOfAnInstant(t *testing.T) {
	t.Parallel()
	for _, warm := range []bool{false, true} {
		name := map[bool]string{false: "Cold", true: "Warmed"}[warm]
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			p := setupProviderInstant(t)
			w := p.b.worker(p.providers(t), FanOutConfig{})
			if warm {
				require.NoError(t, w.Warm(context.Background(), QueueBulk, p.at))
			}
			before := p.fp.Stats(t).Connections
			require.Equal(t, river.EventKindJobCompleted, p.b.work(w, p.c).EventKind)
			p.b.requireStatus(p.c, sandboxToken, "accepted", push.ReasonNone)
			p.b.requireStatus(p.c, p.c.targets[1].Token, "accepted", push.ReasonNone)
			after := p.fp.Stats(t).Connections
			opened, sandbox := after.Opened-before.Opened, after.Sandbox-before.Sandbox
			if warm {
				require.Zero(t, opened, "connections the instant's pushes opened after its warm-up")
				return
			}
			require.Equal(t, int64(2), opened, "a cold instant's pushes open the sandbox's connection and the push service's")
			require.Equal(t, int64(1), sandbox)
		})
	}
}

// warmingSender is a recordingSender that opens connections too: it
// records each warm-up's targets, and fails them with err, or, when hang is
// set, holds them until their context ends.
type warmingSender struct {
	*recordingSender
	err  error
	hang bool

	mu     sync.Mutex
	warmed [][]string
}

func (s *warmingSender) WarmFor(ctx context.Context, targets []push.Target) error {
	var tokens []string
	for _, t := range targets {
		tokens = append(tokens, t.Token)
	}
	s.mu.Lock()
	s.warmed = append(s.warmed, tokens)
	s.mu.Unlock()
	if s.hang {
		<-ctx.Done()
		return ctx.Err()
	}
	return s.err
}

// warmups returns the warm-ups' targets since the last call.
func (s *warmingSender) warmups() [][]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := s.warmed
	s.warmed = nil
	return out
}

// dueInAMinute schedules a message to users due a minute from now and
// makes its chunk available, as the Waker finds it ahead of its instant.
func (b *fanOutBundle) dueInAMinute(users []string) (chunkJob, time.Time) {
	b.t.Helper()
	at := b.clock.Now().Add(time.Minute).Truncate(time.Millisecond)
	c := b.message(users, at, time.Hour)
	_, err := db.PromoteDueJobs(context.Background(), b.db.Pool, []string{QueueBulk}, 2*time.Minute, 100)
	require.NoError(b.t, err)
	c.job = b.job(c.job.ID)
	return c, at
}

// TestWarmOpensEachConnectionOnceAWhile: an instant's warm-up asks each
// client once for the connections of its devices (one APNs device of each
// environment's worth, not one a device), and the next instant's, within
// rewarmAfter, asks for none again.
func TestWarmOpensEachConnectionOnceAWhile(t *testing.T) {
	t.Parallel()
	b := setupFanOut(t)
	apnsSender, fcmSender := &warmingSender{recordingSender: &recordingSender{}}, &warmingSender{recordingSender: &recordingSender{}}
	w := b.worker(map[string]Sender{ChannelAPNs: apnsSender, ChannelFCM: fcmSender}, FanOutConfig{})
	c, at := b.dueInAMinute(b.devices("apns-a", "apns-b", "fcm-c", "fcm-d"))

	require.NoError(t, w.Warm(context.Background(), QueueBulk, at))
	require.Equal(t, [][]string{{"apns-a"}}, apnsSender.warmups(), "one production device stands for the environment")
	require.Equal(t, [][]string{{"fcm-c"}}, fcmSender.warmups())

	require.NoError(t, w.Warm(context.Background(), QueueBulk, at))
	require.Empty(t, apnsSender.warmups(), "warmed less than rewarmAfter ago")
	require.Empty(t, fcmSender.warmups())
	require.Equal(t, river.EventKindJobCompleted, b.work(w, c).EventKind)
}

// TestWarmGoesOnWhenAProviderWarmUpFails: a provider warm-up that fails, or
// hangs until the instant, fails neither the warm-up (the chunk is still
// read and its message encoded ahead) nor the chunk, which sends at its
// instant as it would have; and the next instant's warm-up tries again.
func TestWarmGoesOnWhenAProviderWarmUpFails(t *testing.T) {
	t.Parallel()
	b := setupFanOut(t)
	failing := &warmingSender{recordingSender: &recordingSender{}, err: errors.New("tls: handshake failure")}
	hanging := &warmingSender{recordingSender: &recordingSender{}, hang: true}
	w := b.worker(map[string]Sender{ChannelAPNs: failing, ChannelFCM: hanging}, FanOutConfig{})
	c, at := b.dueInAMinute(b.devices("apns-a", "fcm-b"))

	// The Waker's warm-up ends at the instant; this one a moment ahead.
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	require.NoError(t, w.Warm(ctx, QueueBulk, at))
	require.Len(t, failing.warmups(), 1)
	require.Len(t, hanging.warmups(), 1)
	_, cached := w.messages.lookup(c.args)
	require.True(t, cached, "the chunk was read and its message encoded all the same")

	hanging.hang = false
	require.NoError(t, w.Warm(context.Background(), QueueBulk, at))
	require.Len(t, failing.warmups(), 1, "a failed warm-up is tried again at the next instant")
	require.Len(t, hanging.warmups(), 1, "and one the instant cut short")

	require.Equal(t, river.EventKindJobCompleted, b.work(w, c).EventKind)
	b.requireStatus(c, "apns-a", "accepted", push.ReasonNone)
	b.requireStatus(c, "fcm-b", "accepted", push.ReasonNone)
}

// TestWarmOpensAtMostMaxConnWarmups: an instant whose devices name more
// push services than maxConnWarmups has that many opened ahead, not one a
// service: the rest are opened by their first pushes.
func TestWarmOpensAtMostMaxConnWarmups(t *testing.T) {
	t.Parallel()
	b := setupFanOut(t)
	webPush := &warmingSender{recordingSender: &recordingSender{}}
	w := b.worker(map[string]Sender{ChannelWebPush: webPush}, FanOutConfig{})
	var endpoints []string
	for i := range maxConnWarmups + 8 {
		endpoints = append(endpoints, fmt.Sprintf("https://push%02d.example.com/x", i))
	}
	c, at := b.dueInAMinute(b.devices(endpoints...))

	require.NoError(t, w.Warm(context.Background(), QueueBulk, at))
	hosts := map[string]bool{}
	for _, tokens := range webPush.warmups() {
		for _, token := range tokens {
			hosts[push.EndpointHost(token)] = true
		}
	}
	require.Len(t, hosts, maxConnWarmups)
	require.Equal(t, river.EventKindJobCompleted, b.work(w, c).EventKind)
	require.Len(t, webPush.sends(), maxConnWarmups+8, "every device is sent to all the same")
}
