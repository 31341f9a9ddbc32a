package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/heraldpush/herald/api/client"
	"github.com/heraldpush/herald/db/dbtest"
	"github.com/heraldpush/herald/jobs/push/fake"
)

// These tests hold Herald, from outside, to what the people reminded are
// owed (docs/preferences.md): each rule decided when a delivery is sent.

// preferTo sets a user's preferences through the API: opt-outs
// ("category" or "category:channel") and quiet hours (nil: none of their
// own).
func (e *e2e) preferTo(user string, quiet *client.QuietHours, optOuts ...string) {
	e.t.Helper()
	outs := []client.OptOut{}
	for _, o := range optOuts {
		category, channel, _ := strings.Cut(o, ":")
		out := client.OptOut{Category: category}
		if channel != "" {
			out.Channel = new(client.Channel(channel))
		}
		outs = append(outs, out)
	}
	res, err := e.api.PutUserPreferencesWithResponse(context.Background(), user, client.PreferencesUpdate{OptOuts: &outs, QuietHours: quiet})
	answered(e.t, http.StatusOK, res, err)
}

// sendIn schedules a message in category at dispatchAt to users, with
// extra fields, through the API, and returns its id.
func (e *e2e) sendIn(category string, dispatchAt time.Time, users []string, extra map[string]any) string {
	e.t.Helper()
	body := map[string]any{
		"category": category, "dispatch_at": dispatchAt.UTC().Format(time.RFC3339Nano),
		"audience": map[string]any{"type": "users", "ids": users},
		"payload":  map[string]any{"title": "A " + category + " reminder"},
	}
	for k, v := range extra {
		body[k] = v
	}
	var head client.MessageHead
	require.NoError(e.t, json.Unmarshal(e.callOK(http.StatusAccepted, http.MethodPost, "/v1/messages", body), &head))
	return head.MessageID
}

// withheldCounts is a message's counts of what it withheld, as its status
// shows them.
func (e *e2e) withheldCounts(id string) map[string]int {
	e.t.Helper()
	var st struct {
		Deliveries map[string]int `json:"deliveries"`
	}
	require.NoError(e.t, json.Unmarshal(e.callOK(http.StatusOK, http.MethodGet, "/v1/messages/"+id, nil), &st))
	return st.Deliveries
}

// receivedBy is when fakepush received message id's pushes, by token.
func receivedBy(fp *fake.Server, id string) map[string][]time.Time {
	out := map[string][]time.Time{}
	for _, r := range fp.Receipts(id) {
		out[r.Token] = append(out[r.Token], r.ReceivedAt)
	}
	return out
}

// TestE2EPreferencesDecidedAtSendTime: users opt out after a message was
// scheduled and before its instant; what they opted out of is not sent,
// each delivery cancelled opted_out, counted, listed, posted to a webhook
// and in the metrics, while a critical category reaches them still.
func TestE2EPreferencesDecidedAtSendTime(t *testing.T) {
	t.Parallel()
	e := startE2E(t, map[string]string{"HERALD_WEBHOOK_HOSTS": "127.0.0.1"})
	hooks := newHookReceiver(t)
	e.createWebhook(hooks, "/withheld", client.WebhookEventType("delivery.withheld"))
	tokens := map[string][2]string{}
	for _, user := range []string{"keep", "out", "web-out"} {
		apns, fcm := fmt.Sprintf("%064x", len(tokens)+0xa0), "fcm-"+user
		tokens[user] = [2]string{apns, fcm}
		e.registerDevice(client.DeviceRegistration{UserID: user, Channel: client.ChannelAPNs, Token: &apns})
		e.registerDevice(client.DeviceRegistration{UserID: user, Channel: client.ChannelFCM, Token: &fcm})
	}
	ctx := context.Background()
	put, err := e.api.PutCategoryWithResponse(ctx, "alerts", client.CategoryRule{Critical: new(true)})
	answered(t, http.StatusCreated, put, err)

	// Far enough ahead that the preferences below are set before it on a
	// loaded machine.
	at := time.Now().Add(8 * time.Second)
	marketing := e.sendIn("marketing", at, []string{"keep", "out", "web-out"}, nil)
	alert := e.sendIn("alerts", at, []string{"out"}, nil)
	// After scheduling, before the instant.
	now := time.Now().UTC()
	e.preferTo("out", &client.QuietHours{Start: now.Add(-time.Hour).Format("15:04"), End: now.Add(2 * time.Hour).Format("15:04")},
		"marketing", "alerts")
	e.preferTo("web-out", nil, "marketing:fcm")
	read, err := e.api.GetUserPreferencesWithResponse(ctx, "out")
	prefs := answered(t, http.StatusOK, read, err).JSON200
	require.Equal(t, []client.OptOut{{Category: "alerts"}, {Category: "marketing"}}, prefs.OptOuts)

	st := e.settle(marketing, 30*time.Second)
	require.Equal(t, client.MessageStateDispatched, st.State)
	require.Equal(t, 3, st.Deliveries.Accepted)
	require.Equal(t, 3, st.Deliveries.Cancelled)
	require.Equal(t, 3, e.withheldCounts(marketing)["opted_out"])
	withheld := e.deliveries(marketing, client.DeliveryStatusCancelled)
	require.Len(t, withheld, 3)
	for _, d := range withheld {
		require.Equal(t, "opted_out", string(*d.Reason))
	}
	got := receivedBy(e.fake, marketing)
	require.Len(t, got, 3, "fakepush received %v", got)
	for _, tok := range []string{tokens["keep"][0], tokens["keep"][1], tokens["web-out"][0]} {
		require.Len(t, got[tok], 1, "token %s", tok)
	}

	// The critical alert reaches "out" on both phones, opted out and in
	// quiet hours as the user is.
	st = e.settle(alert, 30*time.Second)
	require.Equal(t, 2, st.Deliveries.Accepted, "%+v", st.Deliveries)
	require.Len(t, receivedBy(e.fake, alert), 2)

	// Posted: one delivery.withheld event a withheld delivery.
	require.Eventually(t, func() bool { return len(hooks.accepted()) >= 3 }, 30*time.Second, 50*time.Millisecond)
	events := hooks.accepted()
	require.Len(t, events, 3)
	for _, ev := range events {
		require.Equal(t, "opted_out", ev.Reason, "%+v", ev)
	}
	// Counted by reason in the metrics.
	resp, err := http.Get(e.base + "/metrics")
	require.NoError(t, err)
	metrics, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	var optedOut float64
	for _, line := range strings.Split(string(metrics), "\n") {
		if strings.HasPrefix(line, "herald_deliveries_total{") && strings.Contains(line, `reason="opted_out"`) {
			var v float64
			_, err := fmt.Sscan(line[strings.LastIndex(line, " ")+1:], &v)
			require.NoError(t, err)
			optedOut += v
		}
	}
	require.EqualValues(t, 3, optedOut, "herald_deliveries_total by reason opted_out")

	// Declared, listed, and made an ordinary category again.
	list, err := e.api.ListCategoriesWithResponse(ctx)
	require.Len(t, answered(t, http.StatusOK, list, err).JSON200.Items, 1)
	got1, err := e.api.GetCategoryWithResponse(ctx, "alerts")
	require.True(t, answered(t, http.StatusOK, got1, err).JSON200.Critical)
	del, err := e.api.DeleteCategoryWithResponse(ctx, "alerts")
	answered(t, http.StatusNoContent, del, err)
	got1, err = e.api.GetCategoryWithResponse(ctx, "alerts")
	answered(t, http.StatusNotFound, got1, err)
}

// TestE2EInstallationQuietHours: the installation's quiet hours hold the
// deliveries of users who set none of their own, and not those of a user
// whose own are none; without them, nothing is held.
func TestE2EInstallationQuietHours(t *testing.T) {
	t.Parallel()
	e := startE2E(t, nil)
	ctx := context.Background()
	now := time.Now().UTC()
	put, err := e.api.PutQuietHoursWithResponse(ctx, client.QuietHoursUpdate{
		Start: now.Add(-time.Hour).Format("15:04"), End: now.Add(2 * time.Hour).Format("15:04"), Timezone: new("UTC")})
	answered(t, http.StatusOK, put, err)
	got, err := e.api.GetQuietHoursWithResponse(ctx)
	require.Equal(t, "UTC", answered(t, http.StatusOK, got, err).JSON200.Timezone)
	tokens := map[string]string{}
	for i, user := range []string{"sleeper", "night-owl"} {
		tok := fmt.Sprintf("%064x", 0xb10+i)
		tokens[user] = tok
		e.registerDevice(client.DeviceRegistration{UserID: user, Channel: client.ChannelAPNs, Token: &tok})
	}
	e.preferTo("night-owl", &client.QuietHours{Start: "00:00", End: "00:00"})
	id := e.sendIn("reminders", time.Now(), []string{"sleeper", "night-owl"},
		map[string]any{"expires_at": now.Add(4 * time.Hour).Format(time.RFC3339)})
	require.Eventually(t, func() bool { return len(e.deliveries(id, client.DeliveryStatusAccepted)) == 1 }, 30*time.Second, 50*time.Millisecond)
	held := e.deliveries(id, client.DeliveryStatusPending)
	require.Len(t, held, 1)
	require.Equal(t, "quiet_hours", string(*held[0].Reason))
	require.Equal(t, 1, e.withheldCounts(id)["held"])
	require.Len(t, receivedBy(e.fake, id)[tokens["night-owl"]], 1)
	require.Empty(t, receivedBy(e.fake, id)[tokens["sleeper"]])

	del, err := e.api.DeleteQuietHoursWithResponse(ctx)
	answered(t, http.StatusNoContent, del, err)
	got, err = e.api.GetQuietHoursWithResponse(ctx)
	answered(t, http.StatusNotFound, got, err)
	later := e.sendIn("reminders", time.Now(), []string{"sleeper"}, nil)
	require.Equal(t, 1, e.settle(later, 30*time.Second).Deliveries.Accepted)
}

// testZones compiles two zones whose clocks change moments from now into
// a zoneinfo directory for Herald's processes (ZONEINFO):
//   - Herald/Spring springs forward an hour at spring (its clocks jump
//     from spring's UTC wall time to an hour later);
//   - Herald/Fall falls back an hour at fall (its clocks, an hour ahead
//     of UTC until then, show the hour before fall's UTC wall time again).
func testZones(t *testing.T, spring, fall time.Time) string {
	t.Helper()
	zic, err := exec.LookPath("zic")
	if err != nil {
		zic = "/usr/sbin/zic"
	}
	until := func(at time.Time) string { return at.UTC().Format("2006 Jan 2 15:04:05") + "u" }
	src := filepath.Join(t.TempDir(), "herald.zones")
	require.NoError(t, os.WriteFile(src, []byte(strings.Join([]string{
		"Zone Herald/Spring 0:00 - HST " + until(spring),
		"                   0:00 1:00 HDT",
		"Zone Herald/Fall 0:00 1:00 HDT " + until(fall),
		"                 0:00 - HST",
		"",
	}, "\n")), 0o644))
	dir := t.TempDir()
	out, err := exec.Command(zic, "-d", dir, src).CombinedOutput()
	require.NoError(t, err, "zic: %s", out)
	return dir
}

// TestE2EQuietHoursAcrossDST holds deliveries in quiet hours that end across
// a change of the clocks, in two zones of their own (compiled for the test
// so that the changes happen while it runs), and checks each is sent at
// the instant the user's clocks show the end, not an hour off:
//   - in Herald/Spring, quiet hours ending after its clocks sprang forward
//     end an hour earlier, by UTC, than they would have the day before;
//   - one whose end falls in the hour the clocks skip ends when the gap
//     ends;
//   - in Herald/Fall, an end its clocks show twice ends the first time.
//
// Nothing is sent inside the hours, and a message that asks to skip them
// is cancelled at once.
func TestE2EQuietHoursAcrossDST(t *testing.T) {
	t.Parallel()
	now := time.Now().UTC()
	// The ends, on whole minutes (as every quiet hours end), a minute or
	// two from now; the changes half a minute from them.
	springEnd := now.Add(time.Minute).Truncate(time.Minute).Add(time.Minute)
	spring := springEnd.Add(-30 * time.Second)
	fallEnd := springEnd.Add(time.Minute)
	fall := fallEnd.Add(30 * time.Second)
	zones := testZones(t, spring, fall)

	fp, err := fake.New(fake.Config{Addr: "127.0.0.1:0", TLSDir: t.TempDir(), Latency: 5 * time.Millisecond})
	require.NoError(t, err)
	require.NoError(t, fp.Start(context.Background()))
	t.Cleanup(func() { _ = fp.Close() })
	vars := fp.Env()
	tdb := dbtest.New(t)
	vars["DATABASE_URL"], vars["HERALD_API_KEYS"], vars["HERALD_LOG_LEVEL"] = tdb.URL, testAPIKey, "warn"
	vars["ZONEINFO"] = zones
	h := startChild(t, asHerald("serve", "--migrate", "--addr", "127.0.0.1:0"), vars)
	base := h.base(t)
	e := &e2e{t: t, fake: fp, base: base, vars: vars, db: tdb, api: newAPIClient(t, base, testAPIKey)}

	wall := func(at time.Time, offset time.Duration) string { return at.UTC().Add(offset).Format("15:04") }
	users := map[string]struct {
		zone       string
		start, end string
		// want is when the push must come.
		want time.Time
	}{
		// After the change, Herald/Spring's clocks are an hour ahead of
		// UTC: its end shows at springEnd.
		"spring": {"Herald/Spring", wall(now.Add(-time.Hour), 0), wall(springEnd, time.Hour), springEnd},
		// An end in the skipped hour (springEnd's UTC wall time, which its
		// clocks never show): at the change.
		"gap": {"Herald/Spring", wall(now.Add(-time.Hour), 0), wall(springEnd, 0), spring.Truncate(time.Second)},
		// Herald/Fall is an hour ahead until fall; its clocks show
		// fallEnd+1h first at fallEnd, and again an hour later.
		"fall": {"Herald/Fall", wall(now.Add(-time.Hour), time.Hour), wall(fallEnd, time.Hour), fallEnd},
	}
	tokens := map[string]string{}
	var ids []string
	for user, u := range users {
		e.putUser(user, u.zone)
		tok := fmt.Sprintf("%064x", len(tokens)+0xd57)
		tokens[user] = tok
		e.registerDevice(client.DeviceRegistration{UserID: user, Channel: client.ChannelAPNs, Token: &tok})
		e.preferTo(user, &client.QuietHours{Start: u.start, End: u.end})
		ids = append(ids, user)
	}
	skipper := fmt.Sprintf("%064x", 0x5c1)
	e.putUser("skipper", "Herald/Spring")
	e.registerDevice(client.DeviceRegistration{UserID: "skipper", Channel: client.ChannelAPNs, Token: &skipper})
	e.preferTo("skipper", &client.QuietHours{Start: wall(now.Add(-time.Hour), 0), End: wall(springEnd, time.Hour)})

	lifetime := map[string]any{"expires_at": now.Add(3 * time.Hour).Format(time.RFC3339)}
	held := e.sendIn("reminders", time.Now(), ids, lifetime)
	skipped := e.sendIn("reminders", time.Now(), []string{"skipper"}, map[string]any{"quiet_hours": "skip", "expires_at": lifetime["expires_at"]})

	st := e.settle(skipped, 30*time.Second)
	require.Equal(t, 1, st.Deliveries.Cancelled)
	cancelled := e.deliveries(skipped, client.DeliveryStatusCancelled)
	require.Len(t, cancelled, 1)
	require.Equal(t, "quiet_hours", string(*cancelled[0].Reason))

	require.Eventually(t, func() bool { return len(e.deliveries(held, client.DeliveryStatusPending)) == 3 }, 30*time.Second, 100*time.Millisecond)
	for _, d := range e.deliveries(held, client.DeliveryStatusPending) {
		require.NotNil(t, d.Reason)
		require.Equal(t, "quiet_hours", string(*d.Reason))
	}
	require.Empty(t, fp.Receipts(held), "nothing is sent inside quiet hours")

	st = e.settle(held, 4*time.Minute)
	require.Equal(t, 3, st.Deliveries.Accepted, "%+v", st.Deliveries)
	got := receivedBy(fp, held)
	for user, u := range users {
		times := got[tokens[user]]
		require.Len(t, times, 1, "%s", user)
		t.Logf("%s (%s, quiet %s-%s): due %s, received %s (%+.0f ms)", user, u.zone, u.start, u.end,
			u.want.Format(time.TimeOnly), times[0].UTC().Format("15:04:05.000"), float64(times[0].Sub(u.want).Milliseconds()))
		require.False(t, times[0].Before(u.want), "%s: sent inside the quiet hours, at %s, before %s", user, times[0], u.want)
		// Here within 100 ms; the bound leaves room for a loaded machine
		// (the race detector, the tier's other tests), and is still an hour
		// short of a clock read on the wrong side of the change.
		require.WithinDuration(t, u.want, times[0], 5*time.Second, "%s: sent %s after the quiet hours ended", user, times[0].Sub(u.want))
	}
}

// TestE2EFrequencyCapAcrossWorkers: with a cap of one message a day, two
// messages due at the same instant to the same users, one urgent and one
// bulk, run by two worker processes at once, reach each user exactly once
// (whichever lane won), on every one of the user's phones; the other
// message's deliveries to that user are cancelled capped.
func TestE2EFrequencyCapAcrossWorkers(t *testing.T) {
	t.Parallel()
	const users = 300
	s := newFanOutSetupOn(t, 0, dbtest.New(t), 10*time.Millisecond)
	var batch []client.DeviceRegistration
	var ids []string
	for i := range users {
		u := fmt.Sprintf("capped-%d", i)
		ids = append(ids, u)
		batch = append(batch,
			client.DeviceRegistration{UserID: u, Channel: client.ChannelAPNs, Token: new(fmt.Sprintf("%064x", 0xca900+i))},
			client.DeviceRegistration{UserID: u, Channel: client.ChannelFCM, Token: new(fmt.Sprintf("fcm-capped-%d", i))})
	}
	s.registerDevices(batch)
	put, err := s.api.PutCategoryWithResponse(context.Background(), "promo", client.CategoryRule{Cap: &client.CategoryCap{Count: 1, PeriodSeconds: 86400}})
	answered(t, http.StatusCreated, put, err)
	startListeningWorkers(t, s.vars)

	at := time.Now().Add(3 * time.Second)
	urgent := s.sendIn("promo", at, ids, map[string]any{"priority": "urgent"})
	bulk := s.sendIn("promo", at, ids, map[string]any{"priority": "bulk"})
	for _, id := range []string{urgent, bulk} {
		st := s.settle(id, time.Minute)
		require.Equal(t, client.MessageStateDispatched, st.State)
	}
	// Per user, exactly one of the two messages, on both phones.
	perUser := map[string]map[string]int{}
	capped := 0
	for _, id := range []string{urgent, bulk} {
		for _, d := range s.deliveries(id, client.DeliveryStatusAccepted) {
			if perUser[d.UserID] == nil {
				perUser[d.UserID] = map[string]int{}
			}
			perUser[d.UserID][id]++
		}
		for _, d := range s.deliveries(id, client.DeliveryStatusCancelled) {
			require.Equal(t, "capped", string(*d.Reason))
			capped++
		}
	}
	require.Len(t, perUser, users)
	wins := map[string]int{}
	for u, got := range perUser {
		require.Len(t, got, 1, "user %s got %v", u, got)
		for id, n := range got {
			require.Equal(t, 2, n, "user %s: both phones", u)
			wins[id]++
		}
	}
	require.Equal(t, 2*users, capped)
	require.Equal(t, 2*users, len(s.fake.Receipts(urgent))+len(s.fake.Receipts(bulk)), "one push a phone")
	t.Logf("the urgent message won %d users, the bulk one %d", wins[urgent], wins[bulk])
}
