package main

import (
	"context"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/heraldpush/herald/api/client"
	"github.com/heraldpush/herald/jobs/push/fake"
	"github.com/heraldpush/herald/jobs/push/pushtest"
)

// TestAttackWebPushEndpointsCannotReachInside registers Web Push endpoints
// that name an internal service in every spelling a caller could try: each
// is refused with a 400 naming the field. An endpoint stored before the
// policy (written straight to the database, as an older Herald stored any
// https URL) is refused when sending, and its delivery fails
// endpoint_forbidden. The service never receives a connection.
func TestAttackWebPushEndpointsCannotReachInside(t *testing.T) {
	t.Parallel()
	e := startE2E(t, nil)
	inside := pushtest.StartInside(t)
	port := inside.Port
	sub, err := e.fake.MintSubscription(false)
	require.NoError(t, err)

	for _, endpoint := range []string{
		"https://127.0.0.1:" + port + "/",
		"https://localhost:" + port + "/",
		"https://127.0.0.2:" + port + "/",
		"https://0.0.0.0:" + port + "/",
		"https://[::ffff:127.0.0.1]:" + port + "/",
		"https://[::1]:" + port + "/",
		"https://169.254.169.254/latest/meta-data/",
		"https://10.0.0.1/",
		"https://user:pw@" + strings.TrimPrefix(e.fake.URL(), "https://") + "/webpush/x",
		"http://127.0.0.1:" + port + "/",
	} {
		s := webPush(sub)
		s.Endpoint = endpoint
		res, err := e.api.RegisterDeviceWithResponse(t.Context(), client.DeviceRegistration{UserID: "mallory", Channel: client.ChannelWebPush, Subscription: s})
		answered(t, http.StatusBadRequest, res, err)
		requireAPIError(t, res, "invalid_field", "subscription.endpoint")
	}

	// A device stored before the policy existed.
	pool := e.db.Pool
	ctx := context.Background()
	_, err = pool.Exec(ctx, `INSERT INTO users (id) VALUES ('mallory') ON CONFLICT DO NOTHING`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO devices (user_id, channel, token, p256dh, auth) VALUES ('mallory', 'webpush', $1, $2, $3)`,
		"https://localhost:"+port+"/stolen", sub.Keys.P256dh, sub.Keys.Auth)
	require.NoError(t, err)

	id := e.send(client.NewMessage{Audience: toUsers("mallory"), Payload: titled("probe")}).MessageID
	st := e.settle(id, 30*time.Second)
	require.Equal(t, 1, st.Deliveries.Failed, "%+v", st)
	failed := e.deliveries(id, client.DeliveryStatusFailed)
	require.Len(t, failed, 1)
	require.Equal(t, new(client.ReasonEndpointForbidden), failed[0].Reason)
	require.Zero(t, inside.Connections(), "the internal service received a connection")
}

// TestAttackWebPushEndpointsCannotReachControls is issue #26's item 5: an
// endpoint on a trusted push host (here fakepush, as make run and the tests
// add it to HERALD_WEBPUSH_HOSTS) whose path names one of fakepush's
// control endpoints made Herald POST to it: /_reset wiped every record.
// Each spelling is refused at registration with a 400 naming the field, and
// one stored before the rule is refused when sending (endpoint_forbidden):
// the push already recorded survives.
func TestAttackWebPushEndpointsCannotReachControls(t *testing.T) {
	t.Parallel()
	e := startE2E(t, nil)
	sub, err := e.fake.MintSubscription(false)
	require.NoError(t, err)
	e.registerDevice(client.DeviceRegistration{UserID: "alice", Channel: client.ChannelWebPush, Subscription: webPush(sub)})
	kept := e.send(client.NewMessage{Audience: toUsers("alice"), Payload: titled("kept")}).MessageID
	st := e.settle(kept, 30*time.Second)
	require.Equal(t, 1, st.Deliveries.Accepted, "%+v", st)
	require.Len(t, e.fake.Receipts(kept), 1)

	for _, path := range []string{"/_reset", "/_control", "/%5Freset", "/webpush/../_reset", "/webpush/%2e%2e/_reset"} {
		s := webPush(sub)
		s.Endpoint = e.fake.URL() + path
		res, err := e.api.RegisterDeviceWithResponse(t.Context(), client.DeviceRegistration{UserID: "mallory", Channel: client.ChannelWebPush, Subscription: s})
		answered(t, http.StatusBadRequest, res, err)
		requireAPIError(t, res, "invalid_field", "subscription.endpoint")
	}

	// A device stored before the rule.
	pool := e.db.Pool
	_, err = pool.Exec(t.Context(), `INSERT INTO users (id) VALUES ('mallory') ON CONFLICT DO NOTHING`)
	require.NoError(t, err)
	_, err = pool.Exec(t.Context(), `INSERT INTO devices (user_id, channel, token, p256dh, auth) VALUES ('mallory', 'webpush', $1, $2, $3)`,
		e.fake.URL()+"/_reset", sub.Keys.P256dh, sub.Keys.Auth)
	require.NoError(t, err)
	id := e.send(client.NewMessage{Audience: toUsers("mallory"), Payload: titled("reset")}).MessageID
	st = e.settle(id, 30*time.Second)
	require.Equal(t, 1, st.Deliveries.Failed, "%+v", st)
	failed := e.deliveries(id, client.DeliveryStatusFailed)
	require.Len(t, failed, 1)
	require.Equal(t, new(client.ReasonEndpointForbidden), failed[0].Reason)
	require.Len(t, e.fake.Receipts(kept), 1, "fakepush was reset through a push endpoint")
}

// TestAttackWebPushOneCallerCannotParkOthers has one caller register
// subscriptions on a push service that fails every push, and schedule to
// them: that service's breaker opens. Another caller's urgent push to a
// healthy push service is still sent at once. With one breaker for all of
// Web Push it was parked until the breaker's cooldown (a minute here) had
// passed. /v1/providers shows the failing service by name, without its
// answer's body.
func TestAttackWebPushOneCallerCannotParkOthers(t *testing.T) {
	t.Parallel()
	// Herald trusts both push services' CAs and admits both hosts.
	e, failing := startE2EWithSecondPushService(t, fake.Control{Channel: "webpush", Mode: fake.ModeUnavailable}, func(vars map[string]string) {
		vars["HERALD_BREAKER_COOLDOWN"] = "1m"
	})

	e.sendToNewSubscriptions(failing, "mallory", 5, "noise")
	var providers client.Providers
	require.Eventually(t, func() bool {
		providers = e.providers()
		return providers["webpush"].State == client.BreakerStateOpen
	}, 30*time.Second, 50*time.Millisecond, "the failing push service's breaker did not open")

	sub, err := e.fake.MintSubscription(false)
	require.NoError(t, err)
	e.registerDevice(client.DeviceRegistration{UserID: "alice", Channel: client.ChannelWebPush, Subscription: webPush(sub)})
	id := e.send(client.NewMessage{
		Priority: new(client.PriorityUrgent), Audience: toUsers("alice"), Payload: titled("your train leaves in 5 minutes"),
	}).MessageID
	// Far below the one-minute cooldown that would hold a parked push.
	st := e.settle(id, 20*time.Second)
	require.Equal(t, 1, st.Deliveries.Accepted, "%+v", st)
	require.Len(t, e.fake.Receipts(id), 1)

	lastError := providers["webpush"].LastError
	require.NotNil(t, lastError)
	require.Equal(t, strings.TrimPrefix(failing.URL(), "https://")+": push service answered 503 Service Unavailable", *lastError,
		"the push service is named, and its answer's body is not shown")
}

// TestAttackWebPushErasedTokenLeavesNoTrace is issue #26's item 1: when a
// Web Push send failed at the network level, the error kept, shown in GET
// /v1/providers (and so the dashboard) and logged with "chunk parked" was
// the HTTP client's, which quotes the endpoint URL: the subscription's
// token. After DELETE /v1/users/{id} answered 204 it was still in all
// three. Now what is kept, shown and logged of a failed send names the
// push service's host and the error's class, never the endpoint.
func TestAttackWebPushErasedTokenLeavesNoTrace(t *testing.T) {
	t.Parallel()
	fp, tdb, vars := e2eEnv(t)
	// A push service that refuses connections: a port nothing listens on,
	// which the operator admitted.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	closed := ln.Addr().String()
	require.NoError(t, ln.Close())
	vars["HERALD_WEBPUSH_HOSTS"] += "," + closed
	base, _, log, stop := startServeLog(t, vars, "--migrate")
	e := &e2e{t: t, fake: fp, base: base, stop: stop, vars: vars, db: tdb, api: newAPIClient(t, base, testAPIKey)}

	const token = "erin-subscription-secret-7f3a9c"
	sub, err := fp.MintSubscription(false)
	require.NoError(t, err)
	s := webPush(sub)
	s.Endpoint = "https://" + closed + "/webpush/" + token
	e.registerDevice(client.DeviceRegistration{UserID: "erin", Channel: client.ChannelWebPush, Subscription: s})
	e.send(client.NewMessage{Audience: toUsers("erin"), Payload: titled("hello")})

	var lastError string
	require.Eventually(t, func() bool {
		if le := e.providers()["webpush"].LastError; le != nil {
			lastError = *le
		}
		return lastError != "" && strings.Contains(log.String(), "chunk parked")
	}, 30*time.Second, 50*time.Millisecond, "the failing push service was not noticed")
	require.NotContains(t, lastError, token)
	require.Contains(t, lastError, closed, "the push service is named")
	require.Contains(t, lastError, "connection refused", "the error's class is named")

	res, err := e.api.DeleteUserWithResponse(t.Context(), "erin")
	answered(t, http.StatusNoContent, res, err)
	raw, err := e.api.GetProvidersWithResponse(t.Context())
	answered(t, http.StatusOK, raw, err)
	require.NotContains(t, string(raw.Body), token, "GET /v1/providers")
	require.NotContains(t, log.String(), token, "the log")
	var stored int
	require.NoError(t, tdb.Pool.QueryRow(t.Context(),
		`SELECT count(*) FROM provider_status WHERE last_error LIKE '%' || $1 || '%'`, token).Scan(&stored))
	require.Zero(t, stored, "provider_status")
}
