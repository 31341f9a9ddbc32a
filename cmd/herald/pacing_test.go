package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/heraldpush/herald/api/client"
	"github.com/heraldpush/herald/cmd/herald/heraldbench"
	"github.com/heraldpush/herald/jobs/push/fake"
)

// TestWebPushHungServiceHoldsBackOnlyItself has one caller's devices on a
// push service that holds every request unanswered, at two requests in
// flight per service: the chunk to them takes that service's two and
// waits. Another caller's message, on another service in the same lane, is
// sent and settled while those requests are still held (none has timed
// out yet). With one in-flight bound for every push service, it waited for
// the hung service's requests to time out.
func TestWebPushHungServiceHoldsBackOnlyItself(t *testing.T) {
	t.Parallel()
	latency := int((10 * time.Minute).Milliseconds())
	e, hung := startE2EWithSecondPushService(t, fake.Control{Channel: "webpush", LatencyMS: &latency}, func(vars map[string]string) {
		vars["HERALD_MAX_IN_FLIGHT_WEBPUSH"] = "2"
		// The hung requests are cut short at the end, not waited for.
		vars["HERALD_SHUTDOWN_TIMEOUT"] = "1s"
	})
	e.sendToNewSubscriptions(hung, "mallory", 4, "into the void")
	require.Eventually(t, func() bool { return hung.Stats().WebPush.Received == 2 },
		20*time.Second, 10*time.Millisecond, "the hung service's requests are in flight")

	sub, err := e.fake.MintSubscription(false)
	require.NoError(t, err)
	e.registerDevice(client.DeviceRegistration{UserID: "alice", Channel: client.ChannelWebPush, Subscription: webPush(sub)})
	id := e.send(client.NewMessage{Audience: toUsers("alice"), Payload: titled("on time")}).MessageID
	st := e.settle(id, 20*time.Second)
	unanswered, err := heraldbench.UnansweredSends(e.base)
	require.NoError(t, err)
	require.Zero(t, unanswered, "alice's push was sent while the hung service's requests were still held")
	require.Equal(t, 1, st.Deliveries.Accepted, "%+v", st)
	require.Len(t, e.fake.Receipts(id), 1)
	require.Equal(t, int64(2), hung.Stats().WebPush.Received, "the hung service kept to its own bound")
}

// startE2EWithSecondPushService starts a second fakepush, another push
// service on another host, its Web Push steered by control, and Herald
// trusting both services' CAs and admitting both hosts, with configure
// applied to its environment.
func startE2EWithSecondPushService(t *testing.T, control fake.Control, configure func(vars map[string]string)) (*e2e, *fake.Server) {
	t.Helper()
	second, err := fake.New(fake.Config{Addr: "127.0.0.1:0", TLSDir: t.TempDir()})
	require.NoError(t, err)
	require.NoError(t, second.Start(context.Background()))
	t.Cleanup(func() { _ = second.Close() })
	require.NoError(t, second.SetControl(control))
	e := startE2EWith(t, func(vars map[string]string, main *fake.Server) {
		both := filepath.Join(t.TempDir(), "ca.pem")
		require.NoError(t, os.WriteFile(both, append(main.CACertPEM(), second.CACertPEM()...), 0o600))
		vars["SSL_CERT_FILE"] = both
		vars["HERALD_WEBPUSH_HOSTS"] += "," + strings.TrimPrefix(second.URL(), "https://")
		configure(vars)
	})
	return e, second
}

// sendToNewSubscriptions registers n Web Push devices of user, subscribed
// on the push service fp, and sends user a message titled title.
func (e *e2e) sendToNewSubscriptions(fp *fake.Server, user string, n int, title string) client.MessageHead {
	e.t.Helper()
	for range n {
		sub, err := fp.MintSubscription(false)
		require.NoError(e.t, err)
		e.registerDevice(client.DeviceRegistration{UserID: user, Channel: client.ChannelWebPush, Subscription: webPush(sub)})
	}
	return e.send(client.NewMessage{Audience: toUsers(user), Payload: titled(title)})
}
