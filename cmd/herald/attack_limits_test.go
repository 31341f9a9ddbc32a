package main

import (
	"context"
	"fmt"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/heraldpush/herald/api/client"
)

// These tests attack a running Herald (run(), real PostgreSQL, fakepush)
// the way a hostile or broken caller would, each with limits small enough
// through the environment that the attack is quick.

// otherAPIKey is a second caller's key, for tests that check one caller's
// flood does not reach another.
const otherAPIKey = "e2e-other-key-0123456789"

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
		res, err := e.api.GetProvidersWithResponse(t.Context())
		require.NoError(t, err)
		if res.StatusCode() == http.StatusOK {
			continue
		}
		require.Equal(t, http.StatusTooManyRequests, res.StatusCode(), "%s", res.Body)
		requireAPIError(t, res, "rate_limited", "")
		require.NotNil(t, res.Headers429, "Retry-After is whole seconds: %q", res.HTTPResponse.Header.Get("Retry-After"))
		require.GreaterOrEqual(t, res.Headers429.RetryAfter, 1)
		limited++
	}
	require.GreaterOrEqual(t, limited, 4, "a flood past the burst is refused")

	// Another key is not slowed by the first one's flood.
	other := newAPIClient(t, e.base, otherAPIKey)
	for range 5 {
		res, err := other.GetProvidersWithResponse(t.Context())
		answered(t, http.StatusOK, res, err)
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
		res, err := e.api.GetProvidersWithResponse(context.Background())
		require.NoError(t, err)
		return res.StatusCode() == http.StatusOK
	}, 5*time.Second, 100*time.Millisecond)
}

// TestAttackLimitsDevicesPerUser registers devices on one user past the
// limit, one at a time, in batches and concurrently: the user never holds
// more active devices than the limit, and re-registering one it has always
// works.
func TestAttackLimitsDevicesPerUser(t *testing.T) {
	t.Parallel()
	e := startE2E(t, map[string]string{"HERALD_MAX_DEVICES_PER_USER": "3"})
	fcm := func(user string, i int) client.DeviceRegistration {
		return client.DeviceRegistration{UserID: user, Channel: client.ChannelFCM, Token: new(fmt.Sprintf("fcm-%s-%d", user, i))}
	}
	register := func(d client.DeviceRegistration) *client.RegisterDeviceResponse {
		res, err := e.api.RegisterDeviceWithResponse(t.Context(), d)
		require.NoError(t, err)
		return res
	}
	for i := range 3 {
		e.registerDevice(fcm("mallory", i))
	}
	res := register(fcm("mallory", 3))
	require.Equal(t, http.StatusConflict, res.StatusCode(), "%s", res.Body)
	require.Contains(t, requireAPIError(t, res, "too_many_devices", "").Message, "3")
	// Re-registering a device the user has is not a new device.
	require.Equal(t, http.StatusOK, register(fcm("mallory", 0)).StatusCode())
	// Nor can the limit be passed by moving another user's device over.
	e.registerDevice(fcm("trent", 0))
	res = register(client.DeviceRegistration{UserID: "mallory", Channel: client.ChannelFCM, Token: new("fcm-trent-0")})
	require.Equal(t, http.StatusConflict, res.StatusCode(), "%s", res.Body)
	requireAPIError(t, res, "too_many_devices", "")

	// A batch that would pass the limit is refused whole, naming the first
	// registration over it.
	batch := []client.DeviceRegistration{fcm("eve", 0), fcm("oscar", 0), fcm("eve", 1), fcm("eve", 2), fcm("eve", 3), fcm("eve", 4)}
	batchRes, err := e.api.RegisterDevicesWithResponse(t.Context(), client.DeviceBatch{Devices: batch})
	answered(t, http.StatusConflict, batchRes, err)
	requireAPIError(t, batchRes, "too_many_devices", "devices[4]")
	oscar, err := e.api.ListUserDevicesWithResponse(t.Context(), "oscar", nil)
	answered(t, http.StatusNotFound, oscar, err)
	e.registerDevices(batch[:4])

	// Racing registrations for one user: exactly the limit get in.
	var wg sync.WaitGroup
	statuses := make([]int, 12)
	for i := range statuses {
		wg.Go(func() {
			if res, err := e.api.RegisterDeviceWithResponse(t.Context(), fcm("sybil", i)); err == nil {
				statuses[i] = res.StatusCode()
			}
		})
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
	require.Len(t, e.userDevices("sybil"), 3)
}

// TestAttackLimitsDevicePages lists a user with many devices: the answer
// comes in pages of a bounded size, which together hold every device once.
func TestAttackLimitsDevicePages(t *testing.T) {
	t.Parallel()
	e := startE2E(t, map[string]string{"HERALD_MAX_DEVICES_PER_USER": "250"})
	var batch []client.DeviceRegistration
	for i := range 250 {
		batch = append(batch, client.DeviceRegistration{UserID: "hoarder", Channel: client.ChannelFCM, Token: new(fmt.Sprintf("fcm-hoarder-%03d", i))})
	}
	e.registerDevices(batch)
	list := func(user string, params client.ListUserDevicesParams) *client.ListUserDevicesResponse {
		res, err := e.api.ListUserDevicesWithResponse(t.Context(), user, &params)
		require.NoError(t, err)
		return res
	}

	// Unasked, a page is the default size.
	page := list("hoarder", client.ListUserDevicesParams{}).JSON200
	require.NotNil(t, page)
	require.Equal(t, "hoarder", page.UserID)
	require.Len(t, page.Items, 100)
	require.NotNil(t, page.NextCursor)

	seen := map[string]bool{}
	params, pages := client.ListUserDevicesParams{Limit: new(60)}, 0
	for {
		page := list("hoarder", params).JSON200
		require.NotNil(t, page)
		pages++
		require.LessOrEqual(t, len(page.Items), 60)
		for _, d := range page.Items {
			require.False(t, seen[d.DeviceID], "device %s listed twice", d.DeviceID)
			seen[d.DeviceID] = true
		}
		if page.NextCursor == nil {
			break
		}
		params.Cursor = page.NextCursor
	}
	require.Len(t, seen, 250)
	require.Equal(t, 5, pages)

	res := list("hoarder", client.ListUserDevicesParams{Limit: new(5000)})
	require.Equal(t, http.StatusBadRequest, res.StatusCode())
	requireAPIError(t, res, "invalid_field", "limit")
	// A cursor of another listing is refused.
	e.registerDevice(client.DeviceRegistration{UserID: "other", Channel: client.ChannelFCM, Token: new("fcm-other")})
	first := list("hoarder", client.ListUserDevicesParams{Limit: new(1)}).JSON200
	require.NotNil(t, first)
	res = list("other", client.ListUserDevicesParams{Cursor: first.NextCursor})
	require.Equal(t, http.StatusBadRequest, res.StatusCode())
	requireAPIError(t, res, "invalid_cursor", "cursor")
}

// TestAttackLimitsScheduleCadence creates schedules that would run too
// often: closer than the minimum interval, or, in local time, with more
// runs in the 26 hours made ahead than a schedule may have waiting.
func TestAttackLimitsScheduleCadence(t *testing.T) {
	t.Parallel()
	e := startE2E(t, map[string]string{"HERALD_SCHEDULE_MIN_INTERVAL": "5m", "HERALD_SCHEDULE_MAX_AHEAD": "30"})
	schedule := func(cron string, localTime bool) *client.CreateScheduleResponse {
		res, err := e.api.CreateScheduleWithResponse(t.Context(), nil, client.NewSchedule{
			Cron: cron, Timezone: new("Europe/Berlin"), LocalTime: &localTime,
			Audience: toUsers("ann"), Payload: titled("spam"),
		})
		require.NoError(t, err)
		return res
	}
	for _, cron := range []string{"* * * * *", "0,2 9 * * *", "* 3 1 * *"} {
		res := schedule(cron, false)
		require.Equal(t, http.StatusBadRequest, res.StatusCode(), "%s: %s", cron, res.Body)
		require.Contains(t, requireAPIError(t, res, "invalid_field", "cron").Message, "5m")
	}
	res := schedule("*/5 * * * *", false)
	require.Equal(t, http.StatusCreated, res.StatusCode(), "%s", res.Body)

	// Hourly in local time: 26 or 27 runs made ahead, within 30.
	res = schedule("0 * * * *", true)
	require.Equal(t, http.StatusCreated, res.StatusCode(), "%s", res.Body)
	// Every half hour in local time: some 53, too many.
	res = schedule("*/30 * * * *", true)
	require.Equal(t, http.StatusBadRequest, res.StatusCode(), "%s", res.Body)
	require.Contains(t, requireAPIError(t, res, "invalid_field", "cron").Message, "30")
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
		return len(e.listMessages(client.ListMessagesParams{State: new(client.MessageStateScheduled), Limit: new(1000), ScheduleID: &id}))
	}
	// The bound leaves room for a machine busy with the package's other
	// end-to-end tests, where River's first periodic materializer pass can
	// take many seconds; the wait ends when the four are made.
	require.Eventually(t, func() bool { return waiting() == 4 }, 45*time.Second, 100*time.Millisecond)
	// Many passes later there are still no more than four.
	for deadline := time.Now().Add(1500 * time.Millisecond); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		require.LessOrEqual(t, waiting(), 4)
	}
	e.deleteSchedule(id)
}

// TestAttackLimitsScheduleCount is issue #26's item 8: nothing bounded how
// many schedules there were, so 300 every-minute schedules made 756
// messages in 40 s. Past HERALD_MAX_SCHEDULES live schedules, creating one
// more is 409 too_many_schedules, racing creations included; deleting one
// makes room, and a retry of a schedule already made is still answered.
func TestAttackLimitsScheduleCount(t *testing.T) {
	t.Parallel()
	e := startE2E(t, map[string]string{"HERALD_MAX_SCHEDULES": "5"})
	create := func(key *string) *client.CreateScheduleResponse {
		var params *client.CreateScheduleParams
		if key != nil {
			params = &client.CreateScheduleParams{IdempotencyKey: key}
		}
		res, err := e.api.CreateScheduleWithResponse(t.Context(), params, client.NewSchedule{
			Cron: "* * * * *", Timezone: new("UTC"), Audience: toUsers("ann"), Payload: titled("spam"),
		})
		require.NoError(t, err)
		return res
	}
	// Twenty at once: five are made, whatever the interleaving.
	var wg sync.WaitGroup
	var made, refused atomic.Int64
	for i := range 20 {
		wg.Go(func() {
			res := create(new(fmt.Sprintf("k%d", i)))
			switch res.StatusCode() {
			case http.StatusCreated:
				made.Add(1)
			case http.StatusConflict:
				refused.Add(1)
			}
		})
	}
	wg.Wait()
	require.EqualValues(t, 5, made.Load())
	require.EqualValues(t, 15, refused.Load())

	res := create(nil)
	require.Equal(t, http.StatusConflict, res.StatusCode(), "%s", res.Body)
	require.Contains(t, requireAPIError(t, res, "too_many_schedules", "").Message, "5")

	var kept string
	for i := range 20 {
		if res := create(new(fmt.Sprintf("k%d", i))); res.StatusCode() == http.StatusOK {
			kept = res.JSON200.ScheduleID
			break
		}
	}
	require.NotEmpty(t, kept, "a retry of a schedule made is answered at the limit")
	e.deleteSchedule(kept)
	res = create(nil)
	require.Equal(t, http.StatusCreated, res.StatusCode(), "%s", res.Body)
	require.Equal(t, http.StatusConflict, create(nil).StatusCode())
}
