package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"os"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"

	"github.com/heraldpush/herald/api/client"
	"github.com/heraldpush/herald/cmd/herald/heraldbench"
	"github.com/heraldpush/herald/db"
	"github.com/heraldpush/herald/db/dbtest"
	"github.com/heraldpush/herald/jobs/push/fake"
)

// e2e is a running Herald (run() in-process, real PostgreSQL) wired to an
// in-process fakepush over real HTTP/2 and TLS.
type e2e struct {
	t    *testing.T
	fake *fake.Server
	base string
	stop func() error
	// vars is the environment Herald runs with.
	vars map[string]string
	// db is Herald's database, for tests that look under the API.
	db *dbtest.DB
	// api is Herald's generated Go client, calling with testAPIKey: the
	// tests drive the API through it as a Go caller would.
	api *client.ClientWithResponses
}

// startE2E starts fakepush and `herald serve --migrate` with fakepush's env.
// drop removes variables from that env (to disable a channel); extra adds
// or overrides.
func startE2E(t *testing.T, extra map[string]string, drop ...string) *e2e {
	t.Helper()
	return startE2EWith(t, func(vars map[string]string, _ *fake.Server) {
		for _, k := range drop {
			delete(vars, k)
		}
		maps.Copy(vars, extra)
	})
}

// startE2EWith is startE2E for a test that shapes Herald's environment
// from fakepush's itself.
func startE2EWith(t *testing.T, configure func(vars map[string]string, fp *fake.Server)) *e2e {
	t.Helper()
	fp, tdb, vars := e2eEnv(t)
	configure(vars, fp)
	base, stop := startServe(t, vars, "--migrate")
	return &e2e{t: t, fake: fp, base: base, stop: stop, vars: vars, db: tdb, api: newAPIClient(t, base, testAPIKey)}
}

// e2eEnv starts fakepush and clones a migrated database (serve's --migrate
// then finds nothing to do), and returns them with the environment a
// Herald on them runs with.
func e2eEnv(t *testing.T) (*fake.Server, *dbtest.DB, map[string]string) {
	t.Helper()
	return e2eEnvOn(t, dbtest.New(t))
}

// e2eEnvOn is e2eEnv on a database of the test's choosing.
func e2eEnvOn(t *testing.T, tdb *dbtest.DB) (*fake.Server, *dbtest.DB, map[string]string) {
	t.Helper()
	fp, err := fake.New(fake.Config{Addr: "127.0.0.1:0", TLSDir: t.TempDir(), Latency: 5 * time.Millisecond})
	require.NoError(t, err)
	require.NoError(t, fp.Start(context.Background()))
	t.Cleanup(func() { _ = fp.Close() })

	vars := fp.Env()
	vars["DATABASE_URL"] = tdb.URL
	vars["HERALD_API_KEYS"] = testAPIKey
	vars["HERALD_LOG_LEVEL"] = "warn"
	return fp, tdb, vars
}

// newAPIClient is Herald's generated Go client for base, calling with key.
func newAPIClient(t testing.TB, base, key string) *client.ClientWithResponses {
	t.Helper()
	c, err := client.NewClientWithResponses(base, client.WithAPIKey(key))
	require.NoError(t, err)
	return c
}

// answer is what every generated client's response has.
type answer interface {
	StatusCode() int
	GetBody() []byte
}

// answered fails the test unless the call reached Herald and was answered
// status, and returns the answer.
func answered[R answer](t testing.TB, status int, res R, err error) R {
	t.Helper()
	require.NoError(t, err)
	require.Equal(t, status, res.StatusCode(), "%s", res.GetBody())
	return res
}

// requireAPIError checks that res is an error answer with code and, when
// given, field; it returns the error.
func requireAPIError(t testing.TB, res answer, code, field string) client.ErrorDetail {
	t.Helper()
	var body client.ErrorBody
	require.NoError(t, json.Unmarshal(res.GetBody(), &body), "not an error answer: %d %s", res.StatusCode(), res.GetBody())
	require.Equal(t, code, body.Error.Code, "%s", res.GetBody())
	if field != "" {
		require.NotNil(t, body.Error.Field, "%s", res.GetBody())
		require.Equal(t, field, *body.Error.Field, "%s", res.GetBody())
	}
	return body.Error
}

// toUsers addresses users by id.
func toUsers(ids ...string) client.Audience {
	return client.Audience{Type: client.AudienceTypeUsers, IDs: &ids}
}

// titled is a payload with only a title.
func titled(title string) client.Payload { return client.Payload{Title: &title} }

// The helpers below call with context.Background(), not the test's context:
// require.Eventually runs them in a goroutine of its own that may still be
// calling when the test ends, and a cancelled call would then fail it late.

// send schedules a message, which must be accepted.
func (e *e2e) send(m client.NewMessage) client.MessageHead {
	e.t.Helper()
	res, err := e.api.CreateMessageWithResponse(context.Background(), nil, m)
	return *answered(e.t, http.StatusAccepted, res, err).JSON202
}

// message reads a message's status.
func (e *e2e) message(id string) client.MessageStatus {
	e.t.Helper()
	res, err := e.api.GetMessageWithResponse(context.Background(), id)
	return *answered(e.t, http.StatusOK, res, err).JSON200
}

// settle waits until a message is no longer scheduled or dispatching. A
// 503 is an answer to wait on, as a caller would: Herald gives it while
// the database is away, and for a request that met a connection the
// database closed. Any other failure ends the wait at once; it is checked
// outside the polled function, where a failed check would stop
// require.Eventually's goroutine and leave the test to wait out within.
func (e *e2e) settle(id string, within time.Duration) client.MessageStatus {
	e.t.Helper()
	var (
		res *client.GetMessageResponse
		err error
	)
	require.Eventually(e.t, func() bool {
		res, err = e.api.GetMessageWithResponse(context.Background(), id)
		switch {
		case err != nil:
			return true
		case res.StatusCode() == http.StatusServiceUnavailable:
			return false
		case res.StatusCode() != http.StatusOK:
			return true
		}
		return res.JSON200.State != client.MessageStateScheduled && res.JSON200.State != client.MessageStateDispatching
	}, within, 20*time.Millisecond, "message %s did not settle", id)
	return *answered(e.t, http.StatusOK, res, err).JSON200
}

// deliveries reads every page of a message's deliveries in status.
func (e *e2e) deliveries(id string, status client.DeliveryStatus) []client.Delivery {
	e.t.Helper()
	var out []client.Delivery
	params := &client.ListMessageDeliveriesParams{Status: &status, Limit: new(1000)}
	for {
		res, err := e.api.ListMessageDeliveriesWithResponse(context.Background(), id, params)
		page := answered(e.t, http.StatusOK, res, err).JSON200
		out = append(out, page.Items...)
		if page.NextCursor == nil {
			return out
		}
		params.Cursor = page.NextCursor
	}
}

// userDevices reads the first page of a user's devices.
func (e *e2e) userDevices(user string) []client.UserDevice {
	e.t.Helper()
	res, err := e.api.ListUserDevicesWithResponse(context.Background(), user, nil)
	return answered(e.t, http.StatusOK, res, err).JSON200.Items
}

// providers reads /v1/providers.
func (e *e2e) providers() client.Providers {
	e.t.Helper()
	res, err := e.api.GetProvidersWithResponse(context.Background())
	return *answered(e.t, http.StatusOK, res, err).JSON200
}

// registerDevice registers a device that is new, so is answered 201.
func (e *e2e) registerDevice(d client.DeviceRegistration) client.Device {
	e.t.Helper()
	res, err := e.api.RegisterDeviceWithResponse(context.Background(), d)
	return *answered(e.t, http.StatusCreated, res, err).JSON201
}

// registerDevices registers a batch, which must be taken whole.
func (e *e2e) registerDevices(devices []client.DeviceRegistration) client.DeviceBatchResult {
	e.t.Helper()
	res, err := e.api.RegisterDevicesWithResponse(context.Background(), client.DeviceBatch{Devices: devices})
	return *answered(e.t, http.StatusOK, res, err).JSON200
}

// createSchedule creates a schedule, which must be taken.
func (e *e2e) createSchedule(s client.NewSchedule) client.Schedule {
	e.t.Helper()
	res, err := e.api.CreateScheduleWithResponse(context.Background(), nil, s)
	return *answered(e.t, http.StatusCreated, res, err).JSON201
}

// deleteSchedule deletes a schedule, which must exist.
func (e *e2e) deleteSchedule(id string) {
	e.t.Helper()
	res, err := e.api.DeleteScheduleWithResponse(context.Background(), id)
	answered(e.t, http.StatusNoContent, res, err)
}

// putUser sets a user's time zone.
func (e *e2e) putUser(user, timezone string) {
	e.t.Helper()
	res, err := e.api.PutUserWithResponse(context.Background(), user, client.UserUpdate{Timezone: &timezone})
	require.NoError(e.t, err)
	require.Contains(e.t, []int{http.StatusOK, http.StatusCreated}, res.StatusCode(), "%s", res.Body)
}

// listMessages reads the first page of the messages params select.
func (e *e2e) listMessages(params client.ListMessagesParams) []client.MessageStatus {
	e.t.Helper()
	res, err := e.api.ListMessagesWithResponse(context.Background(), &params)
	return answered(e.t, http.StatusOK, res, err).JSON200.Items
}

func hexToken(prefix string) string {
	for {
		b := make([]byte, 32)
		_, _ = rand.Read(b)
		tok := (prefix + hex.EncodeToString(b))[:64]
		// fakepush answers Unregistered to a token that starts "dead", and
		// one random token in 65,536 does: a 12,000-device test met one in
		// about every sixth run, a delivery failed for no reason of its own.
		if prefix != "" || !strings.HasPrefix(tok, "dead") {
			return tok
		}
	}
}

// everyMinute creates a schedule that sends to user every minute, and
// returns its id.
func (e *e2e) everyMinute(user string) string {
	e.t.Helper()
	return e.createSchedule(client.NewSchedule{
		Cron: "* * * * *", Timezone: new("UTC"), Audience: toUsers(user), Payload: titled("every minute"),
	}).ScheduleID
}

// webPush is a fakepush subscription as the API takes it.
func webPush(sub fake.Subscription) *client.WebPushSubscription {
	return &client.WebPushSubscription{Endpoint: sub.Endpoint, Keys: client.WebPushKeys{P256DH: sub.Keys.P256dh, Auth: sub.Keys.Auth}}
}

// register gives user one device per channel; dead tokens when dead.
func (e *e2e) register(user string, dead bool) {
	e.t.Helper()
	prefix := ""
	if dead {
		prefix = "dead"
	}
	sub, err := e.fake.MintSubscription(dead)
	require.NoError(e.t, err)
	e.registerDevice(client.DeviceRegistration{UserID: user, Channel: client.ChannelAPNs, Token: new(hexToken(prefix))})
	e.registerDevice(client.DeviceRegistration{UserID: user, Channel: client.ChannelFCM, Token: new(prefix + "fcm-" + hexToken(""))})
	e.registerDevice(client.DeviceRegistration{UserID: user, Channel: client.ChannelWebPush, Subscription: webPush(sub)})
}

func TestDeliversOncePerDeviceAndEvictsDeadTokens(t *testing.T) {
	t.Parallel()
	e := startE2E(t, nil)
	for _, u := range []string{"ann", "bob", "cy"} {
		e.register(u, false)
	}
	e.register("dee", true)

	// Herald warmed its APNs and FCM connections as it started; fakepush
	// counts that apart, so nothing reads as sent, or rejected, before the
	// first message.
	fresh := e.fake.Stats()
	for _, ch := range []fake.ChannelStats{fresh.APNs, fresh.FCM, fresh.WebPush} {
		require.Zero(t, ch.Received+ch.Accepted+ch.Rejected, "%+v", ch)
	}
	require.Positive(t, fresh.APNs.Warmups)
	require.Positive(t, fresh.FCM.Warmups)

	msg := e.send(client.NewMessage{
		Priority: new(client.PriorityUrgent),
		Audience: toUsers("ann", "bob", "cy", "dee"),
		Payload:  client.Payload{Title: new("Standup"), Body: new("now"), Data: &map[string]string{"room": "blue"}},
	})
	id := msg.MessageID
	require.Equal(t, 12, msg.DeviceCount)
	st := e.settle(id, 30*time.Second)
	require.Equal(t, client.MessageStateDispatched, st.State)
	require.Equal(t, client.DeliveryCounts{Total: 12, Accepted: 9, Failed: 3}, st.Deliveries)
	require.NotNil(t, st.SkewMs)
	require.NotNil(t, st.StartedAt)
	require.NotNil(t, st.SettledAt)

	// fakepush took each live device's push exactly once, with the
	// message id as collapse key.
	receipts := e.fake.Receipts(id)
	require.Len(t, receipts, 9)
	seen := map[string]bool{}
	for _, r := range receipts {
		key := r.Channel + "/" + r.Token
		require.False(t, seen[key], "device %s got the message twice", key)
		seen[key] = true
	}
	stats := e.fake.Stats()
	require.Zero(t, stats.APNs.Duplicates+stats.FCM.Duplicates+stats.WebPush.Duplicates)

	for _, d := range e.deliveries(id, client.DeliveryStatusAccepted) {
		require.NotNil(t, d.AcceptedAt)
		require.NotNil(t, d.SkewMs)
		require.GreaterOrEqual(t, *d.SkewMs, 0.0)
	}
	failed := e.deliveries(id, client.DeliveryStatusFailed)
	require.Len(t, failed, 3)
	for _, d := range failed {
		require.Equal(t, "dee", d.UserID)
		require.Equal(t, new(client.ReasonUnregistered), d.Reason)
	}

	// Dee's devices are evicted, and the next message skips them.
	for _, d := range e.userDevices("dee") {
		require.Equal(t, client.DeviceStatusEvicted, d.Status)
		require.Equal(t, new("unregistered"), d.EvictedReason)
	}
	next := e.send(client.NewMessage{Audience: toUsers("ann", "bob", "cy", "dee"), Payload: titled("again")})
	require.Equal(t, 9, next.DeviceCount)
	require.Equal(t, client.MessageStateDispatched, e.settle(next.MessageID, 30*time.Second).State)
}

func TestDisabledChannelFailsLoudly(t *testing.T) {
	t.Parallel()
	e := startE2E(t, nil, "VAPID_PUBLIC_KEY", "VAPID_PRIVATE_KEY", "VAPID_SUBJECT")
	e.register("ann", false)
	providers := e.providers()
	require.False(t, providers["webpush"].Configured)
	require.True(t, providers["apns"].Configured)

	id := e.send(client.NewMessage{Audience: toUsers("ann"), Payload: titled("hi")}).MessageID
	st := e.settle(id, 30*time.Second)
	require.Equal(t, client.DeliveryCounts{Total: 3, Accepted: 2, Failed: 1}, st.Deliveries)
	failed := e.deliveries(id, client.DeliveryStatusFailed)
	require.Len(t, failed, 1)
	require.Equal(t, client.ChannelWebPush, failed[0].Channel)
	require.Equal(t, new(client.ReasonChannelDisabled), failed[0].Reason)
}

func TestProviderDownForTheWholeLifetime(t *testing.T) {
	t.Parallel()
	e := startE2E(t, nil)
	require.NoError(t, e.fake.SetControl(fake.Control{Channel: "apns", Mode: fake.ModeUnavailable}))
	const devices = 40
	var batch []client.DeviceRegistration
	var users []string
	for i := range devices {
		u := fmt.Sprintf("u%d", i)
		users = append(users, u)
		batch = append(batch, client.DeviceRegistration{UserID: u, Channel: client.ChannelAPNs, Token: new(hexToken(""))})
	}
	e.registerDevices(batch)

	// Counted in case anything was pushed before (warm-ups are counted apart).
	before := e.fake.Stats().APNs.Received
	lifetime := 4 * time.Second
	now := time.Now()
	id := e.send(client.NewMessage{
		DispatchAt: &now,
		ExpiresAt:  new(now.Add(lifetime)),
		Audience:   toUsers(users...),
		Payload:    titled("down"),
	}).MessageID
	st := e.settle(id, lifetime+20*time.Second)
	require.Equal(t, client.MessageStateExpired, st.State)
	require.Equal(t, client.DeliveryCounts{Total: 40, Expired: 40}, st.Deliveries)
	for _, d := range e.deliveries(id, client.DeliveryStatusExpired) {
		require.Equal(t, new(client.ReasonProviderUnavailable), d.Reason, "an expired delivery says what held it back")
	}

	// The provider saw the first burst (sends already in flight when the
	// breaker opened) and then only the breaker's probes: one after 1 s,
	// 2 s after that, within the 4 s lifetime; never a retry storm.
	received := e.fake.Stats().APNs.Received - before
	t.Logf("fakepush received %d APNs requests for %d devices over a %s lifetime", received, devices, lifetime)
	require.LessOrEqual(t, received, int64(devices+3))

	apns := e.providers()["apns"]
	require.Contains(t, []client.BreakerState{client.BreakerStateOpen, client.BreakerStateHalfOpen}, apns.State, "%+v", apns)
	require.NotNil(t, apns.LastError)
	require.NotEmpty(t, *apns.LastError)
}

func TestUrgentIsNotBlockedByBulk(t *testing.T) {
	t.Parallel()
	e := startE2E(t, nil)
	// A provider round trip of 200 ms makes the bulk fan-out take a while
	// (some seconds) without the CPU that many more devices would cost.
	latency := 200
	require.NoError(t, e.fake.SetControl(fake.Control{Channel: "fcm", LatencyMS: &latency}))

	const bulkDevices = 1500
	var users []string
	var batch []client.DeviceRegistration
	for i := range bulkDevices {
		u := fmt.Sprintf("b%d", i)
		users = append(users, u)
		batch = append(batch, client.DeviceRegistration{UserID: u, Channel: client.ChannelFCM, Token: new(fmt.Sprintf("bulk-token-%d", i))})
	}
	e.registerDevices(batch)
	e.registerDevice(client.DeviceRegistration{UserID: "otp", Channel: client.ChannelFCM, Token: new("urgent-token")})

	bulkID := e.send(client.NewMessage{Priority: new(client.PriorityBulk), Audience: toUsers(users...), Payload: titled("digest")}).MessageID
	// Once the bulk message is dispatching, the urgent one goes out.
	require.Eventually(t, func() bool {
		return e.message(bulkID).State == client.MessageStateDispatching
	}, 20*time.Second, 5*time.Millisecond)
	urgentID := e.send(client.NewMessage{Priority: new(client.PriorityUrgent), Audience: toUsers("otp"), Payload: titled("code 123456")}).MessageID

	urgentSt := e.settle(urgentID, 30*time.Second)
	bulkSt := e.settle(bulkID, 60*time.Second)
	require.Equal(t, 1, urgentSt.Deliveries.Accepted)
	require.Equal(t, bulkDevices, bulkSt.Deliveries.Accepted)

	urgentAt := e.deliveries(urgentID, client.DeliveryStatusAccepted)[0].AcceptedAt
	require.NotNil(t, urgentAt)
	require.NotNil(t, bulkSt.SettledAt)
	require.NotNil(t, urgentSt.SkewMs)
	t.Logf("urgent skew %v ms; bulk skew %+v", urgentSt.SkewMs.Max, bulkSt.SkewMs)
	require.True(t, urgentAt.Before(*bulkSt.SettledAt), "the urgent push waited for the bulk fan-out to finish")
}

// TestDeviceDeletedBeforeDispatchGetsNothing deletes a device between
// the schedule and the due instant: the chunk that carries its token must
// not send to it, and its delivery must read cancelled.
func TestDeviceDeletedBeforeDispatchGetsNothing(t *testing.T) {
	t.Parallel()
	e := startE2E(t, nil)
	e.register("ann", false)
	e.register("bob", false)
	id := e.send(client.NewMessage{
		DispatchAt: new(time.Now().Add(3 * time.Second)),
		Audience:   toUsers("ann", "bob"),
		Payload:    titled("after a logout"),
	}).MessageID
	var gone *client.UserDevice
	for _, d := range e.userDevices("ann") {
		if d.Channel == client.ChannelAPNs {
			gone = &d
		}
	}
	require.NotNil(t, gone)
	res, err := e.api.DeleteDeviceWithResponse(t.Context(), gone.DeviceID)
	answered(t, http.StatusNoContent, res, err)
	require.Equal(t, client.MessageStateScheduled, e.message(id).State, "the delete must come before the due instant")

	st := e.settle(id, 30*time.Second)
	require.Equal(t, client.DeliveryCounts{Total: 6, Accepted: 5, Cancelled: 1}, st.Deliveries)
	cancelled := e.deliveries(id, client.DeliveryStatusCancelled)
	require.Len(t, cancelled, 1)
	require.Equal(t, gone.DeviceID, cancelled[0].DeviceID)
	receipts := e.fake.Receipts(id)
	require.Len(t, receipts, 5)
	require.NotNil(t, gone.Token)
	for _, r := range receipts {
		require.NotEqual(t, *gone.Token, r.Token, "the deleted device was sent the push")
	}
}

// TestLanesSplitAcrossProcesses runs the bulk lane and the urgent lane in
// processes of their own (HERALD_LANES), as a deployment that keeps urgent
// pushes off saturated bulk workers does: each process works its own lane's
// chunks and never the other's.
func TestLanesSplitAcrossProcesses(t *testing.T) {
	t.Parallel()
	e := startE2E(t, map[string]string{"HERALD_LANES": "bulk", "HERALD_CHUNK_SIZE": "10"})
	urgentVars := maps.Clone(e.vars)
	urgentVars["HERALD_LANES"] = "urgent"
	urgentBase, _ := startServe(t, urgentVars, "--role", "worker")

	// Four bulk chunks and five urgent messages: were the lanes ignored,
	// each would go to either process.
	var batch []client.DeviceRegistration
	var users []string
	for i := range 40 {
		users = append(users, fmt.Sprintf("b%d", i))
		batch = append(batch, client.DeviceRegistration{UserID: users[i], Channel: client.ChannelFCM, Token: new(fmt.Sprintf("lane-token-%d", i))})
	}
	e.registerDevices(batch)
	bulk := e.send(client.NewMessage{Audience: toUsers(users...), Payload: titled("digest")})
	require.Equal(t, 4, bulk.ChunkCount)
	ids := []string{bulk.MessageID}
	for i := range 5 {
		ids = append(ids, e.send(client.NewMessage{
			Priority: new(client.PriorityUrgent), Audience: toUsers(users[i]), Payload: titled("code"),
		}).MessageID)
	}
	for _, id := range ids {
		require.Equal(t, client.MessageStateDispatched, e.settle(id, 30*time.Second).State, id)
	}

	// Each process counts what it sent just after its write commits.
	sent := func(base, priority string) float64 {
		families, err := heraldbench.ScrapeMetrics(base)
		require.NoError(t, err)
		return heraldbench.MetricSum(families, "herald_delivery_skew_seconds", map[string]string{"priority": priority})
	}
	require.Eventually(t, func() bool {
		return sent(e.base, "bulk") == 40 && sent(urgentBase, "urgent") == 5
	}, 30*time.Second, 20*time.Millisecond, "the lanes' deliveries were never counted where they belong")
	require.Zero(t, sent(e.base, "urgent"), "the bulk-lane process worked an urgent chunk")
	require.Zero(t, sent(urgentBase, "bulk"), "the urgent-lane worker worked a bulk chunk")
}

// TestScheduleEveryMinute runs an every-minute schedule through the
// real binary: its runs become messages, one per run, each delivered once
// through fakepush with counters of its own. Waiting for real minutes to
// pass would take one to two of them, so the test puts the schedule where a
// Herald that was down for the last few minutes finds it: its next run a
// few minutes back (the one query the materializer advances it with).
// Herald's own materializer then makes the runs still alive, and they are
// sent at once, late, as docs/api.md says of missed runs. That each run is
// made ahead of its instant and its lane woken at it is covered, on a clock
// the tests control, in jobs (TestMaterialize*, TestWaker*).
func TestScheduleEveryMinute(t *testing.T) {
	t.Parallel()
	e := startE2E(t, map[string]string{"HERALD_MATERIALIZE_EVERY": "200ms", "HERALD_SCHEDULE_LEAD": "1s"})
	e.register("ann", false)
	id := e.everyMinute("ann")
	scheduleID, err := strconv.ParseInt(strings.TrimPrefix(id, "sch_"), 10, 64)
	require.NoError(t, err)

	ctx := context.Background()
	q := db.On(e.db.Pool)
	now, err := q.DatabaseNow(ctx)
	require.NoError(t, err)
	// The three runs up to now: two minutes back, one, and this minute's.
	first := now.UTC().Truncate(time.Minute).Add(-2 * time.Minute)
	require.NoError(t, q.AdvanceSchedule(ctx, db.AdvanceScheduleParams{ID: scheduleID, NextRunAt: &first}))

	var runs []client.MessageStatus
	require.Eventually(t, func() bool {
		runs = runs[:0]
		for _, m := range e.listMessages(client.ListMessagesParams{State: new(client.MessageStateDispatched), ScheduleID: &id}) {
			if !m.DispatchAt.After(now) {
				runs = append(runs, m)
			}
		}
		return len(runs) >= 3
		// The wait ends as soon as the runs are delivered (a few seconds
		// alone); its bound leaves room for a machine busy with the
		// package's other end-to-end tests.
	}, 45*time.Second, 100*time.Millisecond, "the three runs up to now were not delivered")

	// Every message of the schedule, dispatched or still to come, is one run.
	perRun := map[time.Time]int{}
	for _, m := range e.listMessages(client.ListMessagesParams{ScheduleID: &id}) {
		perRun[m.DispatchAt]++
	}
	require.Len(t, runs, 3)
	for i, m := range runs {
		// Pages are newest first.
		want := first.Add(time.Duration(2-i) * time.Minute)
		require.Equal(t, want, m.DispatchAt, "runs are on the minute, one a minute")
		require.Equal(t, 1, perRun[want], "run %s was made into %d messages", want, perRun[want])
		require.Equal(t, &id, m.ScheduleID)
		require.Equal(t, client.DeliveryCounts{Total: 3, Accepted: 3}, m.Deliveries)
		require.Len(t, e.fake.Receipts(m.MessageID), 3, "each device got each run once")
	}
	stats := e.fake.Stats()
	require.Zero(t, stats.APNs.Duplicates+stats.FCM.Duplicates+stats.WebPush.Duplicates)
	e.deleteSchedule(id)
}

// TestMetricsAfterDispatch scrapes /metrics after a dispatch and finds
// the delivery counters, the skew histogram and the process gauges.
func TestMetricsAfterDispatch(t *testing.T) {
	t.Parallel()
	e := startE2E(t, nil)
	e.register("ann", false)
	e.register("dee", true)
	e.settle(e.send(client.NewMessage{Audience: toUsers("ann", "dee"), Payload: titled("metrics")}).MessageID, 30*time.Second)
	// A chunk counts its deliveries just after its write commits, so the
	// API can show the message settled a moment before the counters move.
	var families map[string]*dto.MetricFamily
	require.Eventually(t, func() bool {
		var err error
		if families, err = heraldbench.ScrapeMetrics(e.base); err != nil {
			return false
		}
		return heraldbench.MetricSum(families, "herald_deliveries_total", nil) == 6
	}, 30*time.Second, 20*time.Millisecond, "the six deliveries were never counted")

	value := func(name string, labels map[string]string) float64 {
		t.Helper()
		_, ok := families[name]
		require.True(t, ok, "no %s in /metrics", name)
		return heraldbench.MetricSum(families, name, labels)
	}
	require.EqualValues(t, 1, value("herald_build_info", map[string]string{"version": version, "go_version": runtime.Version(), "river_version": readBuildInfo().River}))
	for _, channel := range []string{"apns", "fcm", "webpush"} {
		require.EqualValues(t, 1, value("herald_deliveries_total", map[string]string{"channel": channel, "status": "accepted", "reason": ""}))
		require.EqualValues(t, 1, value("herald_deliveries_total", map[string]string{"channel": channel, "status": "failed", "reason": "unregistered"}))
		require.EqualValues(t, 1, value("herald_breaker_state", map[string]string{"channel": channel, "state": "closed"}))
		require.GreaterOrEqual(t, value("herald_provider_request_seconds", map[string]string{"channel": channel, "outcome": "accepted"}), 1.0)
	}
	require.EqualValues(t, 3, value("herald_delivery_skew_seconds", map[string]string{"priority": "bulk"}))
	skew := families["herald_delivery_skew_seconds"].GetMetric()[0].GetHistogram()
	require.Greater(t, len(skew.GetBucket()), 10, "buckets fine enough below a second")
	require.EqualValues(t, 1, value("herald_message_skew_max_seconds", map[string]string{"priority": "bulk"}), "the message was graded once")
	value("herald_database_clock_offset_seconds", nil)
	value("herald_chunks_in_flight", map[string]string{"lane": "bulk"})
	// The database's gauges (read in the background; the message settled,
	// so nothing is unsettled once they are read again), the pools, and
	// the requests by route.
	value("herald_messages", map[string]string{"state": "dispatching"})
	value("herald_river_jobs", map[string]string{"queue": "bulk", "state": "available"})
	require.Positive(t, value("herald_db_pool_max_connections", map[string]string{"pool": "main"}))
	require.Positive(t, value("herald_db_pool_acquires_total", map[string]string{"pool": "main"}))
	require.GreaterOrEqual(t, value("herald_http_requests_total", map[string]string{"route": "/v1/messages", "method": "POST", "status": "202"}), 1.0)
	require.GreaterOrEqual(t, value("herald_http_request_seconds", map[string]string{"route": "/v1/messages/:message_id", "method": "GET"}), 1.0)

	// The Grafana dashboard in deploy/ draws only what Herald exports.
	raw, err := os.ReadFile("../../deploy/grafana/herald.json")
	require.NoError(t, err)
	var dashboard struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	require.NoError(t, json.Unmarshal(raw, &dashboard))
	require.NotEmpty(t, dashboard.Panels)
	for _, p := range dashboard.Panels {
		require.NotEmpty(t, p.Targets, "panel %q has no query", p.Title)
		for _, target := range p.Targets {
			names := regexp.MustCompile(`herald_[a-z_]+`).FindAllString(target.Expr, -1)
			require.NotEmpty(t, names, "panel %q queries no Herald metric", p.Title)
			for _, n := range names {
				base := n
				for _, suffix := range []string{"_bucket", "_count", "_sum"} {
					if f, ok := families[strings.TrimSuffix(n, suffix)]; ok && strings.HasSuffix(n, suffix) && f.GetType() == dto.MetricType_HISTOGRAM {
						base = strings.TrimSuffix(n, suffix)
					}
				}
				_, ok := families[base]
				require.True(t, ok, "panel %q queries %s, which /metrics does not have", p.Title, n)
			}
		}
	}
}
