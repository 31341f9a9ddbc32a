package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/heraldpush/herald/api/client"
	"github.com/heraldpush/herald/db"
	"github.com/heraldpush/herald/jobs/push/fake"
)

// testSecretKey is the HERALD_SECRET_KEY of the tests' Heralds.
var testSecretKey = base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{42}, 32))

// call makes one /v1 call with the test's key and a JSON body (nil for
// none), and returns the status and the body.
func (e *e2e) call(method, path string, body any) (int, []byte) {
	e.t.Helper()
	var r io.Reader
	if body != nil {
		raw, err := json.Marshal(body)
		require.NoError(e.t, err)
		r = bytes.NewReader(raw)
	}
	req, err := http.NewRequest(method, e.base+path, r)
	require.NoError(e.t, err)
	req.Header.Set("Authorization", "Bearer "+testAPIKey)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(e.t, err)
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	require.NoError(e.t, err)
	return resp.StatusCode, out
}

// callOK is call that must be answered want.
func (e *e2e) callOK(want int, method, path string, body any) []byte {
	e.t.Helper()
	status, out := e.call(method, path, body)
	require.Equal(e.t, want, status, "%s %s: %s", method, path, out)
	return out
}

// addApp makes app name at fakepush and in Herald with fakepush's
// credentials for it on APNs and Web Push, and waits until every worker
// sends with them.
func (e *e2e) addApp(name string) fake.App {
	e.t.Helper()
	fa, _, err := e.fake.AddApp(name)
	require.NoError(e.t, err)
	e.callOK(http.StatusCreated, http.MethodPost, "/v1/apps", map[string]string{"name": name})
	e.callOK(http.StatusCreated, http.MethodPost, "/v1/apps/"+name+"/credentials", map[string]any{"apns": map[string]string{
		"key_id": fa.APNs.KeyID, "team_id": fa.APNs.TeamID, "topic": fa.APNs.Topic, "key": fa.APNs.KeyPEM,
	}})
	e.callOK(http.StatusCreated, http.MethodPost, "/v1/apps/"+name+"/credentials", map[string]any{"webpush": map[string]string{
		"public_key": fa.WebPush.PublicKey, "private_key": fa.WebPush.PrivateKey, "subject": fa.WebPush.Subject,
	}})
	e.awaitApp(name, "apns", 1)
	return fa
}

// appHealth is the part of GET /v1/apps/{app} a test waits on.
type appHealth struct {
	Health map[string]struct {
		Workers int    `json:"workers"`
		Refused int64  `json:"refused"`
		Last    string `json:"last_refused"`
	} `json:"health"`
	VAPIDPublicKey string `json:"vapid_public_key"`
}

// awaitApp waits until workers worker processes report a client for the
// app's channel.
func (e *e2e) awaitApp(name, channel string, workers int) {
	e.t.Helper()
	require.Eventually(e.t, func() bool {
		var a appHealth
		status, out := e.call(http.MethodGet, "/v1/apps/"+name, nil)
		return status == http.StatusOK && json.Unmarshal(out, &a) == nil && a.Health[channel].Workers >= workers
	}, 20*time.Second, 100*time.Millisecond, "app %s's %s credential never reached %d workers", name, channel, workers)
}

// registerIn registers a device of user in app with a token (APNs) or a
// subscription (Web Push), and returns the answer.
func (e *e2e) registerIn(app, user, channel, token string, sub *fake.Subscription, applicationServerKey string, installation ...string) map[string]any {
	e.t.Helper()
	body := map[string]any{"user_id": user, "channel": channel, "app": app}
	if len(installation) > 0 {
		body["installation_id"] = installation[0]
	}
	if sub != nil {
		body["subscription"] = map[string]any{"endpoint": sub.Endpoint, "keys": map[string]string{"p256dh": sub.Keys.P256dh, "auth": sub.Keys.Auth}}
		if applicationServerKey != "" {
			body["application_server_key"] = applicationServerKey
		}
	} else {
		body["token"] = token
	}
	var out map[string]any
	require.NoError(e.t, json.Unmarshal(e.callOK(http.StatusCreated, http.MethodPost, "/v1/devices", body), &out))
	return out
}

// TestAppsSendWithTheirOwnCredentials is the black box of several apps:
// user ann has an iPhone with the default app, an iPhone with brand-b and
// a browser subscribed to brand-b's VAPID key. One message reaches all
// three, each signed with its own app's key and sent with its own app's
// topic as fakepush (which refuses a push of another app's topic or key)
// records them; a message for brand-b reaches only its two; and a brand-b
// token registered under the default app by mistake fails wrong_app,
// saying why, and is not evicted.
func TestAppsSendWithTheirOwnCredentials(t *testing.T) {
	t.Parallel()
	e := startE2E(t, map[string]string{"HERALD_SECRET_KEY": testSecretKey})
	brand := e.addApp("brand-b")
	def, err := e.fake.App("default")
	require.NoError(t, err)

	phoneA, phoneB, wrong := hexToken(""), hexToken(""), hexToken("")
	require.NoError(t, e.fake.DeclareAppTokens("brand-b", fake.AppTokens{Channel: "apns", Tokens: []string{phoneB, wrong}}))
	e.registerIn("", "ann", "apns", phoneA, nil, "")
	e.registerIn("brand-b", "ann", "apns", phoneB, nil, "")
	sub, err := e.fake.MintAppSubscription(brand.WebPush.PublicKey, false)
	require.NoError(t, err)
	browser := e.registerIn("brand-b", "ann", "webpush", "", &sub, brand.WebPush.PublicKey)
	require.Equal(t, "brand-b", browser["app"])
	require.Equal(t, brand.WebPush.PublicKey, browser["vapid_public_key"], "the answer gives the page the key to subscribe with")

	id := e.send(client.NewMessage{Audience: toUsers("ann"), Payload: titled("standup")}).MessageID
	require.Equal(t, client.MessageStateDispatched, e.settle(id, 30*time.Second).State)
	require.Empty(t, e.deliveries(id, client.DeliveryStatusFailed))
	got := map[string][2]string{}
	for _, r := range e.fake.Receipts(id) {
		got[r.Token] = [2]string{r.App, r.KeyID}
	}
	require.Equal(t, map[string][2]string{
		phoneA:       {"default", def.APNs.KeyID},
		phoneB:       {"brand-b", brand.APNs.KeyID},
		sub.Endpoint: {"brand-b", brand.WebPush.KeyID},
	}, got)

	// Counted app by app.
	byApp, err := e.api.ListMessageAppsWithResponse(t.Context(), id)
	answered(t, http.StatusOK, byApp, err)
	counts := map[string][2]int{}
	for _, it := range byApp.JSON200.Items {
		counts[*it.App] = [2]int{it.Deliveries.Total, it.Deliveries.Accepted}
	}
	require.Equal(t, map[string][2]int{"default": {1, 1}, "brand-b": {2, 2}}, counts)
	listed, err := e.api.ListAppsWithResponse(t.Context())
	answered(t, http.StatusOK, listed, err)
	var names []string
	for _, a := range listed.JSON200.Items {
		names = append(names, a.Name)
	}
	require.Equal(t, []string{"default", "brand-b"}, names)

	// Overrides for brand-b's devices: its own category and thread.
	var over client.MessageHead
	require.NoError(t, json.Unmarshal(e.callOK(http.StatusAccepted, http.MethodPost, "/v1/messages", map[string]any{
		"audience": map[string]any{"type": "users", "ids": []string{"ann"}},
		"payload": map[string]any{"title": "reply", "category": "REPLY", "thread_id": "chat",
			"apps": map[string]any{"brand-b": map[string]string{"category": "B_REPLY", "thread_id": "b-chat"}}},
	}), &over))
	require.Equal(t, client.MessageStateDispatched, e.settle(over.MessageID, 30*time.Second).State)
	shown := map[string]string{}
	for _, r := range e.fake.DetailedReceipts(over.MessageID) {
		if r.Channel != "apns" {
			continue
		}
		var body struct {
			APS struct {
				Category string `json:"category"`
				Thread   string `json:"thread-id"`
			} `json:"aps"`
		}
		require.NoError(t, json.Unmarshal(r.Body, &body))
		shown[r.Token] = body.APS.Category + "/" + body.APS.Thread
	}
	require.Equal(t, map[string]string{phoneA: "REPLY/chat", phoneB: "B_REPLY/b-chat"}, shown)
	status, out := e.call(http.MethodPost, "/v1/messages", map[string]any{
		"audience": map[string]any{"type": "users", "ids": []string{"ann"}},
		"payload":  map[string]any{"title": "x", "apps": map[string]any{"Brand B": map[string]string{"category": "X"}}},
	})
	require.Equal(t, http.StatusBadRequest, status, "%s", out)
	require.Contains(t, string(out), "payload.apps")

	// A message for brand-b alone.
	var only client.MessageHead
	require.NoError(t, json.Unmarshal(e.callOK(http.StatusAccepted, http.MethodPost, "/v1/messages", map[string]any{
		"audience": map[string]any{"type": "users", "ids": []string{"ann"}, "apps": []string{"brand-b"}},
		"payload":  map[string]string{"title": "brand-b only"},
	}), &only))
	require.Equal(t, client.MessageStateDispatched, e.settle(only.MessageID, 30*time.Second).State)
	var tokens []string
	for _, r := range e.fake.Receipts(only.MessageID) {
		tokens = append(tokens, r.Token)
	}
	require.ElementsMatch(t, []string{phoneB, sub.Endpoint}, tokens)
	status, out = e.call(http.MethodPost, "/v1/messages", map[string]any{
		"audience": map[string]any{"type": "users", "ids": []string{"ann"}, "apps": []string{"brand-c"}},
		"payload":  map[string]string{"title": "nobody"},
	})
	require.Equal(t, http.StatusBadRequest, status, "%s", out)
	require.Contains(t, string(out), `no app is named \"brand-c\"`)

	// brand-b's token registered as the default app's: the provider says
	// it is another app's, and so does the delivery.
	e.registerIn("", "bob", "apns", wrong, nil, "")
	id = e.send(client.NewMessage{Audience: toUsers("bob"), Payload: titled("mixed up")}).MessageID
	require.Equal(t, client.MessageStateDispatched, e.settle(id, 30*time.Second).State)
	failed := e.deliveries(id, client.DeliveryStatusFailed)
	require.Len(t, failed, 1)
	require.Equal(t, client.Reason("wrong_app"), *failed[0].Reason)
	require.Equal(t, client.DeviceStatusActive, e.userDevices("bob")[0].Status, "a token of another app is not evicted")
	// Registered under its own app, it is moved there and sent.
	again := e.callOK(http.StatusOK, http.MethodPost, "/v1/devices", map[string]any{"user_id": "bob", "channel": "apns", "token": wrong, "app": "brand-b"})
	require.Contains(t, string(again), `"app":"brand-b"`)
	id = e.send(client.NewMessage{Audience: toUsers("bob"), Payload: titled("sorted")}).MessageID
	require.Equal(t, client.MessageStateDispatched, e.settle(id, 30*time.Second).State)
	require.Empty(t, e.deliveries(id, client.DeliveryStatusFailed))

	// brand-b disabled: its devices are sent nothing, and say why; the
	// default app's go on. Enabled again with its APNs credential
	// retired, its iPhone has no client and says so.
	disabled, err := e.api.UpdateAppWithResponse(t.Context(), "brand-b", client.AppPatch{Disabled: true})
	answered(t, http.StatusOK, disabled, err)
	require.Eventually(t, func() bool {
		id := e.send(client.NewMessage{Audience: toUsers("ann"), Payload: titled("who gets it")}).MessageID
		e.settle(id, 30*time.Second)
		failed := e.appDeliveries(id, "failed")
		for _, d := range failed {
			require.Equal(t, "brand-b", *d.App)
			require.Equal(t, "channel_disabled", *d.Reason)
		}
		receipts := e.fake.Receipts(id)
		return len(failed) == 2 && len(receipts) == 1 && receipts[0].App == "default"
	}, 20*time.Second, 500*time.Millisecond, "a disabled app's devices are sent nothing")
	enabled, err := e.api.UpdateAppWithResponse(t.Context(), "brand-b", client.AppPatch{Disabled: false})
	answered(t, http.StatusOK, enabled, err)
	retired, err := e.api.RevokeAppCredentialsWithResponse(t.Context(), "brand-b", client.ChannelAPNs, nil)
	answered(t, http.StatusOK, retired, err)
	require.Len(t, retired.JSON200.Retired, 1)
	require.Eventually(t, func() bool {
		id := e.send(client.NewMessage{Audience: toUsers("ann"), Payload: titled("no key")}).MessageID
		e.settle(id, 30*time.Second)
		failed := e.appDeliveries(id, "failed")
		return len(failed) == 1 && *failed[0].App == "brand-b" && *failed[0].Reason == "channel_disabled" &&
			len(e.fake.Receipts(id)) == 2 // the default app's iPhone and brand-b's browser
	}, 20*time.Second, 500*time.Millisecond, "brand-b's iPhone, without an APNs credential, is not refused by itself")
}

// TestAppSecretsAreNeverShown stores an app's credentials and sends with
// them, then looks for any part of its private keys everywhere Herald
// writes or answers: every API answer about it, the audit log, the
// process's log, its metrics, River's tables and every table of Herald's
// but the sealed column. What the database holds of them is ciphertext.
func TestAppSecretsAreNeverShown(t *testing.T) {
	t.Parallel()
	fp, tdb, vars := e2eEnv(t)
	vars["HERALD_SECRET_KEY"] = testSecretKey
	vars["HERALD_LOG_LEVEL"] = "debug"
	base, _, logs, stop := startServeLog(t, vars, "--migrate")
	e := &e2e{t: t, fake: fp, base: base, stop: stop, vars: vars, db: tdb, api: newAPIClient(t, base, testAPIKey)}
	brand, _, err := fp.AddApp("brand-s")
	require.NoError(t, err)
	e.callOK(http.StatusCreated, http.MethodPost, "/v1/apps", map[string]string{"name": "brand-s"})
	var answers []string
	for _, in := range []map[string]any{
		{"apns": map[string]string{"key_id": brand.APNs.KeyID, "team_id": brand.APNs.TeamID, "topic": brand.APNs.Topic, "key": brand.APNs.KeyPEM}},
		{"fcm": map[string]string{"service_account": brand.FCM.ServiceAccountJSON}},
		{"webpush": map[string]string{"public_key": brand.WebPush.PublicKey, "private_key": brand.WebPush.PrivateKey, "subject": brand.WebPush.Subject}},
	} {
		answers = append(answers, string(e.callOK(http.StatusCreated, http.MethodPost, "/v1/apps/brand-s/credentials", in)))
	}
	answers = append(answers, string(e.callOK(http.StatusOK, http.MethodGet, "/v1/apps/brand-s", nil)),
		string(e.callOK(http.StatusOK, http.MethodGet, "/v1/apps", nil)),
		string(e.callOK(http.StatusOK, http.MethodGet, "/v1/audit", nil)))
	// A bad credential's error must not quote it either.
	status, out := e.call(http.MethodPost, "/v1/apps/brand-s/credentials", map[string]any{"apns": map[string]string{
		"key_id": brand.APNs.KeyID, "team_id": brand.APNs.TeamID, "topic": brand.APNs.Topic, "key": brand.APNs.KeyPEM[:len(brand.APNs.KeyPEM)-40]}})
	require.Equal(t, http.StatusBadRequest, status)
	answers = append(answers, string(out))
	e.awaitApp("brand-s", "fcm", 1)
	_, metrics := e.call(http.MethodGet, "/metrics", nil)
	require.NoError(t, stop())

	var sa struct {
		PrivateKey string `json:"private_key"`
	}
	require.NoError(t, json.Unmarshal([]byte(brand.FCM.ServiceAccountJSON), &sa))
	secrets := map[string]string{
		"the APNs .p8 key": pemBody(brand.APNs.KeyPEM), "the FCM service account's key": pemBody(sa.PrivateKey),
		"the VAPID private key": brand.WebPush.PrivateKey,
	}
	everything := map[string]string{"the API's answers": strings.Join(answers, "\n"), "the log": logs.String(), "the metrics": string(metrics),
		"the database": dumpDatabase(t, tdb.URL)}
	for what, secret := range secrets {
		require.Greater(t, len(secret), 30)
		for where, text := range everything {
			for _, part := range []string{secret[:24], secret[len(secret)-24:]} {
				require.NotContains(t, text, part, "%s appears in %s", what, where)
			}
		}
	}
}

// pemBody is a PEM block's base64 body on one line, as a leak would show
// some of it.
func pemBody(p string) string {
	var lines []string
	for _, l := range strings.Split(p, "\n") {
		if l != "" && !strings.HasPrefix(l, "-----") {
			lines = append(lines, l)
		}
	}
	return strings.Join(lines, "")
}

// dumpDatabase is every row of every table in Herald's and River's schema,
// as text, but for the sealed column of app_credentials, whose ciphertext
// is checked to hold no secret by jobs/apps's tests.
func dumpDatabase(t *testing.T, url string) string {
	t.Helper()
	ctx := context.Background()
	pool, err := db.Open(ctx, url, db.PoolConfig{MaxConns: 1})
	require.NoError(t, err)
	defer pool.Close()
	rows, err := pool.Query(ctx, `SELECT table_schema, table_name FROM information_schema.tables
		WHERE table_schema NOT IN ('pg_catalog', 'information_schema') AND table_type = 'BASE TABLE'`)
	require.NoError(t, err)
	var tables [][2]string
	for rows.Next() {
		var s, n string
		require.NoError(t, rows.Scan(&s, &n))
		tables = append(tables, [2]string{s, n})
	}
	require.NoError(t, rows.Err())
	var b strings.Builder
	for _, tb := range tables {
		q := fmt.Sprintf(`SELECT to_jsonb(t)::text FROM %q.%q t`, tb[0], tb[1])
		if tb[1] == "app_credentials" {
			q = fmt.Sprintf(`SELECT (to_jsonb(t) - 'sealed')::text FROM %q.%q t`, tb[0], tb[1])
		}
		rows, err := pool.Query(ctx, q)
		require.NoError(t, err, tb)
		for rows.Next() {
			var line string
			require.NoError(t, rows.Scan(&line))
			b.WriteString(line)
			b.WriteByte('\n')
		}
		require.NoError(t, rows.Err())
	}
	require.Contains(t, b.String(), `"app_id"`, "the dump holds the credentials' rows")
	return b.String()
}

// TestAppVAPIDRotationKeepsOldSubscriptions rotates brand-v's VAPID key: a
// browser subscribed with the old key is still sent, signed with that key
// (a push service refuses any other), while a registration answers the new
// key, a subscription made with it is signed with it, and the old browser,
// subscribing again with the new key, is sent with the new one.
func TestAppVAPIDRotationKeepsOldSubscriptions(t *testing.T) {
	t.Parallel()
	e := startE2E(t, map[string]string{"HERALD_SECRET_KEY": testSecretKey})
	old := e.addApp("brand-v")
	oldSub, err := e.fake.MintAppSubscription(old.WebPush.PublicKey, false)
	require.NoError(t, err)
	e.registerIn("brand-v", "vic", "webpush", "", &oldSub, old.WebPush.PublicKey, "vics-browser")

	rotated, err := e.fake.RotateAppKey("brand-v", "webpush")
	require.NoError(t, err)
	e.callOK(http.StatusCreated, http.MethodPost, "/v1/apps/brand-v/credentials", map[string]any{"webpush": map[string]string{
		"public_key": rotated.WebPush.PublicKey, "private_key": rotated.WebPush.PrivateKey, "subject": rotated.WebPush.Subject,
	}})
	var app appHealth
	require.Eventually(t, func() bool {
		require.NoError(t, json.Unmarshal(e.callOK(http.StatusOK, http.MethodGet, "/v1/apps/brand-v", nil), &app))
		return app.VAPIDPublicKey == rotated.WebPush.PublicKey
	}, 10*time.Second, 100*time.Millisecond)
	newSub, err := e.fake.MintAppSubscription(rotated.WebPush.PublicKey, false)
	require.NoError(t, err)
	answer := e.registerIn("brand-v", "wes", "webpush", "", &newSub, "")
	require.Equal(t, rotated.WebPush.PublicKey, answer["vapid_public_key"])
	// Every worker has the new credential once the API shows its key:
	// the one process here reads the apps for both.

	keyOf := func(id string) map[string]string {
		out := map[string]string{}
		for _, r := range e.fake.Receipts(id) {
			out[r.Token] = r.KeyID
		}
		return out
	}
	id := e.send(client.NewMessage{Audience: toUsers("vic", "wes"), Payload: titled("after the rotation")}).MessageID
	require.Equal(t, client.MessageStateDispatched, e.settle(id, 30*time.Second).State)
	require.Empty(t, e.deliveries(id, client.DeliveryStatusFailed))
	require.Equal(t, map[string]string{oldSub.Endpoint: old.WebPush.KeyID, newSub.Endpoint: rotated.WebPush.KeyID}, keyOf(id))

	// The old browser's pushsubscriptionchange: a new subscription, made
	// with the key the answer gave, registered under its installation, so
	// that it replaces the old one.
	again, err := e.fake.MintAppSubscription(rotated.WebPush.PublicKey, false)
	require.NoError(t, err)
	var reg map[string]any
	require.NoError(t, json.Unmarshal(e.callOK(http.StatusOK, http.MethodPost, "/v1/devices", map[string]any{
		"user_id": "vic", "channel": "webpush", "app": "brand-v", "installation_id": "vics-browser", "application_server_key": rotated.WebPush.PublicKey,
		"subscription": map[string]any{"endpoint": again.Endpoint, "keys": map[string]string{"p256dh": again.Keys.P256dh, "auth": again.Keys.Auth}},
	}), &reg))
	id = e.send(client.NewMessage{Audience: toUsers("vic"), Payload: titled("subscribed again")}).MessageID
	require.Equal(t, client.MessageStateDispatched, e.settle(id, 30*time.Second).State)
	require.Equal(t, map[string]string{again.Endpoint: rotated.WebPush.KeyID}, keyOf(id))
}
