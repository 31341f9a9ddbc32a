package fake

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	firebase "firebase.google.com/go/v4"
	"firebase.google.com/go/v4/messaging"
	webpush "github.com/SherClockHolmes/webpush-go"
	"github.com/sideshow/apns2"
	"github.com/sideshow/apns2/token"
	"github.com/stretchr/testify/require"
	"golang.org/x/net/http2"
	"golang.org/x/oauth2"
	"golang.org/x/oauth2/google"
	"google.golang.org/api/option"
)

// bundle is what most tests need: a running fakepush, its env, and an HTTP
// client that trusts its CA. srv is nil when fakepush runs in another process.
type bundle struct {
	srv    *Server
	env    map[string]string
	url    string
	pool   *x509.CertPool
	client *http.Client
}

// bundleFromEnv builds a bundle from DIR/env alone, as any client of a separately
// running fakepush would.
func bundleFromEnv(t testing.TB, env map[string]string) *bundle {
	t.Helper()
	caPEM, err := os.ReadFile(env[EnvSSLCertFile])
	require.NoError(t, err)
	pool := x509.NewCertPool()
	require.True(t, pool.AppendCertsFromPEM(caPEM))
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = &tls.Config{RootCAs: pool}
	tr.MaxIdleConnsPerHost = 100
	t.Cleanup(tr.CloseIdleConnections)
	return &bundle{env: env, url: env[EnvAPNsHost], pool: pool, client: &http.Client{Transport: tr}}
}

// setup starts an in-process fakepush on a free port with its own directory.
func setup(t testing.TB, configure ...func(*Config)) *bundle {
	t.Helper()
	cfg := Config{Addr: "127.0.0.1:0", TLSDir: t.TempDir()}
	for _, c := range configure {
		c(&cfg)
	}
	srv, err := New(cfg)
	require.NoError(t, err)
	require.NoError(t, srv.Start(context.Background()))
	t.Cleanup(func() { require.NoError(t, srv.Close()) })
	client := srv.HTTPClient()
	t.Cleanup(client.CloseIdleConnections)
	return &bundle{srv: srv, env: srv.Env(), url: srv.URL(), pool: srv.CertPool(), client: client}
}

// apnsClient builds an apns2 token client from the written .p8 key and ids,
// pointed at fakepush: Host replaced, and the CA added to its HTTP/2 transport.
func (b *bundle) apnsClient(t testing.TB) *apns2.Client {
	t.Helper()
	key, err := token.AuthKeyFromFile(b.env[EnvAPNsKeyFile])
	require.NoError(t, err)
	c := apns2.NewTokenClient(&token.Token{AuthKey: key, KeyID: b.env[EnvAPNsKeyID], TeamID: b.env[EnvAPNsTeamID]})
	c.Host = b.env[EnvAPNsHost]
	tr := c.HTTPClient.Transport.(*http2.Transport)
	tr.TLSClientConfig = &tls.Config{RootCAs: b.pool}
	t.Cleanup(tr.CloseIdleConnections)
	return c
}

// apnsClientWithBearer is an apns2 client that sends a hand-made provider token.
// Token.IssuedAt is set to now so that apns2 does not replace it.
func (b *bundle) apnsClientWithBearer(t testing.TB, bearer string) *apns2.Client {
	t.Helper()
	c := b.apnsClient(t)
	c.Token.IssuedAt = time.Now().Unix()
	c.Token.Bearer = bearer
	return c
}

// fcmClient builds a Firebase messaging client from the written service-account
// file. The Google transport ignores credentials when given an HTTP client, so
// the client's token source is built here from the same file and wrapped around
// a transport that trusts fakepush; the token exchange itself finds that
// transport through the oauth2.HTTPClient context value.
func (b *bundle) fcmClient(t testing.TB, project string) *messaging.Client {
	t.Helper()
	data, err := os.ReadFile(b.env[EnvFCMCredentialsFile])
	require.NoError(t, err)
	return b.fcmClientFrom(t, data, project)
}

// fcmClientFrom is fcmClient with the service-account file data.
func (b *bundle) fcmClientFrom(t testing.TB, data []byte, project string) *messaging.Client {
	t.Helper()
	ctx := context.WithValue(context.Background(), oauth2.HTTPClient, b.client)
	creds, err := google.CredentialsFromJSONWithType(ctx, data, google.ServiceAccount, "https://www.googleapis.com/auth/firebase.messaging")
	require.NoError(t, err)
	if project == "" {
		project = creds.ProjectID
	}
	hc := &http.Client{Transport: &oauth2.Transport{Source: creds.TokenSource, Base: b.client.Transport}}
	app, err := firebase.NewApp(ctx, &firebase.Config{ProjectID: project},
		option.WithHTTPClient(hc), option.WithEndpoint(b.env[EnvFCMEndpoint]))
	require.NoError(t, err)
	mc, err := app.Messaging(ctx)
	require.NoError(t, err)
	return mc
}

// subscribe mints a Web Push subscription over HTTP, as a test of Herald would.
func (b *bundle) subscribe(t testing.TB, dead bool) *webpush.Subscription {
	t.Helper()
	body := `{}`
	if dead {
		body = `{"dead":true}`
	}
	resp, err := b.client.Post(b.url+"/_webpush/subscriptions", "application/json", strings.NewReader(body))
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusCreated, resp.StatusCode)
	var sub webpush.Subscription
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&sub))
	return &sub
}

// webpushOptions are webpush-go options from DIR/env. webpush-go prefixes the
// subscriber with "mailto:" itself, so the prefix of VAPID_SUBJECT comes off.
func (b *bundle) webpushOptions() *webpush.Options {
	return &webpush.Options{
		HTTPClient:      b.client,
		Subscriber:      strings.TrimPrefix(b.env[EnvVAPIDSubject], "mailto:"),
		VAPIDPublicKey:  b.env[EnvVAPIDPublicKey],
		VAPIDPrivateKey: b.env[EnvVAPIDPrivateKey],
		TTL:             60,
	}
}

// sendWebPush sends payload with webpush-go and returns the status and body.
func sendWebPush(t testing.TB, sub *webpush.Subscription, opts *webpush.Options, payload string) (int, string) {
	t.Helper()
	resp, err := webpush.SendNotificationWithContext(context.Background(), []byte(payload), sub, opts)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(body)
}

// doFunc lets a test tamper with a request webpush-go built before it is sent.
type doFunc func(*http.Request) (*http.Response, error)

func (f doFunc) Do(r *http.Request) (*http.Response, error) { return f(r) }

func (b *bundle) tamper(t testing.TB, edit func(r *http.Request, body []byte) []byte) doFunc {
	return func(r *http.Request) (*http.Response, error) {
		body, err := io.ReadAll(r.Body)
		require.NoError(t, err)
		body = edit(r, body)
		r.Body = io.NopCloser(bytes.NewReader(body))
		r.ContentLength = int64(len(body))
		return b.client.Do(r)
	}
}

// stats reads /_stats over HTTP.
func (b *bundle) stats(t testing.TB) Stats {
	t.Helper()
	var st Stats
	b.getJSON(t, "/_stats", &st)
	return st
}

func (b *bundle) getJSON(t testing.TB, path string, v any) {
	t.Helper()
	resp, err := b.client.Get(b.url + path)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.NoError(t, json.NewDecoder(resp.Body).Decode(v))
}

func (b *bundle) postJSON(t testing.TB, path, body string) (int, string) {
	t.Helper()
	resp, err := b.client.Post(b.url+path, "application/json", strings.NewReader(body))
	require.NoError(t, err)
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(data)
}

// signJWT makes a compact JWS with ES256 or RS256, for tokens the SDKs would
// never produce (wrong key, old iat, bad audience).
func signJWT(t testing.TB, key crypto.Signer, header, claims map[string]any) string {
	t.Helper()
	if header == nil {
		header = map[string]any{}
	}
	switch key.(type) {
	case *ecdsa.PrivateKey:
		header["alg"] = "ES256"
	case *rsa.PrivateKey:
		header["alg"] = "RS256"
	}
	h, err := json.Marshal(header)
	require.NoError(t, err)
	c, err := json.Marshal(claims)
	require.NoError(t, err)
	enc := base64.RawURLEncoding
	input := enc.EncodeToString(h) + "." + enc.EncodeToString(c)
	sum := sha256.Sum256([]byte(input))
	var sig []byte
	switch k := key.(type) {
	case *ecdsa.PrivateKey:
		r, s, err := ecdsa.Sign(rand.Reader, k, sum[:])
		require.NoError(t, err)
		sig = append(r.FillBytes(make([]byte, 32)), s.FillBytes(make([]byte, 32))...)
	case *rsa.PrivateKey:
		sig, err = rsa.SignPKCS1v15(rand.Reader, k, crypto.SHA256, sum[:])
		require.NoError(t, err)
	}
	return input + "." + enc.EncodeToString(sig)
}

func jsonDecode(r io.Reader, v any) error { return json.NewDecoder(r).Decode(v) }
