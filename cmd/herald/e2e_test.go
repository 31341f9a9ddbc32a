package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"

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
	return &e2e{t: t, fake: fp, base: base, stop: stop, vars: vars, db: tdb}
}

// e2eEnv starts fakepush and makes an empty database, and returns them with
// the environment a Herald on them runs with.
func e2eEnv(t *testing.T) (*fake.Server, *dbtest.DB, map[string]string) {
	t.Helper()
	fp, err := fake.New(fake.Config{Addr: "127.0.0.1:0", TLSDir: t.TempDir(), Latency: 5 * time.Millisecond})
	require.NoError(t, err)
	require.NoError(t, fp.Start(context.Background()))
	t.Cleanup(func() { _ = fp.Close() })

	tdb := dbtest.NewEmpty(t)
	vars := fp.Env()
	vars["DATABASE_URL"] = tdb.URL
	vars["HERALD_API_KEYS"] = testAPIKey
	vars["HERALD_LOG_LEVEL"] = "warn"
	return fp, tdb, vars
}

// call makes an API call and decodes the JSON answer.
func (e *e2e) call(method, path string, body any) (int, map[string]any) {
	e.t.Helper()
	status, _, out := e.callAs(testAPIKey, method, path, body)
	return status, out
}

// callAs makes an API call with key and returns the status, the headers and
// the decoded JSON answer.
func (e *e2e) callAs(key, method, path string, body any) (int, http.Header, map[string]any) {
	e.t.Helper()
	var raw []byte
	if body != nil {
		var err error
		raw, err = json.Marshal(body)
		require.NoError(e.t, err)
	}
	req, err := http.NewRequest(method, e.base+path, bytes.NewReader(raw))
	require.NoError(e.t, err)
	req.Header.Set("Authorization", "Bearer "+key)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(e.t, err)
	defer resp.Body.Close()
	var out map[string]any
	if resp.StatusCode != http.StatusNoContent {
		require.NoError(e.t, json.NewDecoder(resp.Body).Decode(&out))
	}
	return resp.StatusCode, resp.Header, out
}

func (e *e2e) must(status int, method, path string, body any) map[string]any {
	e.t.Helper()
	got, out := e.call(method, path, body)
	require.Equal(e.t, status, got, "%s %s: %v", method, path, out)
	return out
}

// settle waits until a message is no longer scheduled or dispatching.
func (e *e2e) settle(id string, within time.Duration) map[string]any {
	e.t.Helper()
	var st map[string]any
	require.Eventually(e.t, func() bool {
		st = e.must(http.StatusOK, http.MethodGet, "/v1/messages/"+id, nil)
		return st["state"] != "scheduled" && st["state"] != "dispatching"
	}, within, 20*time.Millisecond, "message %s did not settle", id)
	return st
}

func (e *e2e) deliveries(id, status string) []map[string]any {
	e.t.Helper()
	var out []map[string]any
	cursor := ""
	for {
		path := "/v1/messages/" + id + "/deliveries?limit=1000&status=" + status
		if cursor != "" {
			path += "&cursor=" + cursor
		}
		page := e.must(http.StatusOK, http.MethodGet, path, nil)
		for _, it := range page["items"].([]any) {
			out = append(out, it.(map[string]any))
		}
		next, _ := page["next_cursor"].(string)
		if next == "" {
			return out
		}
		cursor = next
	}
}

func hexToken(prefix string) string {
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	return (prefix + hex.EncodeToString(b))[:64]
}

// everyMinute creates a schedule that sends to user every minute, and
// returns its id.
func (e *e2e) everyMinute(user string) string {
	e.t.Helper()
	sch := e.must(http.StatusCreated, http.MethodPost, "/v1/schedules", map[string]any{
		"cron": "* * * * *", "timezone": "UTC",
		"audience": map[string]any{"type": "users", "ids": []string{user}},
		"payload":  map[string]any{"title": "every minute"},
	})
	return sch["schedule_id"].(string)
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
	e.must(http.StatusCreated, http.MethodPost, "/v1/devices", map[string]any{"user_id": user, "channel": "apns", "token": hexToken(prefix)})
	e.must(http.StatusCreated, http.MethodPost, "/v1/devices", map[string]any{"user_id": user, "channel": "fcm", "token": prefix + "fcm-" + hexToken("")})
	e.must(http.StatusCreated, http.MethodPost, "/v1/devices", map[string]any{"user_id": user, "channel": "webpush", "subscription": sub})
}

func TestE2EDeliversOncePerDeviceAndEvictsDeadTokens(t *testing.T) {
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

	msg := e.must(http.StatusAccepted, http.MethodPost, "/v1/messages", map[string]any{
		"priority": "urgent",
		"audience": map[string]any{"type": "users", "ids": []string{"ann", "bob", "cy", "dee"}},
		"payload":  map[string]any{"title": "Standup", "body": "now", "data": map[string]any{"room": "blue"}},
	})
	id := msg["message_id"].(string)
	require.EqualValues(t, 12, msg["device_count"])
	st := e.settle(id, 30*time.Second)
	require.Equal(t, "dispatched", st["state"])
	require.Equal(t, map[string]any{"total": 12.0, "accepted": 9.0, "failed": 3.0, "expired": 0.0, "cancelled": 0.0, "pending": 0.0}, st["deliveries"])
	require.NotNil(t, st["skew_ms"])
	require.NotNil(t, st["started_at"])
	require.NotNil(t, st["settled_at"])

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

	for _, d := range e.deliveries(id, "accepted") {
		require.NotNil(t, d["accepted_at"])
		require.GreaterOrEqual(t, d["skew_ms"].(float64), 0.0)
	}
	failed := e.deliveries(id, "failed")
	require.Len(t, failed, 3)
	for _, d := range failed {
		require.Equal(t, "dee", d["user_id"])
		require.Equal(t, "unregistered", d["reason"])
	}

	// Dee's devices are evicted, and the next message skips them.
	list := e.must(http.StatusOK, http.MethodGet, "/v1/users/dee/devices", nil)
	for _, d := range list["items"].([]any) {
		require.Equal(t, "evicted", d.(map[string]any)["status"])
		require.Equal(t, "unregistered", d.(map[string]any)["evicted_reason"])
	}
	next := e.must(http.StatusAccepted, http.MethodPost, "/v1/messages", map[string]any{
		"audience": map[string]any{"type": "users", "ids": []string{"ann", "bob", "cy", "dee"}},
		"payload":  map[string]any{"title": "again"},
	})
	require.EqualValues(t, 9, next["device_count"])
	require.Equal(t, "dispatched", e.settle(next["message_id"].(string), 30*time.Second)["state"])
}

func TestE2EDisabledChannelFailsLoudly(t *testing.T) {
	t.Parallel()
	e := startE2E(t, nil, "VAPID_PUBLIC_KEY", "VAPID_PRIVATE_KEY", "VAPID_SUBJECT")
	e.register("ann", false)
	providers := e.must(http.StatusOK, http.MethodGet, "/v1/providers", nil)
	require.Equal(t, false, providers["webpush"].(map[string]any)["configured"])
	require.Equal(t, true, providers["apns"].(map[string]any)["configured"])

	msg := e.must(http.StatusAccepted, http.MethodPost, "/v1/messages", map[string]any{
		"audience": map[string]any{"type": "users", "ids": []string{"ann"}},
		"payload":  map[string]any{"title": "hi"},
	})
	id := msg["message_id"].(string)
	st := e.settle(id, 30*time.Second)
	require.Equal(t, map[string]any{"total": 3.0, "accepted": 2.0, "failed": 1.0, "expired": 0.0, "cancelled": 0.0, "pending": 0.0}, st["deliveries"])
	failed := e.deliveries(id, "failed")
	require.Len(t, failed, 1)
	require.Equal(t, "webpush", failed[0]["channel"])
	require.Equal(t, "channel_disabled", failed[0]["reason"])
}

func TestE2EProviderDownForTheWholeLifetime(t *testing.T) {
	t.Parallel()
	e := startE2E(t, nil)
	require.NoError(t, e.fake.SetControl(fake.Control{Channel: "apns", Mode: fake.ModeUnavailable}))
	const devices = 40
	var batch []map[string]any
	var users []string
	for i := range devices {
		u := fmt.Sprintf("u%d", i)
		users = append(users, u)
		batch = append(batch, map[string]any{"user_id": u, "channel": "apns", "token": hexToken("")})
	}
	e.must(http.StatusOK, http.MethodPost, "/v1/devices/batch", map[string]any{"devices": batch})

	// Counted in case anything was pushed before (warm-ups are counted apart).
	before := e.fake.Stats().APNs.Received
	lifetime := 4 * time.Second
	now := time.Now()
	msg := e.must(http.StatusAccepted, http.MethodPost, "/v1/messages", map[string]any{
		"dispatch_at": now.Format(time.RFC3339Nano),
		"expires_at":  now.Add(lifetime).Format(time.RFC3339Nano),
		"audience":    map[string]any{"type": "users", "ids": users},
		"payload":     map[string]any{"title": "down"},
	})
	id := msg["message_id"].(string)
	st := e.settle(id, lifetime+20*time.Second)
	require.Equal(t, "expired", st["state"])
	require.Equal(t, map[string]any{"total": 40.0, "accepted": 0.0, "failed": 0.0, "expired": 40.0, "cancelled": 0.0, "pending": 0.0}, st["deliveries"])
	for _, d := range e.deliveries(id, "expired") {
		require.Equal(t, "provider_unavailable", d["reason"], "an expired delivery says what held it back")
	}

	// The provider saw the first burst (sends already in flight when the
	// breaker opened) and then only the breaker's probes: one after 1 s,
	// 2 s after that, within the 4 s lifetime; never a retry storm.
	received := e.fake.Stats().APNs.Received - before
	t.Logf("fakepush received %d APNs requests for %d devices over a %s lifetime", received, devices, lifetime)
	require.LessOrEqual(t, received, int64(devices+3))

	providers := e.must(http.StatusOK, http.MethodGet, "/v1/providers", nil)
	apns := providers["apns"].(map[string]any)
	require.Contains(t, []any{"open", "half_open"}, apns["state"], "%v", apns)
	require.NotEmpty(t, apns["last_error"])
}

func TestE2EUrgentIsNotBlockedByBulk(t *testing.T) {
	t.Parallel()
	e := startE2E(t, nil)
	// A provider round trip of 20 ms makes the bulk fan-out take a while.
	latency := 20
	require.NoError(t, e.fake.SetControl(fake.Control{Channel: "fcm", LatencyMS: &latency}))

	const bulkDevices = 5000
	var users []string
	for start := 0; start < bulkDevices; start += 2500 {
		var batch []map[string]any
		for i := start; i < start+2500; i++ {
			u := fmt.Sprintf("b%d", i)
			users = append(users, u)
			batch = append(batch, map[string]any{"user_id": u, "channel": "fcm", "token": fmt.Sprintf("bulk-token-%d", i)})
		}
		e.must(http.StatusOK, http.MethodPost, "/v1/devices/batch", map[string]any{"devices": batch})
	}
	e.must(http.StatusCreated, http.MethodPost, "/v1/devices", map[string]any{"user_id": "otp", "channel": "fcm", "token": "urgent-token"})

	bulk := e.must(http.StatusAccepted, http.MethodPost, "/v1/messages", map[string]any{
		"priority": "bulk",
		"audience": map[string]any{"type": "users", "ids": users},
		"payload":  map[string]any{"title": "digest"},
	})
	// Once the bulk message is dispatching, the urgent one goes out.
	bulkID := bulk["message_id"].(string)
	require.Eventually(t, func() bool {
		return e.must(http.StatusOK, http.MethodGet, "/v1/messages/"+bulkID, nil)["state"] == "dispatching"
	}, 20*time.Second, 5*time.Millisecond)
	urgent := e.must(http.StatusAccepted, http.MethodPost, "/v1/messages", map[string]any{
		"priority": "urgent",
		"audience": map[string]any{"type": "users", "ids": []string{"otp"}},
		"payload":  map[string]any{"title": "code 123456"},
	})
	urgentID := urgent["message_id"].(string)

	urgentSt := e.settle(urgentID, 30*time.Second)
	bulkSt := e.settle(bulkID, 60*time.Second)
	require.EqualValues(t, 1, urgentSt["deliveries"].(map[string]any)["accepted"])
	require.EqualValues(t, bulkDevices, bulkSt["deliveries"].(map[string]any)["accepted"])

	urgentAt, err := time.Parse(time.RFC3339Nano, e.deliveries(urgentID, "accepted")[0]["accepted_at"].(string))
	require.NoError(t, err)
	bulkSettled, err := time.Parse(time.RFC3339Nano, bulkSt["settled_at"].(string))
	require.NoError(t, err)
	t.Logf("urgent skew %v ms; bulk skew %v", urgentSt["skew_ms"].(map[string]any)["max"], bulkSt["skew_ms"])
	require.True(t, urgentAt.Before(bulkSettled), "the urgent push waited for the bulk fan-out to finish")
}

// TestE2EDeviceDeletedBeforeDispatchGetsNothing deletes a device between
// the schedule and the due instant: the chunk that carries its token must
// not send to it, and its delivery must read cancelled.
func TestE2EDeviceDeletedBeforeDispatchGetsNothing(t *testing.T) {
	t.Parallel()
	e := startE2E(t, nil)
	e.register("ann", false)
	e.register("bob", false)
	msg := e.must(http.StatusAccepted, http.MethodPost, "/v1/messages", map[string]any{
		"dispatch_at": time.Now().Add(3 * time.Second).UTC().Format(time.RFC3339Nano),
		"audience":    map[string]any{"type": "users", "ids": []string{"ann", "bob"}},
		"payload":     map[string]any{"title": "after a logout"},
	})
	id := msg["message_id"].(string)
	var gone map[string]any
	for _, d := range e.must(http.StatusOK, http.MethodGet, "/v1/users/ann/devices", nil)["items"].([]any) {
		if d.(map[string]any)["channel"] == "apns" {
			gone = d.(map[string]any)
		}
	}
	require.NotNil(t, gone)
	e.must(http.StatusNoContent, http.MethodDelete, "/v1/devices/"+gone["device_id"].(string), nil)
	require.Equal(t, "scheduled", e.must(http.StatusOK, http.MethodGet, "/v1/messages/"+id, nil)["state"],
		"the delete must come before the due instant")

	st := e.settle(id, 30*time.Second)
	require.Equal(t, map[string]any{"total": 6.0, "accepted": 5.0, "failed": 0.0, "expired": 0.0, "cancelled": 1.0, "pending": 0.0}, st["deliveries"])
	cancelled := e.deliveries(id, "cancelled")
	require.Len(t, cancelled, 1)
	require.Equal(t, gone["device_id"], cancelled[0]["device_id"])
	receipts := e.fake.Receipts(id)
	require.Len(t, receipts, 5)
	for _, r := range receipts {
		require.NotEqual(t, gone["token"], r.Token, "the deleted device was sent the push")
	}
}

// TestE2ELanesSplitAcrossProcesses runs the bulk lane and the urgent lane in
// processes of their own (HERALD_LANES), as a deployment that keeps urgent
// pushes off saturated bulk workers does: each process works its own lane's
// chunks and never the other's.
func TestE2ELanesSplitAcrossProcesses(t *testing.T) {
	t.Parallel()
	e := startE2E(t, map[string]string{"HERALD_LANES": "bulk", "HERALD_CHUNK_SIZE": "10"})
	urgentVars := maps.Clone(e.vars)
	urgentVars["HERALD_LANES"] = "urgent"
	urgentBase, _ := startServe(t, urgentVars, "--role", "worker")

	// Four bulk chunks and five urgent messages: were the lanes ignored,
	// each would go to either process.
	var batch []map[string]any
	var users []string
	for i := range 40 {
		users = append(users, fmt.Sprintf("b%d", i))
		batch = append(batch, map[string]any{"user_id": users[i], "channel": "fcm", "token": fmt.Sprintf("lane-token-%d", i)})
	}
	e.must(http.StatusOK, http.MethodPost, "/v1/devices/batch", map[string]any{"devices": batch})
	bulk := e.must(http.StatusAccepted, http.MethodPost, "/v1/messages", map[string]any{
		"audience": map[string]any{"type": "users", "ids": users},
		"payload":  map[string]any{"title": "digest"},
	})
	require.EqualValues(t, 4, bulk["chunk_count"])
	ids := []string{bulk["message_id"].(string)}
	for i := range 5 {
		ids = append(ids, e.must(http.StatusAccepted, http.MethodPost, "/v1/messages", map[string]any{
			"priority": "urgent",
			"audience": map[string]any{"type": "users", "ids": []string{users[i]}},
			"payload":  map[string]any{"title": "code"},
		})["message_id"].(string))
	}
	for _, id := range ids {
		st := e.settle(id, 30*time.Second)
		require.Equal(t, "dispatched", st["state"], id)
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

// TestE2EScheduleEveryMinute runs an every-minute schedule through the
// real binary: its runs become messages, one per run, each delivered once
// through fakepush with counters of its own. Waiting for real minutes to
// pass would take one to two of them, so the test puts the schedule where a
// Herald that was down for the last few minutes finds it: its next run a
// few minutes back (the one query the materializer advances it with).
// Herald's own materializer then makes the runs still alive, and they are
// sent at once, late, as the README says of missed runs. That each run is
// made ahead of its instant and its lane woken at it is covered, on a clock
// the tests control, in jobs (TestMaterialize*, TestWaker*).
func TestE2EScheduleEveryMinute(t *testing.T) {
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

	var runs []map[string]any
	require.Eventually(t, func() bool {
		runs = runs[:0]
		page := e.must(http.StatusOK, http.MethodGet, "/v1/messages?state=dispatched&schedule_id="+id, nil)
		for _, it := range page["items"].([]any) {
			m := it.(map[string]any)
			at, err := time.Parse(time.RFC3339Nano, m["dispatch_at"].(string))
			require.NoError(t, err)
			if !at.After(now) {
				runs = append(runs, m)
			}
		}
		return len(runs) >= 3
		// The wait ends as soon as the runs are delivered (a few seconds
		// alone); its bound leaves room for a machine busy with the
		// package's other end-to-end tests.
	}, 45*time.Second, 100*time.Millisecond, "the three runs up to now were not delivered")

	// Every message of the schedule, dispatched or still to come, is one run.
	all := e.must(http.StatusOK, http.MethodGet, "/v1/messages?schedule_id="+id, nil)["items"].([]any)
	perRun := map[time.Time]int{}
	for _, it := range all {
		at, err := time.Parse(time.RFC3339Nano, it.(map[string]any)["dispatch_at"].(string))
		require.NoError(t, err)
		perRun[at]++
	}
	require.Len(t, runs, 3)
	for i, m := range runs {
		// Pages are newest first.
		want := first.Add(time.Duration(2-i) * time.Minute)
		require.Equal(t, want.Format(time.RFC3339Nano), m["dispatch_at"], "runs are on the minute, one a minute")
		require.Equal(t, 1, perRun[want], "run %s was made into %d messages", want, perRun[want])
		require.Equal(t, id, m["schedule_id"])
		require.Equal(t, map[string]any{"total": 3.0, "accepted": 3.0, "failed": 0.0, "expired": 0.0, "cancelled": 0.0, "pending": 0.0}, m["deliveries"])
		require.Len(t, e.fake.Receipts(m["message_id"].(string)), 3, "each device got each run once")
	}
	stats := e.fake.Stats()
	require.Zero(t, stats.APNs.Duplicates+stats.FCM.Duplicates+stats.WebPush.Duplicates)
	e.must(http.StatusNoContent, http.MethodDelete, "/v1/schedules/"+id, nil)
}

// TestE2EMetricsAfterDispatch scrapes /metrics after a dispatch and finds
// the delivery counters, the skew histogram and the process gauges.
func TestE2EMetricsAfterDispatch(t *testing.T) {
	t.Parallel()
	e := startE2E(t, nil)
	e.register("ann", false)
	e.register("dee", true)
	msg := e.must(http.StatusAccepted, http.MethodPost, "/v1/messages", map[string]any{
		"audience": map[string]any{"type": "users", "ids": []string{"ann", "dee"}},
		"payload":  map[string]any{"title": "metrics"},
	})
	e.settle(msg["message_id"].(string), 30*time.Second)

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
	for _, channel := range []string{"apns", "fcm", "webpush"} {
		require.EqualValues(t, 1, value("herald_deliveries_total", map[string]string{"channel": channel, "status": "accepted", "reason": ""}))
		require.EqualValues(t, 1, value("herald_deliveries_total", map[string]string{"channel": channel, "status": "failed", "reason": "unregistered"}))
		require.EqualValues(t, 1, value("herald_breaker_state", map[string]string{"channel": channel, "state": "closed"}))
		require.GreaterOrEqual(t, value("herald_provider_request_seconds", map[string]string{"channel": channel, "outcome": "accepted"}), 1.0)
	}
	require.EqualValues(t, 3, value("herald_delivery_skew_seconds", map[string]string{"priority": "bulk"}))
	skew := families["herald_delivery_skew_seconds"].GetMetric()[0].GetHistogram()
	require.Greater(t, len(skew.GetBucket()), 10, "buckets fine enough below a second")
	require.EqualValues(t, 1, value("herald_messages", map[string]string{"state": "dispatched"}))
	value("herald_database_clock_offset_seconds", nil)
	value("herald_chunks_in_flight", map[string]string{"lane": "bulk"})
}
