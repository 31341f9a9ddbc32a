package main

import (
	"fmt"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// These tests attack a running Herald (run(), real PostgreSQL, fakepush)
// the way a hostile or broken caller would, each with limits small enough
// through the environment that the attack is quick.

// otherAPIKey is a second caller's key, for tests that check one caller's
// flood does not reach another.
const otherAPIKey = "e2e-other-key-0123456789"

// requireAPIError checks an error answer's code and, when given, its field.
func requireAPIError(t *testing.T, out map[string]any, code, field string) map[string]any {
	t.Helper()
	e, ok := out["error"].(map[string]any)
	require.True(t, ok, "not an error answer: %v", out)
	require.Equal(t, code, e["code"], "%v", out)
	if field != "" {
		require.Equal(t, field, e["field"], "%v", out)
	}
	return e
}

// TestAttackLimitsRequestRate floods the API with one key: past its burst
// the key is answered 429 with Retry-After, while another key and the
// dashboard, each a scope of its own, are served as if nothing happened.
func TestAttackLimitsRequestRate(t *testing.T) {
	t.Parallel()
	e := startE2E(t, map[string]string{
		"HERALD_API_KEYS":       testAPIKey + "," + otherAPIKey,
		"HERALD_ADMIN_PASSWORD": testAdminPassword,
		"HERALD_RATE_LIMIT":     "2",
		"HERALD_RATE_BURST":     "5",
	})

	// The flood: twice the burst at once, faster than two a second refill.
	var limited int
	for range 10 {
		status, header, out := e.callAs(testAPIKey, http.MethodGet, "/v1/providers", nil)
		if status == http.StatusOK {
			continue
		}
		require.Equal(t, http.StatusTooManyRequests, status, "%v", out)
		requireAPIError(t, out, "rate_limited", "")
		retry, err := strconv.Atoi(header.Get("Retry-After"))
		require.NoError(t, err, "Retry-After %q is whole seconds", header.Get("Retry-After"))
		require.GreaterOrEqual(t, retry, 1)
		limited++
	}
	require.GreaterOrEqual(t, limited, 4, "a flood past the burst is refused")

	// Another key is not slowed by the first one's flood.
	for range 5 {
		status, _, out := e.callAs(otherAPIKey, http.MethodGet, "/v1/providers", nil)
		require.Equal(t, http.StatusOK, status, "%v", out)
	}
	// Nor is the dashboard, whose calls are a scope of their own.
	jar, err := cookiejar.New(nil)
	require.NoError(t, err)
	browser := &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := browser.PostForm(e.base+"/login", url.Values{"username": {"admin"}, "password": {testAdminPassword}})
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusSeeOther, resp.StatusCode)
	for range 5 {
		resp, err := browser.Get(e.base + "/ui/api/providers")
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode)
	}

	// The flooded key is served again once its bucket refills.
	require.Eventually(t, func() bool {
		status, _, _ := e.callAs(testAPIKey, http.MethodGet, "/v1/providers", nil)
		return status == http.StatusOK
	}, 5*time.Second, 100*time.Millisecond)
}

// TestAttackLimitsDevicesPerUser registers devices on one user past the
// limit, one at a time, in batches and concurrently: the user never holds
// more active devices than the limit, and re-registering one it has always
// works.
func TestAttackLimitsDevicesPerUser(t *testing.T) {
	t.Parallel()
	e := startE2E(t, map[string]string{"HERALD_MAX_DEVICES_PER_USER": "3"})
	fcm := func(user string, i int) map[string]any {
		return map[string]any{"user_id": user, "channel": "fcm", "token": fmt.Sprintf("fcm-%s-%d", user, i)}
	}
	for i := range 3 {
		e.must(http.StatusCreated, http.MethodPost, "/v1/devices", fcm("mallory", i))
	}
	status, out := e.call(http.MethodPost, "/v1/devices", fcm("mallory", 3))
	require.Equal(t, http.StatusConflict, status, "%v", out)
	require.Contains(t, requireAPIError(t, out, "too_many_devices", "")["message"], "3")
	// Re-registering a device the user has is not a new device.
	e.must(http.StatusOK, http.MethodPost, "/v1/devices", fcm("mallory", 0))
	// Nor can the limit be passed by moving another user's device over.
	e.must(http.StatusCreated, http.MethodPost, "/v1/devices", fcm("trent", 0))
	status, out = e.call(http.MethodPost, "/v1/devices", map[string]any{"user_id": "mallory", "channel": "fcm", "token": "fcm-trent-0"})
	require.Equal(t, http.StatusConflict, status, "%v", out)
	requireAPIError(t, out, "too_many_devices", "")

	// A batch that would pass the limit is refused whole, naming the first
	// registration over it.
	batch := []map[string]any{fcm("eve", 0), fcm("oscar", 0), fcm("eve", 1), fcm("eve", 2), fcm("eve", 3), fcm("eve", 4)}
	status, out = e.call(http.MethodPost, "/v1/devices/batch", map[string]any{"devices": batch})
	require.Equal(t, http.StatusConflict, status, "%v", out)
	requireAPIError(t, out, "too_many_devices", "devices[4]")
	status, _ = e.call(http.MethodGet, "/v1/users/oscar/devices", nil)
	require.Equal(t, http.StatusNotFound, status, "all or nothing: the batch's other users were not created either")
	e.must(http.StatusOK, http.MethodPost, "/v1/devices/batch", map[string]any{"devices": batch[:4]})

	// Racing registrations for one user: exactly the limit get in.
	var wg sync.WaitGroup
	statuses := make([]int, 12)
	for i := range statuses {
		wg.Go(func() { statuses[i], _ = e.call(http.MethodPost, "/v1/devices", fcm("sybil", i)) })
	}
	wg.Wait()
	created := 0
	for _, s := range statuses {
		require.Contains(t, []int{http.StatusCreated, http.StatusConflict}, s)
		if s == http.StatusCreated {
			created++
		}
	}
	require.Equal(t, 3, created, "statuses %v", statuses)
	list := e.must(http.StatusOK, http.MethodGet, "/v1/users/sybil/devices", nil)
	require.Len(t, list["items"], 3)
}

// TestAttackLimitsDevicePages lists a user with many devices: the answer
// comes in pages of a bounded size, which together hold every device once.
func TestAttackLimitsDevicePages(t *testing.T) {
	t.Parallel()
	e := startE2E(t, map[string]string{"HERALD_MAX_DEVICES_PER_USER": "250"})
	var batch []map[string]any
	for i := range 250 {
		batch = append(batch, map[string]any{"user_id": "hoarder", "channel": "fcm", "token": fmt.Sprintf("fcm-hoarder-%03d", i)})
	}
	e.must(http.StatusOK, http.MethodPost, "/v1/devices/batch", map[string]any{"devices": batch})

	// Unasked, a page is the default size.
	page := e.must(http.StatusOK, http.MethodGet, "/v1/users/hoarder/devices", nil)
	require.Equal(t, "hoarder", page["user_id"])
	require.Equal(t, 100, len(page["items"].([]any)))
	require.NotEmpty(t, page["next_cursor"])

	seen := map[string]bool{}
	cursor, pages := "", 0
	for {
		path := "/v1/users/hoarder/devices?limit=60"
		if cursor != "" {
			path += "&cursor=" + cursor
		}
		page := e.must(http.StatusOK, http.MethodGet, path, nil)
		pages++
		items := page["items"].([]any)
		require.LessOrEqual(t, len(items), 60)
		for _, it := range items {
			id := it.(map[string]any)["device_id"].(string)
			require.False(t, seen[id], "device %s listed twice", id)
			seen[id] = true
		}
		next, _ := page["next_cursor"].(string)
		if next == "" {
			break
		}
		cursor = next
	}
	require.Len(t, seen, 250)
	require.Equal(t, 5, pages)

	status, out := e.call(http.MethodGet, "/v1/users/hoarder/devices?limit=5000", nil)
	require.Equal(t, http.StatusBadRequest, status)
	requireAPIError(t, out, "invalid_field", "limit")
	// A cursor of another listing is refused.
	e.must(http.StatusCreated, http.MethodPost, "/v1/devices", map[string]any{"user_id": "other", "channel": "fcm", "token": "fcm-other"})
	first := e.must(http.StatusOK, http.MethodGet, "/v1/users/hoarder/devices?limit=1", nil)
	status, out = e.call(http.MethodGet, "/v1/users/other/devices?cursor="+first["next_cursor"].(string), nil)
	require.Equal(t, http.StatusBadRequest, status)
	requireAPIError(t, out, "invalid_field", "cursor")
}

// TestAttackLimitsScheduleCadence creates schedules that would run too
// often: closer than the minimum interval, or, in local time, with more
// runs in the 26 hours made ahead than a schedule may have waiting.
func TestAttackLimitsScheduleCadence(t *testing.T) {
	t.Parallel()
	e := startE2E(t, map[string]string{"HERALD_SCHEDULE_MIN_INTERVAL": "5m", "HERALD_SCHEDULE_MAX_AHEAD": "30"})
	schedule := func(cron string, localTime bool) (int, map[string]any) {
		return e.call(http.MethodPost, "/v1/schedules", map[string]any{
			"cron": cron, "timezone": "Europe/Berlin", "local_time": localTime,
			"audience": map[string]any{"type": "users", "ids": []string{"ann"}},
			"payload":  map[string]any{"title": "spam"},
		})
	}
	for _, cron := range []string{"* * * * *", "0,2 9 * * *", "* 3 1 * *"} {
		status, out := schedule(cron, false)
		require.Equal(t, http.StatusBadRequest, status, "%s: %v", cron, out)
		require.Contains(t, requireAPIError(t, out, "invalid_field", "cron")["message"], "5m")
	}
	status, out := schedule("*/5 * * * *", false)
	require.Equal(t, http.StatusCreated, status, "%v", out)

	// Hourly in local time: 26 or 27 runs made ahead, within 30.
	status, out = schedule("0 * * * *", true)
	require.Equal(t, http.StatusCreated, status, "%v", out)
	// Every half hour in local time: some 53, too many.
	status, out = schedule("*/30 * * * *", true)
	require.Equal(t, http.StatusBadRequest, status, "%v", out)
	require.Contains(t, requireAPIError(t, out, "invalid_field", "cron")["message"], "30")
}

// TestAttackLimitsRunsMadeAhead runs an every-minute schedule whose lead
// would make an hour of runs at once: the materializer keeps no more than
// the cap waiting, and makes the next ones as the waiting ones start.
func TestAttackLimitsRunsMadeAhead(t *testing.T) {
	t.Parallel()
	e := startE2E(t, map[string]string{
		"HERALD_SCHEDULE_LEAD": "1h", "HERALD_MATERIALIZE_EVERY": "200ms", "HERALD_SCHEDULE_MAX_AHEAD": "4",
	})
	e.register("ann", false)
	id := e.everyMinute("ann")
	// Waiting runs are those not started; a run that starts on its minute
	// while the test looks lets the materializer make the next one.
	waiting := func() int {
		page := e.must(http.StatusOK, http.MethodGet, "/v1/messages?state=scheduled&limit=1000&schedule_id="+id, nil)
		return len(page["items"].([]any))
	}
	// The bound leaves room for a machine busy with the package's other
	// end-to-end tests, where River's first periodic materializer pass can
	// take many seconds; the wait ends when the four are made.
	require.Eventually(t, func() bool { return waiting() == 4 }, 45*time.Second, 100*time.Millisecond)
	// Many passes later there are still no more than four.
	for deadline := time.Now().Add(1500 * time.Millisecond); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		require.LessOrEqual(t, waiting(), 4)
	}
	e.must(http.StatusNoContent, http.MethodDelete, "/v1/schedules/"+id, nil)
}
