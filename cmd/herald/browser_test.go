package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/heraldpush/herald/api/client"
	"github.com/heraldpush/herald/jobs"
	"github.com/heraldpush/herald/jobs/push"
	"github.com/heraldpush/herald/jobs/receipt"
)

const testAdminPassword = "e2e-admin-password-0123"

// findChromium returns the path of a Chromium to drive. `make test`
// installs Debian's chromium when it is missing; where that was not
// possible the browser tests skip, loudly, rather than fail.
func findChromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if _, err := os.Stat("/usr/bin/chromium"); err == nil {
		return "/usr/bin/chromium"
	}
	t.Skip("!!! SKIPPING the browser tests: no chromium found. Install it (apt-get install chromium) or run `make test` as root, which installs it.")
	return ""
}

// newBrowser starts a headless Chromium with a fresh profile and returns a
// context for chromedp actions; it is closed when the test ends. The flags
// are what a root user in a sandboxed container needs, minus everything
// that would reach the network on its own.
func newBrowser(t *testing.T, chromium string) context.Context {
	t.Helper()
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(chromium),
		chromedp.Flag("headless", true),
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.Flag("disable-quic", true),
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1280, 900),
	}
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelBrowser := chromedp.NewContext(allocCtx)
	ctx, cancelTimeout := context.WithTimeout(ctx, 2*time.Minute)
	t.Cleanup(func() {
		cancelTimeout()
		cancelBrowser()
		cancelAlloc()
	})
	require.NoError(t, chromedp.Do(ctx), "start chromium")
	return ctx
}

// artifactDir is testdata/artifacts at the repository's root (git-ignored),
// where the browser tests leave their screenshots for people to look at.
func artifactDir(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	require.NoError(t, err)
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			break
		}
		parent := filepath.Dir(dir)
		require.NotEqual(t, dir, parent, "go.mod not found above the test's directory")
		dir = parent
	}
	out := filepath.Join(dir, "testdata", "artifacts")
	require.NoError(t, os.MkdirAll(out, 0o755))
	return out
}

// tab is one browser tab in a test: its actions fail the test.
type tab struct {
	t   *testing.T
	ctx context.Context
}

func (b tab) do(steps ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	require.NoError(b.t, chromedp.Do(b.ctx, steps...))
}

// text waits for the element that the CSS selector finds and returns its
// text. The dashboard redraws itself every few seconds, replacing its
// nodes: an element found just before a redraw is gone when its text is
// read ("No node with given id found"), and is looked for again.
func (b tab) text(sel string) string {
	b.t.Helper()
	for attempt := 0; ; attempt++ {
		v, err := chromedp.Run(b.ctx, chromedp.Text(chromedp.CSS(sel)))
		if err != nil && attempt < 5 && strings.Contains(err.Error(), "No node with given id") {
			continue
		}
		require.NoError(b.t, err, sel)
		return strings.TrimSpace(v)
	}
}

func evaluate[T any](b tab, expr string) T {
	b.t.Helper()
	v, err := chromedp.Run(b.ctx, chromedp.Evaluate[T](expr))
	require.NoError(b.t, err, expr)
	return v
}

func visible(sel string) chromedp.Action[chromedp.Void] {
	return chromedp.WaitVisible(chromedp.CSS(sel))
}
func click(sel string) chromedp.Action[chromedp.Void] { return chromedp.Click(chromedp.CSS(sel)) }

// screenshot saves the whole page as testdata/artifacts/<name>.png.
func (b tab) screenshot(name string) {
	b.t.Helper()
	// Quality 100 makes a PNG; anything less, a JPEG.
	png, err := chromedp.Run(b.ctx, chromedp.FullScreenshot(100))
	require.NoError(b.t, err)
	path := filepath.Join(artifactDir(b.t), name+".png")
	require.NoError(b.t, os.WriteFile(path, png, 0o644))
	b.t.Logf("screenshot: %s", path)
}

// goHash moves the single-page app to another of its routes, as clicking a
// link would (a fragment change; chromedp.Navigate would wait for a page
// load that never comes).
func (b tab) goHash(route string) {
	b.t.Helper()
	_ = evaluate[string](b, fmt.Sprintf("location.hash = %q", route))
}

// postReceipts posts, as the devices would, a delivered receipt for the
// first delivered of message's accepted deliveries and an opened one for
// the first opened, with tokens signed under the key Herald's processes
// share.
func (e *e2e) postReceipts(message string, delivered, opened int) {
	e.t.Helper()
	ctx := context.Background()
	signer, err := receipt.Shared(ctx, e.db.Pool)
	require.NoError(e.t, err)
	id, ok := push.ParseMessageID(message)
	require.True(e.t, ok)
	rows, err := e.db.Pool.Query(ctx, "SELECT device_id FROM ledger WHERE message_id = $1 AND status = 'accepted' ORDER BY device_id", id)
	require.NoError(e.t, err)
	devices, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	require.NoError(e.t, err)
	var batch client.ReceiptBatch
	for i, d := range devices {
		tok := signer.Sign(receipt.Delivery{MessageID: id, DeviceID: d}, time.Now().Add(time.Hour))
		if i < delivered {
			batch.Receipts = append(batch.Receipts, client.NewReceipt{Token: tok, Event: client.NewReceiptEventDelivered})
		}
		if i < opened {
			batch.Receipts = append(batch.Receipts, client.NewReceipt{Token: tok, Event: client.NewReceiptEventOpened})
		}
	}
	res, err := e.api.CreateReceiptsWithResponse(ctx, batch)
	answered(e.t, http.StatusOK, res, err)
}

// dashboardFixture gives the e2e server what the dashboard shows: a
// dispatched message to 9 devices (3 of them dead) that 4 devices confirmed
// and 1 opened, a message scheduled an hour ahead, and a schedule.
func dashboardFixture(t *testing.T, e *e2e) (dispatched, scheduled, schedule string) {
	t.Helper()
	for _, u := range []string{"ann", "bob"} {
		e.register(u, false)
	}
	e.register("dee", true)
	dispatched = e.send(client.NewMessage{
		Audience: toUsers("ann", "bob", "dee"), Payload: client.Payload{Title: new("Standup"), Body: new("now")},
	}).MessageID
	require.Equal(t, client.MessageStateDispatched, e.settle(dispatched, 30*time.Second).State)
	e.postReceipts(dispatched, 4, 1)
	later := e.send(client.NewMessage{
		DispatchAt: new(time.Now().Add(time.Hour).Truncate(time.Second)), Audience: toUsers("ann"), Payload: titled("Later"),
	})
	sch := e.createSchedule(client.NewSchedule{
		Cron: "0 9 * * MON-FRI", Timezone: new("Europe/Berlin"), Audience: toUsers("ann"), Payload: titled("Daily"),
	})
	return dispatched, later.MessageID, sch.ScheduleID
}

// TestE2EBrowserDashboard drives the dashboard and River UI in headless
// Chromium the way an operator would: log in, read a dispatched message's
// counters and histogram, cancel a scheduled message, pause a schedule,
// send a test message, and find the fan_out jobs in River UI.
func TestE2EBrowserDashboard(t *testing.T) {
	t.Parallel()
	chromium := findChromium(t)
	e := startE2E(t, map[string]string{"HERALD_ADMIN_PASSWORD": testAdminPassword})
	dispatched, scheduled, schedule := dashboardFixture(t, e)
	b := tab{t: t, ctx: newBrowser(t, chromium)}

	// The dashboard sends a browser without a session to the login form.
	row := fmt.Sprintf(`tr[data-message-id=%q]`, dispatched)
	b.do(
		chromedp.Navigate(e.base+"/"),
		visible("#password"),
		chromedp.SendKeys(chromedp.CSS("#password"), testAdminPassword),
		click("#login-submit"),
		visible(row+`[data-state="dispatched"]`),
	)
	counts := []string{b.text(row + " td.total"), b.text(row + " td.accepted"), b.text(row + " td.failed"), b.text(row + " td.pending")}
	require.Equal(t, []string{"9", "6", "3", "0"}, counts, "total, accepted, failed, pending")
	require.Equal(t, []string{"Standup", "now"}, []string{b.text(row + " td.content .title"), b.text(row + " td.content .body")},
		"each message shows its title and body")
	// Each message shows its maximum skew as the SLO grades it, and the top
	// of the page the share of the last day's messages within the SLO: the
	// dispatched one is the only one settled so far.
	graded := e.message(dispatched).SloSkewMs
	require.NotNil(t, graded, "a settled message is graded")
	require.NotEqual(t, "—", b.text(row+" td.max-skew"))
	within := 0
	if *graded <= 1000 {
		within = 1
	}
	require.Equal(t, *graded > 1000, evaluate[bool](b, fmt.Sprintf(`document.querySelector('%s td.max-skew').classList.contains('late')`, row)))
	require.Equal(t, fmt.Sprintf("all: %d of 1", within), b.text("#slo-all span"))
	require.Equal(t, fmt.Sprintf("%d.0%%", 100*within), b.text("#slo-all b"))
	require.Equal(t, fmt.Sprintf("bulk: %d of 1", within), b.text("#slo-bulk span"), "by lane")
	b.screenshot("dashboard-messages")

	// The message page: counters, a histogram of the 6 accepted skews, the
	// percentiles, and the 3 failures by reason and one by one.
	b.do(click(row+" a"), visible("#histogram svg rect"), visible("#failures-body td"))
	require.Equal(t, "6", b.text("#counter-accepted b"))
	require.Equal(t, "Standup", b.text("#message-content .title"))
	require.NotEqual(t, "—", b.text("#skew-p50 b"))
	require.Contains(t, b.text("#reasons"), "unregistered")
	require.Equal(t, 20, evaluate[int](b, `document.querySelectorAll('#histogram svg rect').length`))
	require.Equal(t, 6, evaluate[int](b, `[...document.querySelectorAll('#histogram svg rect title')]
		.reduce((n, t) => n + Number(t.textContent.split(': ')[1].split(' ')[0]), 0)`), "the histogram counts every accepted delivery once")
	require.Equal(t, 3, evaluate[int](b, `document.querySelectorAll('#failures-body tr').length`))
	require.Zero(t, evaluate[int](b, `document.querySelectorAll('#cancel').length`), "a dispatched message cannot be cancelled")
	// What the devices saw: the receipts' counts as the API has them, and
	// the confirmed skew beside the accepted one.
	receipts := e.message(dispatched).Receipts
	require.GreaterOrEqual(t, receipts.Confirmed, 4)
	require.Equal(t, []string{fmt.Sprint(receipts.Confirmed), fmt.Sprint(receipts.Opened), fmt.Sprint(receipts.Unconfirmed)},
		[]string{b.text("#receipts-confirmed b"), b.text("#receipts-opened b"), b.text("#receipts-unconfirmed b")},
		"confirmed, opened, unconfirmed")
	require.NotEqual(t, "—", b.text("#skew-accepted td.p50"))
	require.NotEqual(t, "—", b.text("#skew-confirmed td.p50"))
	require.NotNil(t, receipts.SkewMs)
	require.Greater(t, receipts.SkewMs.Max, e.message(dispatched).SkewMs.P50, "a device hears of a push after its provider took it")
	b.screenshot("dashboard-message")

	// Cancel the scheduled message, in two clicks.
	b.goHash("#/messages/" + scheduled)
	b.do(visible("#message-state .badge.scheduled"), click("#cancel"), click("#cancel-confirm"),
		visible("#message-state .badge.cancelled"))
	require.Equal(t, "3", b.text("#counter-cancelled b"))
	b.screenshot("dashboard-cancelled")
	st := e.message(scheduled)
	require.Equal(t, client.MessageStateCancelled, st.State)
	require.Equal(t, 3, st.Deliveries.Cancelled)

	// A local-time message to ann in Kolkata and bob in New York, two
	// hours from now on Berlin's clocks: past in Kolkata, so ann's devices
	// are sent at once (send_now), while bob's wave waits hours. Its page
	// shows each wave's due instant, devices and progress.
	for user, zone := range map[string]string{"ann": "Asia/Kolkata", "bob": "America/New_York"} {
		e.putUser(user, zone)
	}
	berlin, err := time.LoadLocation("Europe/Berlin")
	require.NoError(t, err)
	localID := e.send(client.NewMessage{
		DeliverAtLocal: new(time.Now().In(berlin).Add(2 * time.Hour).Format("2006-01-02T15:04")),
		IfPassed:       new(client.IfPassedSendNow), TTLSeconds: new(600),
		Audience: toUsers("ann", "bob"), Payload: titled("Good morning"),
	}).MessageID
	var waves []client.Wave
	require.Eventually(t, func() bool {
		if w := e.message(localID).Waves; w != nil {
			waves = *w
		}
		return len(waves) == 2 && waves[0].Accepted == 3
	}, 20*time.Second, 50*time.Millisecond, "ann's wave was not sent")
	b.goHash("#/messages/" + localID)
	// The page marks each wave with its dispatch_at as the API writes it.
	first := fmt.Sprintf(`#waves-body tr[data-wave=%q]`, waves[0].DispatchAt.Format(time.RFC3339Nano))
	second := fmt.Sprintf(`#waves-body tr[data-wave=%q]`, waves[1].DispatchAt.Format(time.RFC3339Nano))
	b.do(visible(first), visible(second))
	require.Equal(t, 2, evaluate[int](b, `document.querySelectorAll('#waves-body tr').length`))
	require.Equal(t, []string{"3", "3", "0", "0"},
		[]string{b.text(first + " td.devices"), b.text(first + " td.accepted"), b.text(first + " td.failed"), b.text(first + " td.pending")},
		"the wave sent now: devices, accepted, failed, pending")
	require.Equal(t, []string{"3", "0", "0", "3"},
		[]string{b.text(second + " td.devices"), b.text(second + " td.accepted"), b.text(second + " td.failed"), b.text(second + " td.pending")},
		"the wave hours ahead")
	require.Equal(t, 1, evaluate[int](b, fmt.Sprintf(`document.querySelectorAll(%q).length`, first+" .progress span.accepted")))
	b.screenshot("dashboard-waves")
	// A message sent at one instant has no waves to show.
	b.goHash("#/messages/" + dispatched)
	b.do(visible("#histogram svg rect"))
	require.True(t, evaluate[bool](b, `document.getElementById('waves-panel').hidden`))

	// Pause the schedule.
	schRow := fmt.Sprintf(`tr[data-schedule-id=%q]`, schedule)
	b.goHash("#/schedules")
	b.do(visible(schRow+" button"), click(schRow+" button"), visible(schRow+" .badge.paused"))
	got, err := e.api.GetScheduleWithResponse(t.Context(), schedule)
	require.True(t, answered(t, http.StatusOK, got, err).JSON200.Paused)

	// Send a test message to bob from the form.
	b.goHash("#/send")
	b.do(visible("#audience-id"), chromedp.SendKeys(chromedp.CSS("#audience-id"), "bob"), click("#send-submit"),
		visible("#message-state .badge"))
	hash := evaluate[string](b, `location.hash`)
	sent := strings.TrimPrefix(hash, "#/messages/")
	require.NotEqual(t, hash, sent, "the form leads to the new message's page")
	require.Equal(t, 3, e.message(sent).DeviceCount)

	b.goHash("#/providers")
	b.do(visible(`tr[data-channel="webpush"] .badge`))
	b.screenshot("dashboard-providers")

	// The apps: the default app's channels, their credentials from the
	// environment, and the worker that has a client for each.
	b.goHash("#/apps")
	b.do(visible(`tr[data-app="default"][data-channel="apns"] .badge`))
	require.Eventually(t, func() bool {
		return evaluate[string](b, `document.querySelector('tr[data-app="default"][data-channel="apns"]').innerText`) != "" &&
			evaluate[bool](b, `document.querySelector('tr[data-app="default"][data-channel="apns"] td:nth-child(5)').innerText === '1'`)
	}, 20*time.Second, 200*time.Millisecond, "the apps page shows the worker with the default app's APNs client")
	require.Contains(t, evaluate[string](b, `document.querySelector('tr[data-app="default"][data-channel="apns"]').innerText`), "environment")
	b.screenshot("dashboard-apps")

	// River UI lists the fan_out jobs, behind the same session.
	b.do(chromedp.Navigate(e.base + "/riverui/jobs?state=completed"))
	listed, err := chromedp.Run(b.ctx, chromedp.Poll[bool](`document.body.innerText.includes('fan_out')`,
		chromedp.WithPollingTimeout(30*time.Second)))
	require.NoError(t, err)
	require.True(t, listed)
	b.screenshot("riverui-jobs")

	// Signing out ends the session: the dashboard and River UI ask for a
	// login again.
	b.do(chromedp.Navigate(e.base+"/"), visible("#logout"), click("#logout"), visible("#password"),
		chromedp.Navigate(e.base+"/riverui/"), visible("#password"))
}

// TestDashboardGuards checks over plain HTTP, against the real River UI,
// that nothing of the dashboard or River UI answers without a session, that
// a wrong password and a cross-site call are refused, and what the
// histogram endpoint returns.
func TestDashboardGuards(t *testing.T) {
	t.Parallel()
	e := startE2E(t, map[string]string{"HERALD_ADMIN_PASSWORD": testAdminPassword})
	dispatched, _, _ := dashboardFixture(t, e)
	noRedirect := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	// get returns the status and the Location header or, without one, the
	// body.
	get := func(c *http.Client, path string) (int, string) {
		resp, err := c.Get(e.base + path)
		require.NoError(t, err)
		defer resp.Body.Close()
		if loc := resp.Header.Get("Location"); loc != "" {
			return resp.StatusCode, loc
		}
		raw, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, string(raw)
	}

	for _, path := range []string{"/", "/riverui/", "/riverui/jobs"} {
		code, loc := get(noRedirect, path)
		require.Equal(t, http.StatusSeeOther, code, path)
		require.True(t, strings.HasPrefix(loc, "/login"), path)
	}
	for _, path := range []string{"/ui/api/messages", "/ui/api/messages/" + dispatched, "/riverui/api/jobs?state=completed", "/riverui/api/queues"} {
		code, _ := get(noRedirect, path)
		require.Equal(t, http.StatusUnauthorized, code, path)
	}
	// An API key does not open River UI.
	req, err := http.NewRequest(http.MethodGet, e.base+"/riverui/api/jobs?state=completed", nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+testAPIKey)
	resp, err := noRedirect.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusUnauthorized, resp.StatusCode)

	jar, err := cookiejar.New(nil)
	require.NoError(t, err)
	browser := &http.Client{Jar: jar, CheckRedirect: noRedirect.CheckRedirect}
	resp, err = browser.PostForm(e.base+"/login", url.Values{"username": {"admin"}, "password": {"wrong"}})
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusUnauthorized, resp.StatusCode)
	require.Empty(t, jar.Cookies(mustURL(t, e.base)))

	resp, err = browser.PostForm(e.base+"/login", url.Values{"username": {"admin"}, "password": {testAdminPassword}})
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusSeeOther, resp.StatusCode)

	// Signed in, River UI's API lists the chunk jobs once River has
	// recorded them completed (its completer writes in batches, a moment
	// after the deliveries).
	require.EventuallyWithT(t, func(c *assert.CollectT) { //nolint:forbidigo // EventuallyWithT hands its callback a CollectT
		code, body := get(browser, "/riverui/api/jobs?state=completed&limit=100")
		require.Equal(c, http.StatusOK, code, body)
		require.Contains(c, body, `"kind":"`+jobs.RunsKind+`"`)
	}, 10*time.Second, 100*time.Millisecond)

	// A cross-site call to River UI's API is refused even with the session.
	req, err = http.NewRequest(http.MethodPost, e.base+"/riverui/api/jobs/retry", strings.NewReader(`{"ids":["1"]}`))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Origin", "https://evil.example")
	resp, err = browser.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusForbidden, resp.StatusCode)

	// The dashboard's histogram: every accepted delivery counted once, and
	// the dead devices by reason.
	code, body := get(browser, "/ui/api/messages/"+dispatched+"/breakdown")
	require.Equal(t, http.StatusOK, code, body)
	var bd struct {
		Skew []struct {
			FromMs  float64 `json:"from_ms"`
			ToMs    float64 `json:"to_ms"`
			Devices int     `json:"devices"`
		} `json:"skew_histogram"`
		Failures []map[string]any `json:"failures_by_reason"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &bd))
	require.Len(t, bd.Skew, 20)
	sum := 0
	for i, b := range bd.Skew {
		sum += b.Devices
		require.Less(t, b.FromMs, b.ToMs)
		if i > 0 {
			require.InDelta(t, bd.Skew[i-1].ToMs, b.FromMs, 0.11, "buckets are contiguous")
		}
	}
	require.Equal(t, 6, sum)
	require.Equal(t, []map[string]any{{"status": "failed", "reason": "unregistered", "devices": 3.0}}, bd.Failures)
}

func mustURL(t *testing.T, s string) *url.URL {
	t.Helper()
	u, err := url.Parse(s)
	require.NoError(t, err)
	return u
}
