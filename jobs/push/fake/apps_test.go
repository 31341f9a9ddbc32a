package fake

import (
	"context"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"firebase.google.com/go/v4/errorutils"
	"firebase.google.com/go/v4/messaging"
	webpush "github.com/SherClockHolmes/webpush-go"
	"github.com/sideshow/apns2"
	"github.com/sideshow/apns2/token"
	"github.com/stretchr/testify/require"
	"golang.org/x/net/http2"
	"golang.org/x/oauth2"
	"golang.org/x/oauth2/google"
)

// Device tokens of the app brand-b, declared its in the tests that use them.
const (
	brandAPNsToken = "b0b1b2b3b4b5b6b7b8b9babbbcbdbebfc0c1c2c3c4c5c6c7c8c9cacbcccdcecf"
	brandFCMToken  = "brandB0x:APA91bHuN2d0example-token_value"
)

// addApp makes the app name through POST /_apps.
func (b *bundle) addApp(t testing.TB, name string) App {
	t.Helper()
	return b.appCall(t, "/_apps", `{"name":"`+name+`"}`, http.StatusCreated)
}

// appCall posts body to path and decodes the app it answers with.
func (b *bundle) appCall(t testing.TB, path, body string, status int) App {
	t.Helper()
	code, answer := b.postJSON(t, path, body)
	require.Equal(t, status, code, answer)
	var a App
	require.NoError(t, json.Unmarshal([]byte(answer), &a))
	return a
}

// getApp reads one app through GET /_apps/{name}.
func (b *bundle) getApp(t testing.TB, name string) App {
	t.Helper()
	var a App
	b.getJSON(t, "/_apps/"+name, &a)
	return a
}

// post posts body to path and requires the status.
func (b *bundle) post(t testing.TB, path, body string, status int) string {
	t.Helper()
	code, answer := b.postJSON(t, path, body)
	require.Equal(t, status, code, answer)
	return answer
}

// apnsClientOf is an apns2 client with an app's APNs credentials in use,
// on a connection of its own.
func (b *bundle) apnsClientOf(t testing.TB, a App) *apns2.Client {
	t.Helper()
	key, err := token.AuthKeyFromFile(a.APNs.KeyFile)
	require.NoError(t, err)
	c := apns2.NewTokenClient(&token.Token{AuthKey: key, KeyID: a.APNs.KeyID, TeamID: a.APNs.TeamID})
	c.Host = b.url
	tr := c.HTTPClient.Transport.(*http2.Transport)
	tr.TLSClientConfig = &tls.Config{RootCAs: b.pool}
	t.Cleanup(tr.CloseIdleConnections)
	return c
}

// fcmClientOf is a Firebase client with an app's service account in use.
func (b *bundle) fcmClientOf(t testing.TB, a App, project string) *messaging.Client {
	t.Helper()
	return b.fcmClientFrom(t, []byte(a.FCM.ServiceAccountJSON), project)
}

// webpushOptionsOf are webpush-go options with an app's VAPID keys in use.
func (b *bundle) webpushOptionsOf(a App) *webpush.Options {
	return &webpush.Options{
		HTTPClient:      b.client,
		Subscriber:      strings.TrimPrefix(a.WebPush.Subject, "mailto:"),
		VAPIDPublicKey:  a.WebPush.PublicKey,
		VAPIDPrivateKey: a.WebPush.PrivateKey,
		TTL:             60,
	}
}

// subscribeWith mints a subscription with the application server key key,
// as pushManager.subscribe does.
func (b *bundle) subscribeWith(t testing.TB, key string) *webpush.Subscription {
	t.Helper()
	answer := b.post(t, "/_webpush/subscriptions", `{"application_server_key":"`+key+`"}`, http.StatusCreated)
	var sub webpush.Subscription
	require.NoError(t, json.Unmarshal([]byte(answer), &sub))
	return &sub
}

// pushAPNs sends an alert with messageID through c and returns Apple's answer.
func pushAPNs(t testing.TB, c *apns2.Client, deviceToken, topic, messageID string) *apns2.Response {
	t.Helper()
	res, err := c.Push(&apns2.Notification{DeviceToken: deviceToken, Topic: topic,
		Payload: []byte(`{"aps":{"alert":"x"},"herald_message_id":"` + messageID + `"}`)})
	require.NoError(t, err)
	return res
}

// sendFCM sends a data message with messageID to deviceToken through c.
func sendFCM(c *messaging.Client, deviceToken, messageID string) error {
	_, err := c.Send(context.Background(), &messaging.Message{Token: deviceToken, Data: map[string]string{"herald_message_id": messageID}})
	return err
}

// onlyReceipt is the one receipt of messageID.
func (b *bundle) onlyReceipt(t testing.TB, messageID string) Receipt {
	t.Helper()
	rs := b.srv.Receipts(messageID)
	require.Len(t, rs, 1, messageID)
	return rs[0]
}

func TestAppNames(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"a", "brand-b", "0app", "a.b_c-d", strings.Repeat("x", 63), DefaultApp} {
		require.NoError(t, checkAppName(name), name)
	}
	for _, name := range []string{"", "Brand", "-b", ".b", "_b", "a/b", "a b", "b\x00", strings.Repeat("x", 64), "é"} {
		require.Error(t, checkAppName(name), name)
	}
	require.Equal(t, "herald-fake-a-b-c-d", appProject("a.b_c-d"))
	require.ErrorContains(t, Config{Apps: []string{"ok", "Not OK"}}.withDefaults().validate(), "Apps")
}

// TestAppsAreMadeAndListed: an app made through POST /_apps or Config.Apps
// has credentials of its own on every channel, kept in its directory and
// app.json; the default app's are those of DIR/env.
func TestAppsAreMadeAndListed(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *Config) { c.Apps = []string{"brand-c"} })
	brand := b.addApp(t, "brand-b")

	require.Equal(t, "brand-b", brand.Name)
	require.Equal(t, "com.heraldpush.brand-b", brand.APNs.Topic)
	require.Regexp(t, `^[A-Z2-7]{10}$`, brand.APNs.KeyID)
	require.Regexp(t, `^[A-Z2-7]{10}$`, brand.APNs.TeamID)
	require.Equal(t, filepath.Join(b.srv.Dir(), "apps", "brand-b", "apns-"+brand.APNs.KeyID+".p8"), brand.APNs.KeyFile)
	require.Equal(t, string(mustRead(t, brand.APNs.KeyFile)), strings.TrimSpace(brand.APNs.KeyPEM))
	require.Equal(t, []AppKey{{KeyID: brand.APNs.KeyID}}, brand.APNs.Keys)
	require.Equal(t, "herald-fake-brand-b", brand.FCM.ProjectID)
	require.Equal(t, string(mustRead(t, brand.FCM.CredentialsFile)), strings.TrimSpace(brand.FCM.ServiceAccountJSON))
	var sa serviceAccount
	require.NoError(t, json.Unmarshal([]byte(brand.FCM.ServiceAccountJSON), &sa))
	require.Equal(t, "herald-fake-brand-b", sa.ProjectID)
	require.Equal(t, brand.FCM.KeyID, sa.PrivateKeyID)
	require.Equal(t, "firebase-adminsdk-fake@herald-fake-brand-b.iam.gserviceaccount.com", sa.ClientEmail)
	require.Equal(t, b.srv.URL()+"/token", sa.TokenURI)
	require.Equal(t, brand.WebPush.PublicKey[:16], brand.WebPush.KeyID)
	require.Equal(t, DefaultVAPIDSubject, brand.WebPush.Subject)

	// The default app is DIR/env's.
	def := b.getApp(t, DefaultApp)
	require.Equal(t, b.env[EnvAPNsKeyID], def.APNs.KeyID)
	require.Equal(t, b.env[EnvAPNsTeamID], def.APNs.TeamID)
	require.Equal(t, b.env[EnvAPNsTopic], def.APNs.Topic)
	require.Equal(t, b.env[EnvAPNsKeyFile], def.APNs.KeyFile)
	require.Equal(t, b.env[EnvFCMCredentialsFile], def.FCM.CredentialsFile)
	require.Equal(t, string(mustRead(t, def.FCM.CredentialsFile)), strings.TrimSpace(def.FCM.ServiceAccountJSON))
	require.Equal(t, DefaultFCMProjectID, def.FCM.ProjectID)
	require.Equal(t, b.env[EnvVAPIDPublicKey], def.WebPush.PublicKey)
	require.Equal(t, b.env[EnvVAPIDPrivateKey], def.WebPush.PrivateKey)
	require.NoDirExists(t, filepath.Join(b.srv.Dir(), "apps", DefaultApp), "the default app needs no directory until its keys change")

	// Nothing is shared between the two.
	var defSA serviceAccount
	require.NoError(t, json.Unmarshal([]byte(def.FCM.ServiceAccountJSON), &defSA))
	require.NotEqual(t, def.APNs.KeyID, brand.APNs.KeyID)
	require.NotEqual(t, def.APNs.TeamID, brand.APNs.TeamID)
	require.NotEqual(t, def.APNs.KeyPEM, brand.APNs.KeyPEM)
	require.NotEqual(t, defSA.PrivateKeyID, sa.PrivateKeyID)
	require.NotEqual(t, defSA.PrivateKey, sa.PrivateKey)
	require.NotEqual(t, defSA.ClientEmail, sa.ClientEmail)
	require.NotEqual(t, def.WebPush.PublicKey, brand.WebPush.PublicKey)

	// app.json is the API's answer; asking again changes nothing.
	var onDisk App
	require.NoError(t, json.Unmarshal(mustRead(t, filepath.Join(b.srv.Dir(), "apps", "brand-b", "app.json")), &onDisk))
	require.Equal(t, brand, onDisk)
	require.Equal(t, brand, b.appCall(t, "/_apps", `{"name":"brand-b"}`, http.StatusOK))
	require.Equal(t, def, b.appCall(t, "/_apps", `{"name":"default"}`, http.StatusOK))
	require.Equal(t, brand, b.getApp(t, "brand-b"))

	var list []App
	b.getJSON(t, "/_apps", &list)
	require.Len(t, list, 3)
	require.Equal(t, []string{DefaultApp, "brand-b", "brand-c"}, []string{list[0].Name, list[1].Name, list[2].Name})
	require.Equal(t, "herald-fake-brand-c", list[2].FCM.ProjectID, "Config.Apps made brand-c")

	for body, message := range map[string]string{
		`{"name":""}`:      "1 to 63 characters",
		`{"name":"brAnd"}`: "may hold only",
		`{"name":"-b"}`:    "must start with",
		`{"name":"` + strings.Repeat("x", 64) + `"}`: "1 to 63 characters",
		`{"name":"brand_b"}`:                         "would have the Firebase project herald-fake-brand-b",
		`{"app":"x"}`:                                "unknown field",
	} {
		require.Contains(t, b.post(t, "/_apps", body, http.StatusBadRequest), message, body)
	}
	resp, err := b.client.Get(b.url + "/_apps/nope")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusNotFound, resp.StatusCode)
	resp, err = b.client.Get(b.url + "/_apps/No")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusBadRequest, resp.StatusCode)
}

// TestAppsAPNs: a provider token is checked against the key its kid names
// among every app's, the topic must be its app's, and a device token is its
// app's, as Apple checks them; receipts and /_stats say which app and key.
func TestAppsAPNs(t *testing.T) {
	t.Parallel()
	b := setup(t)
	brand := b.addApp(t, "brand-b")
	// Declared in upper case, pushed to in lower case: tokens are hex.
	b.post(t, "/_apps/brand-b/tokens", `{"channel":"apns","tokens":["`+strings.ToUpper(brandAPNsToken)+`"]}`, http.StatusNoContent)
	clientB, clientA := b.apnsClientOf(t, brand), b.apnsClient(t)
	topicA := b.env[EnvAPNsTopic]

	res := pushAPNs(t, clientB, brandAPNsToken, brand.APNs.Topic, "b-1")
	require.Equal(t, http.StatusOK, res.StatusCode, res.Reason)
	r := b.onlyReceipt(t, "b-1")
	require.Equal(t, "brand-b", r.App)
	require.Equal(t, brand.APNs.KeyID, r.KeyID)

	res = pushAPNs(t, clientB, brandAPNsToken, topicA, "b-2")
	require.Equal(t, http.StatusBadRequest, res.StatusCode)
	require.Equal(t, apns2.ReasonTopicDisallowed, res.Reason, "brand-b's key is not for the default app's topic")

	res = pushAPNs(t, clientB, apnsToken, brand.APNs.Topic, "b-3")
	require.Equal(t, http.StatusBadRequest, res.StatusCode)
	require.Equal(t, apns2.ReasonDeviceTokenNotForTopic, res.Reason, "a token not declared brand-b's is the default app's")

	res = pushAPNs(t, clientA, brandAPNsToken, topicA, "a-1")
	require.Equal(t, http.StatusBadRequest, res.StatusCode)
	require.Equal(t, apns2.ReasonDeviceTokenNotForTopic, res.Reason)

	keyB, err := token.AuthKeyFromBytes([]byte(brand.APNs.KeyPEM))
	require.NoError(t, err)
	bearer := signJWT(t, keyB, map[string]any{"kid": brand.APNs.KeyID}, map[string]any{"iss": b.env[EnvAPNsTeamID], "iat": time.Now().Unix()})
	res = pushAPNs(t, b.apnsClientWithBearer(t, bearer), brandAPNsToken, brand.APNs.Topic, "b-4")
	require.Equal(t, http.StatusForbidden, res.StatusCode)
	require.Equal(t, apns2.ReasonInvalidProviderToken, res.Reason, "brand-b's key with the default app's team")

	res = pushAPNs(t, clientA, apnsToken, topicA, "a-2")
	require.Equal(t, http.StatusOK, res.StatusCode, res.Reason)
	r = b.onlyReceipt(t, "a-2")
	require.Equal(t, DefaultApp, r.App)
	require.Equal(t, b.env[EnvAPNsKeyID], r.KeyID)

	st := b.stats(t)
	require.Equal(t, ChannelStats{Received: 6, Accepted: 2, Rejected: 4}, st.APNs)
	require.Equal(t, map[string]AppStats{
		"brand-b":  {APNs: AppChannelStats{Received: 4, Accepted: 1, Rejected: 3}},
		DefaultApp: {APNs: AppChannelStats{Received: 2, Accepted: 1, Rejected: 1}},
	}, st.Apps, "each push is its device token's app's")

	// A reset forgets the traffic, not the apps nor the tokens' owners.
	b.post(t, "/_reset", "", http.StatusNoContent)
	require.Nil(t, b.stats(t).Apps)
	res = pushAPNs(t, clientB, brandAPNsToken, brand.APNs.Topic, "b-5")
	require.Equal(t, http.StatusOK, res.StatusCode, res.Reason)
	require.Equal(t, AppStats{APNs: AppChannelStats{Received: 1, Accepted: 1}}, b.stats(t).Apps["brand-b"])

	// Back to the default app, a token is the default app's topic's again.
	b.post(t, "/_apps/default/tokens", `{"channel":"apns","tokens":["`+brandAPNsToken+`"]}`, http.StatusNoContent)
	res = pushAPNs(t, clientA, brandAPNsToken, topicA, "a-3")
	require.Equal(t, http.StatusOK, res.StatusCode, res.Reason)

	require.Contains(t, b.post(t, "/_apps/brand-b/tokens", `{"channel":"apns","tokens":["xyz"]}`, http.StatusBadRequest), "hex")
	require.Contains(t, b.post(t, "/_apps/brand-b/tokens", `{"channel":"webpush","tokens":["x"]}`, http.StatusBadRequest), "apns or fcm")
	b.post(t, "/_apps/nope/tokens", `{"channel":"apns","tokens":["ab"]}`, http.StatusNotFound)
}

// TestAppsFCM: an access token is its service account's project's, and a
// registration token its app's: a send through another app's project is
// SENDER_ID_MISMATCH, in the body FCM gives it.
func TestAppsFCM(t *testing.T) {
	t.Parallel()
	b := setup(t)
	brand := b.addApp(t, "brand-b")
	b.post(t, "/_apps/brand-b/tokens", `{"channel":"fcm","tokens":["`+brandFCMToken+`"]}`, http.StatusNoContent)
	clientB, clientA := b.fcmClientOf(t, brand, ""), b.fcmClient(t, "")

	name, err := clientB.Send(context.Background(), &messaging.Message{Token: brandFCMToken, Data: map[string]string{"herald_message_id": "fb-1"}})
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(name, "projects/herald-fake-brand-b/messages/"), name)
	r := b.onlyReceipt(t, "fb-1")
	require.Equal(t, "brand-b", r.App)
	require.Equal(t, brand.FCM.KeyID, r.KeyID)

	err = sendFCM(clientB, fcmToken, "fb-2")
	require.True(t, messaging.IsSenderIDMismatch(err), "got %v", err)
	resp := errorutils.HTTPResponse(err)
	require.Equal(t, http.StatusForbidden, resp.StatusCode)
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	var ge struct {
		Error struct {
			Code    int
			Status  string
			Details []map[string]string
		}
	}
	require.NoError(t, json.Unmarshal(body, &ge))
	require.Equal(t, http.StatusForbidden, ge.Error.Code)
	require.Equal(t, "PERMISSION_DENIED", ge.Error.Status)
	require.Equal(t, []map[string]string{{"@type": fcmErrorType, "errorCode": "SENDER_ID_MISMATCH"}}, ge.Error.Details)

	err = sendFCM(clientA, brandFCMToken, "fa-1")
	require.True(t, messaging.IsSenderIDMismatch(err), "got %v", err)

	err = sendFCM(b.fcmClientOf(t, brand, DefaultFCMProjectID), fcmToken, "fb-3")
	require.True(t, errorutils.IsPermissionDenied(err), "got %v", err)
	require.False(t, messaging.IsSenderIDMismatch(err), "brand-b's access token is refused the default project before any token is read")

	require.NoError(t, sendFCM(clientA, fcmToken, "fa-2"))
	require.Equal(t, DefaultApp, b.onlyReceipt(t, "fa-2").App)

	st := b.stats(t)
	require.Equal(t, AppChannelStats{Received: 3, Accepted: 1, Rejected: 2}, st.Apps["brand-b"].FCM)
	require.Equal(t, AppChannelStats{Received: 2, Accepted: 1, Rejected: 1}, st.Apps[DefaultApp].FCM)
}

// TestAppsWebPush: a subscription is bound to the application server key it
// was made with, any app's, and a push signed by another is refused.
func TestAppsWebPush(t *testing.T) {
	t.Parallel()
	b := setup(t)
	brand := b.addApp(t, "brand-b")
	subB, subA := b.subscribeWith(t, brand.WebPush.PublicKey), b.subscribe(t, false)
	optsB, optsA := b.webpushOptionsOf(brand), b.webpushOptions()

	status, body := sendWebPush(t, subB, optsB, `{"herald_message_id":"wb-1"}`)
	require.Equal(t, http.StatusCreated, status, body)
	r := b.onlyReceipt(t, "wb-1")
	require.Equal(t, "brand-b", r.App)
	require.Equal(t, brand.WebPush.PublicKey[:16], r.KeyID)
	require.Equal(t, subB.Endpoint, r.Token)

	status, body = sendWebPush(t, subB, optsA, `{"herald_message_id":"wb-2"}`)
	require.Equal(t, http.StatusForbidden, status, body)
	status, body = sendWebPush(t, subA, optsB, `{"herald_message_id":"wa-1"}`)
	require.Equal(t, http.StatusForbidden, status, body)
	status, body = sendWebPush(t, subA, optsA, `{"herald_message_id":"wa-2"}`)
	require.Equal(t, http.StatusCreated, status, body)
	require.Equal(t, DefaultApp, b.onlyReceipt(t, "wa-2").App)

	// The default app's own key, named, makes what no key makes; padding is
	// allowed.
	subDef := b.subscribeWith(t, b.env[EnvVAPIDPublicKey]+"=")
	require.Len(t, subDef.Endpoint, len(subA.Endpoint))
	require.NotEqual(t, len(subA.Endpoint), len(subB.Endpoint), "a subscription of another key carries it")

	_, otherPub, err := webpush.GenerateVAPIDKeys()
	require.NoError(t, err)
	require.Contains(t, b.post(t, "/_webpush/subscriptions", `{"application_server_key":"`+otherPub+`"}`, http.StatusBadRequest), "application_server_key")
	b.post(t, "/_webpush/subscriptions", `{"application_server_key":"not a key"}`, http.StatusBadRequest)

	require.Equal(t, AppChannelStats{Received: 2, Accepted: 1, Rejected: 1}, b.stats(t).Apps["brand-b"].WebPush)
}

// TestAppsRotateAndRevoke: a rotation gives an app a new key while its old
// ones stay valid; a revocation ends a key, which each provider then
// refuses as it refuses a deleted key.
func TestAppsRotateAndRevoke(t *testing.T) {
	t.Parallel()
	b := setup(t)

	t.Run("apns", func(t *testing.T) {
		t.Parallel()
		a := b.addApp(t, "rot-apns")
		b.post(t, "/_apps/rot-apns/tokens", `{"channel":"apns","tokens":["`+brandAPNsToken+`"]}`, http.StatusNoContent)
		old := b.apnsClientOf(t, a)
		require.Equal(t, http.StatusOK, pushAPNs(t, old, brandAPNsToken, a.APNs.Topic, "ra-1").StatusCode)

		rot := b.appCall(t, "/_apps/rot-apns/rotate", `{"channel":"apns"}`, http.StatusOK)
		require.NotEqual(t, a.APNs.KeyID, rot.APNs.KeyID)
		require.NotEqual(t, a.APNs.KeyPEM, rot.APNs.KeyPEM)
		require.Equal(t, a.APNs.TeamID, rot.APNs.TeamID)
		require.Equal(t, a.APNs.Topic, rot.APNs.Topic)
		require.Equal(t, []AppKey{{KeyID: a.APNs.KeyID}, {KeyID: rot.APNs.KeyID}}, rot.APNs.Keys)
		require.Equal(t, a.FCM.KeyID, rot.FCM.KeyID, "the other channels keep their keys")
		require.Equal(t, a.WebPush.PublicKey, rot.WebPush.PublicKey)
		require.FileExists(t, a.APNs.KeyFile, "the old key stays on disk")

		fresh := b.apnsClientOf(t, rot)
		require.Equal(t, http.StatusOK, pushAPNs(t, fresh, brandAPNsToken, a.APNs.Topic, "ra-2").StatusCode)
		require.Equal(t, rot.APNs.KeyID, b.onlyReceipt(t, "ra-2").KeyID)
		require.Equal(t, http.StatusOK, pushAPNs(t, old, brandAPNsToken, a.APNs.Topic, "ra-3").StatusCode, "the old key is valid until revoked")
		require.Equal(t, a.APNs.KeyID, b.onlyReceipt(t, "ra-3").KeyID)

		b.post(t, "/_apps/rot-apns/revoke", `{"channel":"apns","key_id":"`+a.APNs.KeyID+`"}`, http.StatusNoContent)
		// The old client's token was verified before: its key is checked again.
		res := pushAPNs(t, old, brandAPNsToken, a.APNs.Topic, "ra-4")
		require.Equal(t, http.StatusForbidden, res.StatusCode)
		require.Equal(t, apns2.ReasonInvalidProviderToken, res.Reason)
		res = pushAPNs(t, b.apnsClientOf(t, a), brandAPNsToken, a.APNs.Topic, "ra-5")
		require.Equal(t, http.StatusForbidden, res.StatusCode)
		require.Equal(t, apns2.ReasonInvalidProviderToken, res.Reason, "a new token of the revoked key")
		require.Equal(t, http.StatusOK, pushAPNs(t, fresh, brandAPNsToken, a.APNs.Topic, "ra-6").StatusCode)
		require.Equal(t, []AppKey{{KeyID: a.APNs.KeyID, Revoked: true}, {KeyID: rot.APNs.KeyID}}, b.getApp(t, "rot-apns").APNs.Keys)

		// Without a key id, every key of the channel goes.
		b.post(t, "/_apps/rot-apns/revoke", `{"channel":"apns"}`, http.StatusNoContent)
		res = pushAPNs(t, fresh, brandAPNsToken, a.APNs.Topic, "ra-7")
		require.Equal(t, http.StatusForbidden, res.StatusCode)
		require.Equal(t, apns2.ReasonInvalidProviderToken, res.Reason)
	})

	t.Run("fcm", func(t *testing.T) {
		t.Parallel()
		a := b.addApp(t, "rot-fcm")
		b.post(t, "/_apps/rot-fcm/tokens", `{"channel":"fcm","tokens":["`+brandFCMToken+`"]}`, http.StatusNoContent)
		old := b.fcmClientOf(t, a, "")
		require.NoError(t, sendFCM(old, brandFCMToken, "rf-1"))

		rot := b.appCall(t, "/_apps/rot-fcm/rotate", `{"channel":"fcm"}`, http.StatusOK)
		var oldSA, newSA serviceAccount
		require.NoError(t, json.Unmarshal([]byte(a.FCM.ServiceAccountJSON), &oldSA))
		require.NoError(t, json.Unmarshal([]byte(rot.FCM.ServiceAccountJSON), &newSA))
		require.NotEqual(t, a.FCM.KeyID, rot.FCM.KeyID)
		require.Equal(t, rot.FCM.KeyID, newSA.PrivateKeyID)
		require.NotEqual(t, oldSA.PrivateKey, newSA.PrivateKey)
		require.Equal(t, oldSA.ClientEmail, newSA.ClientEmail)
		require.Equal(t, a.FCM.ProjectID, rot.FCM.ProjectID)
		require.Equal(t, rot.FCM.ServiceAccountJSON, string(mustRead(t, rot.FCM.CredentialsFile))+"\n", "the credentials file holds the new key")

		fresh := b.fcmClientOf(t, rot, "")
		require.NoError(t, sendFCM(fresh, brandFCMToken, "rf-2"))
		require.Equal(t, rot.FCM.KeyID, b.onlyReceipt(t, "rf-2").KeyID)
		require.NoError(t, sendFCM(old, brandFCMToken, "rf-3"), "the old key is valid until revoked")
		require.Equal(t, a.FCM.KeyID, b.onlyReceipt(t, "rf-3").KeyID)

		b.post(t, "/_apps/rot-fcm/revoke", `{"channel":"fcm","key_id":"`+a.FCM.KeyID+`"}`, http.StatusNoContent)
		err := sendFCM(old, brandFCMToken, "rf-4")
		require.True(t, errorutils.IsUnauthenticated(err), "an access token of the revoked key: got %v", err)
		require.Equal(t, http.StatusUnauthorized, errorutils.HTTPResponse(err).StatusCode)

		// The token endpoint refuses the revoked key, as Google refuses a
		// deleted one.
		block, _ := pem.Decode([]byte(oldSA.PrivateKey))
		parsed, err := x509.ParsePKCS8PrivateKey(block.Bytes)
		require.NoError(t, err)
		now := time.Now().Unix()
		assertion := signJWT(t, parsed.(*rsa.PrivateKey), map[string]any{"kid": a.FCM.KeyID}, map[string]any{
			"iss": oldSA.ClientEmail, "aud": b.url + "/token", "scope": "https://www.googleapis.com/auth/firebase.messaging", "iat": now, "exp": now + 3600,
		})
		resp, err := b.client.PostForm(b.url+"/token", url.Values{"grant_type": {jwtBearerGrantType}, "assertion": {assertion}})
		require.NoError(t, err)
		var answer struct{ Error string }
		require.NoError(t, jsonDecode(resp.Body, &answer))
		resp.Body.Close()
		require.Equal(t, http.StatusBadRequest, resp.StatusCode)
		require.Equal(t, "invalid_grant", answer.Error)
		// So does Google's own client library, which the Firebase SDK uses.
		ctx := context.WithValue(context.Background(), oauth2.HTTPClient, b.client)
		creds, err := google.CredentialsFromJSONWithType(ctx, []byte(a.FCM.ServiceAccountJSON), google.ServiceAccount, "https://www.googleapis.com/auth/firebase.messaging")
		require.NoError(t, err)
		_, err = creds.TokenSource.Token()
		require.ErrorContains(t, err, "invalid_grant")

		require.NoError(t, sendFCM(fresh, brandFCMToken, "rf-6"))
	})

	t.Run("webpush", func(t *testing.T) {
		t.Parallel()
		a := b.addApp(t, "rot-webpush")
		oldSub, oldOpts := b.subscribeWith(t, a.WebPush.PublicKey), b.webpushOptionsOf(a)

		rot := b.appCall(t, "/_apps/rot-webpush/rotate", `{"channel":"webpush"}`, http.StatusOK)
		require.NotEqual(t, a.WebPush.PublicKey, rot.WebPush.PublicKey)
		require.NotEqual(t, a.WebPush.PrivateKey, rot.WebPush.PrivateKey)
		require.Equal(t, []AppKey{{KeyID: a.WebPush.KeyID}, {KeyID: rot.WebPush.KeyID}}, rot.WebPush.Keys)
		newSub, newOpts := b.subscribeWith(t, rot.WebPush.PublicKey), b.webpushOptionsOf(rot)

		status, body := sendWebPush(t, newSub, newOpts, `{"herald_message_id":"rw-1"}`)
		require.Equal(t, http.StatusCreated, status, body)
		require.Equal(t, rot.WebPush.KeyID, b.onlyReceipt(t, "rw-1").KeyID)
		status, body = sendWebPush(t, oldSub, oldOpts, `{"herald_message_id":"rw-2"}`)
		require.Equal(t, http.StatusCreated, status, "an old subscription keeps the key it was made with: %s", body)
		require.Equal(t, a.WebPush.KeyID, b.onlyReceipt(t, "rw-2").KeyID)
		status, _ = sendWebPush(t, oldSub, newOpts, `{}`)
		require.Equal(t, http.StatusForbidden, status, "not its key, even of its app")
		status, _ = sendWebPush(t, newSub, oldOpts, `{}`)
		require.Equal(t, http.StatusForbidden, status)

		b.post(t, "/_apps/rot-webpush/revoke", `{"channel":"webpush","key_id":"`+a.WebPush.KeyID+`"}`, http.StatusNoContent)
		status, body = sendWebPush(t, oldSub, oldOpts, `{}`)
		require.Equal(t, http.StatusForbidden, status)
		require.Contains(t, body, "revoked")
		status, body = sendWebPush(t, newSub, newOpts, `{}`)
		require.Equal(t, http.StatusCreated, status, body)
	})

	t.Run("refused", func(t *testing.T) {
		t.Parallel()
		b.post(t, "/_apps/nope/rotate", `{"channel":"apns"}`, http.StatusNotFound)
		b.post(t, "/_apps/nope/revoke", `{"channel":"apns"}`, http.StatusNotFound)
		require.Contains(t, b.post(t, "/_apps/default/rotate", `{"channel":"sms"}`, http.StatusBadRequest), "channel")
		require.Contains(t, b.post(t, "/_apps/default/rotate", `{"channel":"apns","key_id":"X"}`, http.StatusBadRequest), "key_id")
		require.Contains(t, b.post(t, "/_apps/default/revoke", `{"channel":"apns","key_id":"NOSUCHKEY0"}`, http.StatusBadRequest), "NOSUCHKEY0")
	})
}

// TestDefaultAppRotates: the default app's keys rotate like any app's, and
// DIR/env follows the key in use, while the files it named before keep the
// old keys valid until they are revoked.
func TestDefaultAppRotates(t *testing.T) {
	t.Parallel()
	b := setup(t)
	before := b.env
	oldAPNs, oldFCM := b.apnsClient(t), b.fcmClient(t, "")
	oldSub := b.subscribe(t, false)

	for _, ch := range []string{"apns", "fcm", "webpush"} {
		b.appCall(t, "/_apps/default/rotate", `{"channel":"`+ch+`"}`, http.StatusOK)
	}
	def := b.getApp(t, DefaultApp)
	env := b.srv.Env()
	require.Equal(t, env, ParseEnvFile(mustRead(t, b.srv.EnvFile())), "DIR/env is rewritten")
	require.Equal(t, def.APNs.KeyID, env[EnvAPNsKeyID])
	require.NotEqual(t, before[EnvAPNsKeyID], env[EnvAPNsKeyID])
	require.Equal(t, before[EnvAPNsTeamID], env[EnvAPNsTeamID])
	require.Equal(t, before[EnvAPNsTopic], env[EnvAPNsTopic])
	require.Equal(t, filepath.Join(b.srv.Dir(), "apps", DefaultApp, "apns-"+def.APNs.KeyID+".p8"), env[EnvAPNsKeyFile])
	require.Equal(t, filepath.Join(b.srv.Dir(), "apps", DefaultApp, "service-account.json"), env[EnvFCMCredentialsFile])
	require.Equal(t, def.WebPush.PublicKey, env[EnvVAPIDPublicKey])
	require.NotEqual(t, before[EnvVAPIDPublicKey], env[EnvVAPIDPublicKey])
	require.NoFileExists(t, filepath.Join(b.srv.Dir(), "apps", DefaultApp, "app.json"), "the default app's file is DIR/env")

	nb := &bundle{srv: b.srv, env: env, url: b.url, pool: b.pool, client: b.client}
	require.Equal(t, http.StatusOK, pushAPNs(t, nb.apnsClient(t), apnsToken, env[EnvAPNsTopic], "d-1").StatusCode)
	require.Equal(t, def.APNs.KeyID, b.onlyReceipt(t, "d-1").KeyID)
	require.NoError(t, sendFCM(nb.fcmClient(t, ""), fcmToken, "d-2"))
	require.Equal(t, def.FCM.KeyID, b.onlyReceipt(t, "d-2").KeyID)
	newSub := nb.subscribe(t, false)
	status, body := sendWebPush(t, newSub, nb.webpushOptions(), `{"herald_message_id":"d-3"}`)
	require.Equal(t, http.StatusCreated, status, body)
	require.Equal(t, def.WebPush.KeyID, b.onlyReceipt(t, "d-3").KeyID)

	// What DIR/env named before still works, until revoked.
	require.Equal(t, http.StatusOK, pushAPNs(t, oldAPNs, apnsToken, env[EnvAPNsTopic], "d-4").StatusCode)
	require.NoError(t, sendFCM(oldFCM, fcmToken, "d-5"))
	status, body = sendWebPush(t, oldSub, b.webpushOptions(), `{"herald_message_id":"d-6"}`)
	require.Equal(t, http.StatusCreated, status, body)
	require.Equal(t, before[EnvAPNsKeyID], b.onlyReceipt(t, "d-4").KeyID)

	b.post(t, "/_apps/default/revoke", `{"channel":"apns","key_id":"`+before[EnvAPNsKeyID]+`"}`, http.StatusNoContent)
	res := pushAPNs(t, oldAPNs, apnsToken, env[EnvAPNsTopic], "d-7")
	require.Equal(t, http.StatusForbidden, res.StatusCode)
	require.Equal(t, apns2.ReasonInvalidProviderToken, res.Reason)
}

// TestAppsSurviveRestart: a new Server on the same directory knows every
// app, made by Config.Apps or at run time, with its rotated keys, its
// revocations and its tokens.
func TestAppsSurviveRestart(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	start := func(cfg Config) *bundle {
		cfg.Addr, cfg.TLSDir = "127.0.0.1:0", dir
		srv, err := New(cfg)
		require.NoError(t, err)
		require.NoError(t, srv.Start(context.Background()))
		t.Cleanup(func() { srv.Close() })
		client := srv.HTTPClient()
		t.Cleanup(client.CloseIdleConnections)
		return &bundle{srv: srv, env: srv.Env(), url: srv.URL(), pool: srv.CertPool(), client: client}
	}

	b1 := start(Config{Apps: []string{"brand-b"}})
	brand := b1.getApp(t, "brand-b")
	b1.post(t, "/_apps/brand-b/tokens", `{"channel":"apns","tokens":["`+brandAPNsToken+`"]}`, http.StatusNoContent)
	b1.post(t, "/_apps/brand-b/tokens", `{"channel":"fcm","tokens":["`+brandFCMToken+`"]}`, http.StatusNoContent)
	subB := b1.subscribeWith(t, brand.WebPush.PublicKey)
	rot := b1.appCall(t, "/_apps/brand-b/rotate", `{"channel":"apns"}`, http.StatusOK)
	b1.post(t, "/_apps/brand-b/revoke", `{"channel":"apns","key_id":"`+brand.APNs.KeyID+`"}`, http.StatusNoContent)
	oldDefSub := b1.subscribe(t, false)
	oldDefOpts := b1.webpushOptions()
	def := b1.appCall(t, "/_apps/default/rotate", `{"channel":"webpush"}`, http.StatusOK)
	b1.post(t, "/_apps/default/revoke", `{"channel":"webpush","key_id":"`+b1.env[EnvVAPIDPublicKey][:16]+`"}`, http.StatusNoContent)
	late := b1.addApp(t, "late")
	var apps1 []App
	b1.getJSON(t, "/_apps", &apps1)
	require.NoError(t, b1.srv.Close())

	// A keys.json without its team still knows it: the first key's.
	keysPath := filepath.Join(dir, "apps", "late", "keys.json")
	var m map[string]any
	require.NoError(t, json.Unmarshal(mustRead(t, keysPath), &m))
	require.Equal(t, late.APNs.TeamID, m["team_id"])
	delete(m, "team_id")
	data, err := json.Marshal(m)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(keysPath, data, 0o600))

	b2 := start(Config{}) // brand-b and late come from the directory
	var apps2 []App
	b2.getJSON(t, "/_apps", &apps2)
	require.Len(t, apps2, 3)
	for i := range apps2 {
		a1, a2 := apps1[i], apps2[i]
		require.Equal(t, a1.Name, a2.Name)
		require.Equal(t, a1.APNs, a2.APNs, a1.Name)
		require.Equal(t, a1.WebPush, a2.WebPush, a1.Name)
		require.Equal(t, a1.FCM.Keys, a2.FCM.Keys, a1.Name)
		require.Equal(t, a1.FCM.CredentialsFile, a2.FCM.CredentialsFile, a1.Name)
		require.Contains(t, a2.FCM.ServiceAccountJSON, b2.url+"/token", "the token_uri follows the new address")
	}
	require.Equal(t, late.APNs.KeyID, apps2[2].APNs.KeyID)
	var onDisk App
	require.NoError(t, json.Unmarshal(mustRead(t, filepath.Join(dir, "apps", "brand-b", "app.json")), &onDisk))
	require.Equal(t, apps2[1], onDisk, "app.json is rewritten for the new address")

	// The rotated key works and the revoked one does not, to a token still
	// brand-b's.
	res := pushAPNs(t, b2.apnsClientOf(t, rot), brandAPNsToken, brand.APNs.Topic, "r-1")
	require.Equal(t, http.StatusOK, res.StatusCode, res.Reason)
	require.Equal(t, "brand-b", b2.onlyReceipt(t, "r-1").App)
	res = pushAPNs(t, b2.apnsClientOf(t, brand), brandAPNsToken, brand.APNs.Topic, "r-2")
	require.Equal(t, http.StatusForbidden, res.StatusCode)
	require.Equal(t, apns2.ReasonInvalidProviderToken, res.Reason)
	require.NoError(t, sendFCM(b2.fcmClientOf(t, apps2[1], ""), brandFCMToken, "r-3"))
	require.Equal(t, "brand-b", b2.onlyReceipt(t, "r-3").App)

	// Subscriptions keep their key and its state.
	subB.Endpoint = strings.Replace(subB.Endpoint, b1.url, b2.url, 1)
	status, body := sendWebPush(t, subB, b2.webpushOptionsOf(brand), `{"herald_message_id":"r-4"}`)
	require.Equal(t, http.StatusCreated, status, body)
	oldDefSub.Endpoint = strings.Replace(oldDefSub.Endpoint, b1.url, b2.url, 1)
	oldDefOpts.HTTPClient = b2.client
	status, _ = sendWebPush(t, oldDefSub, oldDefOpts, `{}`)
	require.Equal(t, http.StatusForbidden, status, "the default app's first VAPID key stays revoked")
	require.Equal(t, def.WebPush.PublicKey, b2.env[EnvVAPIDPublicKey], "DIR/env names the rotated key")
	status, body = sendWebPush(t, b2.subscribe(t, false), b2.webpushOptions(), `{}`)
	require.Equal(t, http.StatusCreated, status, body)
}

// TestAccessTokenForms: an access token minted before fakepush had apps (16
// bytes, no key id) is the default app's first key's, and a bearer too long
// to be one is refused rather than read past its buffer.
func TestAccessTokenForms(t *testing.T) {
	t.Parallel()
	b := setup(t)
	raw := make([]byte, 16)
	exp := time.Now().Add(time.Hour).Unix()
	for i := range 8 {
		raw[i] = byte(exp >> (56 - 8*i))
	}
	legacy := accessTokenPrefix + b64(raw) + "." + b64(b.srv.accessTokenMAC(raw))
	key := b.srv.accessKey(b.srv.apps.load(), "Bearer "+legacy)
	require.NotNil(t, key)
	require.Equal(t, b.srv.creds.fcmKeyID, key.id)
	for _, bearer := range []string{
		accessTokenPrefix + strings.Repeat("A", 400) + "." + b64(raw),
		accessTokenPrefix + b64(raw) + "." + strings.Repeat("A", 40),
		accessTokenPrefix + b64(raw[:8]) + "." + b64(b.srv.accessTokenMAC(raw[:8])),
	} {
		require.False(t, b.srv.checkAccessToken("Bearer "+bearer))
	}
	req, err := http.NewRequest(http.MethodPost, b.url+"/v1/projects/herald-fake/messages:send", strings.NewReader(`{"message":{"token":"t1"}}`))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+accessTokenPrefix+strings.Repeat("A", 40)+".x")
	resp, err := b.client.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusUnauthorized, resp.StatusCode)
	_, err = os.Stat(filepath.Join(b.srv.Dir(), "apps"))
	require.ErrorIs(t, err, os.ErrNotExist, "a fakepush of one app writes no apps directory")
}
