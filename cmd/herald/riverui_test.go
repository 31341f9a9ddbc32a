package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/heraldpush/herald/api/client"
	"github.com/heraldpush/herald/jobs"
	"github.com/heraldpush/herald/jobs/push/fake"
)

// riverUI calls River UI's own HTTP API (/riverui/api/...) as the signed-in
// operator, as its front end does.
type riverUI struct {
	t      *testing.T
	base   string
	cookie *http.Cookie
}

func signInRiverUI(t *testing.T, e *e2e) *riverUI {
	t.Helper()
	resp := signIn(t, e.base, testAdminPassword, "/riverui/", nil)
	require.Equal(t, http.StatusSeeOther, resp.StatusCode)
	cookie := sessionCookie(resp)
	require.NotNil(t, cookie)
	return &riverUI{t: t, base: e.base, cookie: cookie}
}

func (ui *riverUI) call(method, path string, body any, out any) {
	ui.t.Helper()
	var raw []byte
	if body != nil {
		var err error
		raw, err = json.Marshal(body)
		require.NoError(ui.t, err)
	}
	req, err := http.NewRequest(method, ui.base+"/riverui/api"+path, bytes.NewReader(raw))
	require.NoError(ui.t, err)
	req.AddCookie(ui.cookie)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(ui.t, err)
	defer resp.Body.Close()
	require.Equal(ui.t, http.StatusOK, resp.StatusCode, "%s %s", method, path)
	if out != nil {
		require.NoError(ui.t, json.NewDecoder(resp.Body).Decode(out))
	}
}

// uiJob is a job as River UI's list shows it.
type uiJob struct {
	ID    int64  `json:"id"`
	Kind  string `json:"kind"`
	State string `json:"state"`
	Args  string `json:"args"`
}

func (ui *riverUI) jobs(state string) []uiJob {
	ui.t.Helper()
	var page struct {
		Data []uiJob `json:"data"`
	}
	ui.call(http.MethodGet, "/jobs?limit=1000&state="+state, nil, &page)
	return page.Data
}

// chunkJobOf is the id of a one-chunk message's chunk job.
func (e *e2e) chunkJobOf(messageID string) int64 {
	e.t.Helper()
	id, err := strconv.ParseInt(strings.TrimPrefix(messageID, "msg_"), 10, 64)
	require.NoError(e.t, err)
	var job int64
	require.NoError(e.t, e.db.Pool.QueryRow(context.Background(),
		`SELECT job_id FROM message_chunks WHERE message_id = $1`, id).Scan(&job))
	return job
}

// parked says whether a chunk job sleeps (snoozed behind a breaker) for at
// least another half second: waiting, and not about to run.
func (e *e2e) parked(id int64) bool {
	e.t.Helper()
	var parked bool
	require.NoError(e.t, e.db.Pool.QueryRow(context.Background(), `
		SELECT state IN ('scheduled', 'available') AND scheduled_at > now() + interval '500 ms'
		FROM river_job WHERE id = $1`, id).Scan(&parked))
	return parked
}

func (e *e2e) jobState(id int64) string {
	e.t.Helper()
	var state string
	require.NoError(e.t, e.db.Pool.QueryRow(context.Background(), `SELECT state FROM river_job WHERE id = $1`, id).Scan(&state))
	return state
}

// TestRiverUIRetrySendsOnlyWhatIsPending is the operator after a fault:
// APNs is down, so two messages' chunks have reached FCM and parked APNs.
// One chunk is cancelled in River UI, the other is discarded (a chunk out
// of attempts). APNs comes back; both are retried from River UI, one after
// its message expired. The live one sends to its APNs devices alone, never
// again to the FCM ones; the expired one sends nothing. Meanwhile the
// schedule materializer, run every 100 ms, leaves at most its last run in
// River UI's completed list, beside the chunks.
func TestRiverUIRetrySendsOnlyWhatIsPending(t *testing.T) {
	t.Parallel()
	e := startE2E(t, map[string]string{
		"HERALD_ADMIN_PASSWORD": testAdminPassword,
		// Long enough that a parked chunk sleeps while the test acts.
		"HERALD_BREAKER_COOLDOWN":  "3s",
		"HERALD_MATERIALIZE_EVERY": "100ms",
	})
	ui := signInRiverUI(t, e)
	const users = 4
	var batch []client.DeviceRegistration
	var ids []string
	for i := range users {
		u := fmt.Sprintf("u%d", i)
		ids = append(ids, u)
		batch = append(batch,
			client.DeviceRegistration{UserID: u, Channel: client.ChannelAPNs, Token: new(hexToken(""))},
			client.DeviceRegistration{UserID: u, Channel: client.ChannelFCM, Token: new("fcm-" + hexToken(""))})
	}
	e.registerDevices(batch)
	require.NoError(t, e.fake.SetControl(fake.Control{Channel: "apns", Mode: fake.ModeUnavailable}))

	now := time.Now()
	send := func(lifetime time.Duration) string {
		return e.send(client.NewMessage{
			DispatchAt: new(now),
			ExpiresAt:  new(now.Add(lifetime)),
			Audience:   toUsers(ids...),
			Payload:    titled("after a fault"),
		}).MessageID
	}
	live, short := send(time.Hour), send(8*time.Second)
	liveJob, shortJob := e.chunkJobOf(live), e.chunkJobOf(short)

	// Both chunks reach FCM and park APNs: the job sleeps until the breaker
	// lets a probe through.
	for _, msg := range []string{live, short} {
		require.Eventually(t, func() bool {
			d := e.message(msg).Deliveries
			return d.Accepted == users && d.Pending == users
		}, 20*time.Second, 20*time.Millisecond, "message %s did not reach FCM", msg)
	}
	require.Eventually(t, func() bool {
		return e.parked(liveJob) && e.parked(shortJob)
	}, 10*time.Second, 10*time.Millisecond, "the chunks did not park")

	// The faults: one cancelled by the operator, one out of attempts.
	ui.call(http.MethodPost, "/jobs/cancel", map[string]any{"ids": []string{strconv.FormatInt(liveJob, 10)}}, nil)
	_, err := e.db.Pool.Exec(context.Background(),
		`UPDATE river_job SET state = 'discarded', finalized_at = now() WHERE id = $1`, shortJob)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return e.jobState(liveJob) == "cancelled" }, 10*time.Second, 10*time.Millisecond)
	listed := map[int64]string{}
	for _, state := range []string{"cancelled", "discarded"} {
		for _, j := range ui.jobs(state) {
			listed[j.ID] = j.State
		}
	}
	require.Equal(t, "cancelled", listed[liveJob], "River UI lists the cancelled chunk")
	require.Equal(t, "discarded", listed[shortJob], "River UI lists the discarded chunk")

	// APNs is back; the short message has expired meanwhile, and its
	// deliveries are still pending, since no chunk is left to expire them.
	require.NoError(t, e.fake.SetControl(fake.Control{Channel: "apns", Mode: fake.ModeOK}))
	require.Eventually(t, func() bool {
		var expired bool
		err := e.db.Pool.QueryRow(context.Background(),
			`SELECT expires_at <= now() FROM messages WHERE id = $1`, strings.TrimPrefix(short, "msg_")).Scan(&expired)
		return err == nil && expired
	}, 30*time.Second, 50*time.Millisecond, "message %s never expired", short)
	require.Equal(t, users, e.message(short).Deliveries.Pending)

	ui.call(http.MethodPost, "/jobs/retry", map[string]any{"ids": []string{strconv.FormatInt(liveJob, 10), strconv.FormatInt(shortJob, 10)}}, nil)

	st := e.settle(live, 30*time.Second)
	require.Equal(t, client.MessageStateDispatched, st.State)
	require.Equal(t, client.DeliveryCounts{Total: 2 * users, Accepted: 2 * users}, st.Deliveries)
	perDevice := map[string]int{}
	for _, r := range e.fake.Receipts(live) {
		perDevice[r.Channel+"/"+r.Token]++
	}
	require.Len(t, perDevice, 2*users, "every device of the live message got it")
	for device, n := range perDevice {
		require.Equal(t, 1, n, "%s got the push %d times: the retry resent a settled delivery", device, n)
	}

	st = e.settle(short, 30*time.Second)
	require.Equal(t, client.DeliveryCounts{Total: 2 * users, Accepted: users, Expired: users}, st.Deliveries)
	for _, r := range e.fake.Receipts(short) {
		require.Equal(t, "fcm", r.Channel, "the expired chunk's retry sent to %s/%s", r.Channel, r.Token)
	}
	require.Len(t, e.fake.Receipts(short), users)

	// The chunks are in River UI's completed list; the materializer's runs
	// (some hundred by now) are not, but for the last.
	// River marks a job completed a moment after its work returns.
	var completed map[string]int
	require.Eventually(t, func() bool {
		completed = map[string]int{}
		for _, j := range ui.jobs("completed") {
			completed[j.Kind]++
		}
		return completed[jobs.RunsKind] == 2
	}, 10*time.Second, 50*time.Millisecond, "the chunks are not in River UI's completed list: %v", completed)
	require.LessOrEqual(t, completed["materialize_schedules"], 1, "%v", completed)
}
