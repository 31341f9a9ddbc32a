package main

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/device"
	"github.com/stretchr/testify/require"

	"github.com/heraldpush/herald/api/client"
	"github.com/heraldpush/herald/db"
	"github.com/heraldpush/herald/db/dbtest"
	"github.com/heraldpush/herald/jobs/preferences"
)

// TestE2EBrowserPreferencesForm: the backend asks for a link to a user's
// own form, and a real Chromium, sized and behaving as a phone, opens it
// through a proxy that puts Herald's public listener under a path of its
// site (HERALD_PUBLIC_URL). The form shows the declared categories, a
// critical one on and locked; the user turns a category off, one
// category's Browser channel off and sets quiet hours of their own, and
// saves: the database holds exactly that, and the form shows it again
// after a reload, the token gone from the address bar.
func TestE2EBrowserPreferencesForm(t *testing.T) {
	t.Parallel()
	chromium := findChromium(t)
	ctx := context.Background()

	// The site's proxy: /herald/ of its origin is Herald's public listener,
	// whose address is known once Herald has started.
	var public atomic.Pointer[url.URL]
	proxy := httptest.NewServer(&httputil.ReverseProxy{Rewrite: func(r *httputil.ProxyRequest) {
		r.SetURL(public.Load())
		r.Out.URL.Path = strings.TrimPrefix(r.In.URL.Path, "/herald")
		r.Out.URL.RawPath = ""
	}})
	t.Cleanup(proxy.Close)

	tdb := dbtest.New(t)
	_, _, vars := e2eEnvOn(t, tdb)
	vars["HERALD_PUBLIC_ADDR"] = "127.0.0.1:0"
	vars["HERALD_PUBLIC_URL"] = proxy.URL + "/herald/"
	base, out, _ := startServeOut(t, vars, "--role", "api")
	m := regexp.MustCompile(`public listener on (http://\S+)`).FindStringSubmatch(out.String())
	require.NotNil(t, m, "serve never said where its public listener is:\n%s", out.String())
	publicURL, err := url.Parse(m[1])
	require.NoError(t, err)
	public.Store(publicURL)

	_, err = tdb.Pool.Exec(ctx, `INSERT INTO categories (name, critical) VALUES ('marketing', false), ('reminders', false), ('security', true)`)
	require.NoError(t, err)
	api := newAPIClient(t, base, testAPIKey)
	res, err := api.PutUserWithResponse(ctx, "ann", client.UserUpdate{Timezone: new("Europe/Berlin")})
	answered(t, http.StatusCreated, res, err)
	made, err := api.CreatePreferencesLinkWithResponse(ctx, "ann", client.NewPreferencesLink{TTLSeconds: new(3600)})
	link := answered(t, http.StatusCreated, made, err).JSON201
	require.Equal(t, proxy.URL+"/herald/preferences#token="+link.Token, link.URL)

	b := tab{t: t, ctx: newBrowser(t, chromium)}
	category := func(name string) string { return `fieldset.category[data-category="` + name + `"]` }
	box := func(name, channel string) string { return category(name) + ` input[data-channel="` + channel + `"]` }
	b.do(chromedp.Emulate(device.IPhone13), chromedp.Navigate(link.URL), visible(category("security")))

	require.Equal(t, "marketing,reminders,security",
		evaluate[string](b, `[...document.querySelectorAll("fieldset.category legend")].map(l => l.textContent).join()`))
	require.True(t, evaluate[bool](b, `[...document.querySelectorAll('`+category("security")+` input')].every(i => i.checked && i.disabled)`),
		"a critical category is on and cannot be turned off")
	require.Contains(t, b.text(category("security")+" .hint"), "Always sent")
	require.True(t, evaluate[bool](b, `[...document.querySelectorAll('`+category("marketing")+` input')].every(i => i.checked && !i.disabled)`))
	require.Equal(t, []string{"iPhone/iPad", "Android", "Browser"}, strings.Split(evaluate[string](b,
		`[...document.querySelectorAll('`+category("reminders")+` .channels label')].map(l => l.textContent).join("|")`), "|"))
	require.Equal(t, "Send me these", b.text(`label[for="`+evaluate[string](b, `document.querySelector('`+box("reminders", "all")+`').id`)+`"]`),
		"each box has its label")
	require.True(t, evaluate[bool](b, `document.getElementById("quiet-off").checked`), "no quiet hours: neither the user's nor the installation's")
	require.Contains(t, b.text("#quiet-zone"), "Europe/Berlin")
	require.Empty(t, evaluate[string](b, `location.hash`), "the token is off the address bar")
	require.LessOrEqual(t, evaluate[int](b, `document.documentElement.scrollWidth`), evaluate[int](b, `window.innerWidth`),
		"the form fits a phone's width")
	b.screenshot("preferences-form")

	// Marketing off everywhere, reminders off in the browser, quiet hours
	// from 22:30 to 06:45.
	b.do(click(box("marketing", "all")), click(box("reminders", "webpush")), click("#quiet-on"), visible("#quiet-start"))
	require.True(t, evaluate[bool](b, `document.querySelector('`+box("marketing", "apns")+`').disabled`),
		"a category turned off has no channels to choose")
	b.do(chromedp.SetValue(chromedp.CSS("#quiet-start"), "22:30"), chromedp.SetValue(chromedp.CSS("#quiet-end"), "06:45"), click("#save"))
	saved, err := chromedp.Run(b.ctx, chromedp.Poll[bool](`document.getElementById("status").textContent === "Saved"`,
		chromedp.WithPollingTimeout(10*time.Second)))
	require.NoError(t, err, "the form never said Saved: %q", b.text("#status"))
	require.True(t, saved)

	stored, err := db.On(tdb.Pool).GetUserPreferences(ctx, "ann")
	require.NoError(t, err)
	require.Equal(t, []string{"marketing", "reminders:webpush"}, stored.OptOuts)
	quiet, _ := preferences.WindowOf(stored.QuietStart, stored.QuietEnd)
	require.Equal(t, "22:30-06:45", quiet.Start.String()+"-"+quiet.End.String())
	b.screenshot("preferences-form-saved")

	// Again, from the token the tab kept.
	b.do(chromedp.Reload(), visible(category("security")))
	require.False(t, evaluate[bool](b, `document.querySelector('`+box("marketing", "all")+`').checked`))
	require.False(t, evaluate[bool](b, `document.querySelector('`+box("reminders", "webpush")+`').checked`))
	require.True(t, evaluate[bool](b, `document.querySelector('`+box("reminders", "fcm")+`').checked`))
	require.True(t, evaluate[bool](b, `document.getElementById("quiet-on").checked`))
	require.Equal(t, "22:30", evaluate[string](b, `document.getElementById("quiet-start").value`))
	require.Equal(t, "06:45", evaluate[string](b, `document.getElementById("quiet-end").value`))

	// The same token through the generated client, as an app with a
	// screen of its own calls Herald: the form's view, and a replacement.
	own, err := client.NewClientWithResponses(proxy.URL+"/herald", client.WithRequestEditorFn(func(_ context.Context, req *http.Request) error {
		req.Header.Set("Authorization", "Bearer "+link.Token)
		return nil
	}))
	require.NoError(t, err)
	view, err := own.GetOwnPreferencesWithResponse(ctx)
	got := answered(t, http.StatusOK, view, err).JSON200
	require.Equal(t, "Europe/Berlin", got.Timezone)
	require.Len(t, got.Categories, 3)
	require.Equal(t, &client.QuietHours{Start: "22:30", End: "06:45"}, got.QuietHours)
	replaced, err := own.PutOwnPreferencesWithResponse(ctx, client.PreferencesUpdate{
		OptOuts: &[]client.OptOut{{Category: "reminders", Channel: new(client.ChannelAPNs)}},
	})
	got = answered(t, http.StatusOK, replaced, err).JSON200
	require.Equal(t, []client.OptOut{{Category: "reminders", Channel: new(client.ChannelAPNs)}}, got.OptOuts)
	require.Nil(t, got.QuietHours, "none given: the installation's")
	stored, err = db.On(tdb.Pool).GetUserPreferences(ctx, "ann")
	require.NoError(t, err)
	require.Equal(t, []string{"reminders:apns"}, stored.OptOuts)

	// Another link opened in the tab is taken; one that was changed says
	// so, and shows no form.
	b.goHash("#token=x" + link.Token[1:])
	b.do(visible("#status.error"))
	require.Contains(t, b.text("#status"), "not valid")
	require.True(t, evaluate[bool](b, `document.getElementById("form").hidden`))
	require.Empty(t, evaluate[string](b, `location.hash`))
	b.do(chromedp.Reload(), visible("#status.error"))
	require.Contains(t, b.text("#status"), "not valid", "the tab keeps the last link's token")
}
