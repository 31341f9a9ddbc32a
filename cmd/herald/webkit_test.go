package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/browser"
	"github.com/chromedp/cdproto/serviceworker"
	"github.com/chromedp/cdproto/target"
	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/heraldpush/herald/api/client"
)

// shownNotification is what registration.getNotifications() says of a
// notification the service worker showed.
type shownNotification struct {
	Title   string `json:"title"`
	Body    string `json:"body"`
	Icon    string `json:"icon"`
	Image   string `json:"image"`
	Badge   string `json:"badge"`
	Tag     string `json:"tag"`
	Actions []struct {
		Action string `json:"action"`
		Title  string `json:"title"`
	} `json:"actions"`
	RequireInteraction bool `json:"requireInteraction"`
	Data               struct {
		MessageID string            `json:"herald_message_id"`
		Receipt   string            `json:"herald_receipt"`
		URL       string            `json:"url"`
		Data      map[string]string `json:"data"`
	} `json:"data"`
}

// TestE2EBrowserWebKit: a real Chromium loads the web kit's example page
// from Herald, which registers Herald's service worker; a push Herald
// encoded for a real message (its plaintext as fakepush decrypted it) is
// delivered to that worker through the DevTools protocol. The worker shows
// the notification with every option the payload documentation promises,
// and its delivered receipt is counted on the message; a click on it
// (notificationclick) is counted as opened and asks for the message's url.
// A second copy of the push replaces the first rather than showing twice.
func TestE2EBrowserWebKit(t *testing.T) {
	t.Parallel()
	chromium := findChromium(t)
	e := startE2E(t, nil)

	// The device: a subscription fakepush plays the browser's push service
	// for, so that the push Herald sends is one a browser would get.
	sub, err := e.fake.MintSubscription(false)
	require.NoError(t, err)
	e.registerDevice(client.DeviceRegistration{UserID: "web-user", Channel: client.ChannelWebPush, Subscription: webPush(sub)})
	icon, image, badge, link := "https://cdn.example.com/icon.png", "https://cdn.example.com/picture.png", "https://cdn.example.com/badge.png", "https://app.example.com/reminders/7"
	actions := []client.WebPushAction{{Action: "snooze", Title: "Snooze"}, {Action: "done", Title: "Done"}}
	head := e.send(client.NewMessage{
		Audience: toUsers("web-user"),
		Payload: client.Payload{
			Title: new("Take your medicine"), Subtitle: new("Evening dose"), Body: new("Two tablets with water"),
			Image: new(image), URL: new(link), Data: &map[string]string{"dose": "2"},
			Webpush: &client.WebPushOptions{Icon: new(icon), BadgeIcon: new(badge), Actions: &actions, RequireInteraction: new(true)},
		},
	})
	e.settle(head.MessageID, 30*time.Second)
	var plaintext string
	require.Eventually(t, func() bool {
		for _, r := range e.fake.DetailedReceipts(head.MessageID) {
			if r.Channel == "webpush" && len(r.Body) > 0 {
				plaintext = string(r.Body)
				return true
			}
		}
		return false
	}, 10*time.Second, 50*time.Millisecond, "fakepush never decrypted the push")
	require.Contains(t, plaintext, `"herald_receipt"`, "the push carries its receipt token")

	ctx := newBrowser(t, chromium)
	b := tab{t: t, ctx: ctx}
	origin := e.base
	_, err = chromedp.CallBrowser(ctx, browser.SetPermission, browser.SetPermissionParams{
		Permission: &browser.PermissionDescriptor{Name: "notifications"}, Setting: "granted", Origin: origin,
	})
	require.NoError(t, err)

	// The worker's registration, as DevTools sees it.
	registrations := make(chan serviceworker.RegistrationID, 16)
	require.NoError(t, chromedp.Listen(ctx, func(ev any) {
		if u, ok := ev.(*serviceworker.EventWorkerRegistrationUpdated); ok {
			for _, r := range u.Registrations {
				if !r.IsDeleted && strings.HasPrefix(r.ScopeURL, origin+"/sdk/") {
					select {
					case registrations <- r.RegistrationID:
					default:
					}
				}
			}
		}
	}))
	_, err = chromedp.Call(ctx, serviceworker.Enable, struct{}{})
	require.NoError(t, err)
	b.do(chromedp.Navigate(origin + "/sdk/example.html"))
	active, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`window.heraldReady.then(r => !!r.active)`, chromedp.EvalAwaitPromise))
	require.NoError(t, err)
	require.True(t, active, "the service worker is active")
	var registration serviceworker.RegistrationID
	select {
	case registration = <-registrations:
	case <-time.After(10 * time.Second):
		t.Fatal("DevTools never reported the service worker's registration")
	}

	// The page script reads the app's VAPID key from the public route.
	key, err := chromedp.Run(ctx, chromedp.Evaluate[string](`Herald.vapidKey({herald: location.origin, app: "default"})`, chromedp.EvalAwaitPromise))
	require.NoError(t, err)
	require.Equal(t, e.vars["VAPID_PUBLIC_KEY"], key)

	deliver := func() {
		t.Helper()
		_, err := chromedp.Call(ctx, serviceworker.DeliverPushMessage, serviceworker.DeliverPushMessageParams{
			Origin: origin, RegistrationID: registration, Data: plaintext,
		})
		require.NoError(t, err)
	}
	// shownNow reads the notifications the worker shows, failing nothing,
	// for the waits that poll it: they say what the last read found.
	shownNow := func() ([]shownNotification, error) {
		raw, err := chromedp.Run(ctx, chromedp.Evaluate[string](`navigator.serviceWorker.ready
			.then(r => r.getNotifications())
			.then(ns => JSON.stringify(ns.map(n => ({title: n.title, body: n.body, icon: n.icon, image: n.image,
				badge: n.badge, tag: n.tag, actions: n.actions, requireInteraction: n.requireInteraction, data: n.data}))))`,
			chromedp.EvalAwaitPromise))
		if err != nil {
			return nil, err
		}
		var ns []shownNotification
		return ns, json.Unmarshal([]byte(raw), &ns)
	}
	notifications := func() []shownNotification {
		t.Helper()
		ns, err := shownNow()
		require.NoError(t, err)
		return ns
	}
	deliver()
	var shown []shownNotification
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		var err error
		if shown, err = shownNow(); err == nil && len(shown) == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the worker never showed the push: last read %d shown, error %v", len(shown), err)
		}
	}
	n := shown[0]
	require.Equal(t, "Take your medicine", n.Title)
	require.Equal(t, "Evening dose\nTwo tablets with water", n.Body, "the subtitle leads the body: the Notification API has no subtitle")
	require.Equal(t, icon, n.Icon)
	require.Equal(t, image, n.Image)
	require.Equal(t, badge, n.Badge)
	require.True(t, n.RequireInteraction)
	require.Equal(t, head.MessageID, n.Tag, "a push without a tag of its own is tagged with its message, so a copy replaces it")
	require.Len(t, n.Actions, 2)
	require.Equal(t, "snooze", n.Actions[0].Action)
	require.Equal(t, "Done", n.Actions[1].Title)
	require.Equal(t, head.MessageID, n.Data.MessageID)
	require.Equal(t, link, n.Data.URL)
	require.Equal(t, map[string]string{"dose": "2"}, n.Data.Data)
	require.NotEmpty(t, n.Data.Receipt)

	// The delivered receipt, posted by the worker, is counted.
	require.Eventually(t, func() bool { return e.message(head.MessageID).Receipts.Confirmed == 1 }, 10*time.Second, 50*time.Millisecond,
		"the worker's delivered receipt was never counted")

	// A second copy of the same push (a resend) replaces the first.
	deliver()
	time.Sleep(300 * time.Millisecond) // what a second notification would need to show
	require.Len(t, notifications(), 1, "a copy of a push replaces it rather than showing twice")

	// The click. DevTools cannot click a notification, so the test
	// dispatches notificationclick in the worker itself, on the
	// notification the worker showed. Such an event has no user gesture
	// behind it, with which alone a browser lets a worker open a window:
	// the worker's clients.openWindow is watched instead.
	workerCtx := workerContext(t, ctx, origin+"/sdk/herald-sw.js")
	clicked, err := chromedp.Run(workerCtx, chromedp.Evaluate[string](`(async () => {
		self.__opened = [];
		self.clients.openWindow = (url) => { self.__opened.push(url); return Promise.resolve(null); };
		const [n] = await self.registration.getNotifications();
		self.dispatchEvent(new NotificationEvent("notificationclick", {notification: n, action: "snooze"}));
		for (let i = 0; i < 100 && self.__opened.length === 0; i++) await new Promise(r => setTimeout(r, 20));
		return JSON.stringify(self.__opened);
	})()`, chromedp.EvalAwaitPromise))
	require.NoError(t, err)
	require.Equal(t, fmt.Sprintf("[%q]", link), clicked, "the click opens the message's url")
	require.Eventually(t, func() bool { return e.message(head.MessageID).Receipts.Opened == 1 }, 10*time.Second, 50*time.Millisecond,
		"the click's opened receipt was never counted")
	require.Eventually(t, func() bool { ns, err := shownNow(); return err == nil && len(ns) == 0 }, 5*time.Second, 50*time.Millisecond, "the click closes the notification")
	// The page heard of the push and of the click.
	require.Eventually(t, func() bool {
		got, err := chromedp.Run(ctx, chromedp.Evaluate[string](`Array.from(document.querySelectorAll("#pushes li")).map(li => li.textContent).join("\n")`))
		return err == nil && strings.Contains(got, "push "+head.MessageID) && strings.Contains(got, "click "+head.MessageID+" (snooze) -> "+link)
	}, 5*time.Second, 50*time.Millisecond, "the page never heard of the push and the click")
	b.screenshot("webkit-example")

	// A push that is not Herald's is left to the site's own handlers.
	_, err = chromedp.Call(ctx, serviceworker.DeliverPushMessage, serviceworker.DeliverPushMessageParams{
		Origin: origin, RegistrationID: registration, Data: `{"title":"someone else's"}`,
	})
	require.NoError(t, err)
	time.Sleep(300 * time.Millisecond)
	require.Empty(t, notifications())
}

// workerContext is a chromedp context on the service worker whose script
// is scriptURL (its query left aside), to evaluate in its global scope.
func workerContext(t *testing.T, ctx context.Context, scriptURL string) context.Context {
	t.Helper()
	var id target.ID
	require.Eventually(t, func() bool {
		infos, err := chromedp.Targets(ctx)
		require.NoError(t, err)
		for _, info := range infos {
			if info.Type == "service_worker" && strings.HasPrefix(info.URL, scriptURL) {
				id = info.TargetID
				return true
			}
		}
		return false
	}, 10*time.Second, 50*time.Millisecond, "no service worker target for %s", scriptURL)
	wctx, cancel := chromedp.NewContext(ctx, chromedp.WithTargetID(id))
	t.Cleanup(cancel)
	return wctx
}
