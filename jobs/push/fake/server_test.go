package fake

import (
	"bytes"
	"context"
	"crypto/ecdh"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
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
	"google.golang.org/api/option"
)

func TestEnvFileAndCredentials(t *testing.T) {
	t.Parallel()
	b := setup(t)
	dir := b.srv.Dir()

	data, err := os.ReadFile(filepath.Join(dir, "env"))
	require.NoError(t, err)
	env := ParseEnvFile(data)
	require.Equal(t, b.env, env, "DIR/env holds exactly what Env returns")
	for _, k := range []string{EnvAPNsKeyFile, EnvAPNsKeyID, EnvAPNsTeamID, EnvAPNsTopic, EnvAPNsHost,
		EnvFCMCredentialsFile, EnvFCMEndpoint, EnvVAPIDPublicKey, EnvVAPIDPrivateKey, EnvVAPIDSubject, EnvSSLCertFile} {
		require.NotEmpty(t, env[k], k)
	}
	require.Contains(t, string(data), "\nexport APNS_HOST APNS_KEY_FILE", "sourcing the file exports the variables")
	require.Equal(t, b.srv.URL(), env[EnvAPNsHost])
	require.Equal(t, b.srv.URL()+"/v1", env[EnvFCMEndpoint])
	require.Regexp(t, `^[A-Z2-7]{10}$`, env[EnvAPNsKeyID])
	require.Regexp(t, `^[A-Z2-7]{10}$`, env[EnvAPNsTeamID])

	// The CA file is the one serving, and it certifies the server's name.
	caPEM, err := os.ReadFile(env[EnvSSLCertFile])
	require.NoError(t, err)
	require.Equal(t, b.srv.CACertPEM(), caPEM)
	block, _ := pem.Decode(caPEM)
	ca, err := x509.ParseCertificate(block.Bytes)
	require.NoError(t, err)
	require.True(t, ca.IsCA)

	// The .p8 loads the way apns2 loads Apple's.
	_, err = token.AuthKeyFromFile(env[EnvAPNsKeyFile])
	require.NoError(t, err)

	// The service account is a Google one pointing its token_uri at fakepush.
	saData, err := os.ReadFile(env[EnvFCMCredentialsFile])
	require.NoError(t, err)
	var sa serviceAccount
	require.NoError(t, json.Unmarshal(saData, &sa))
	require.Equal(t, "service_account", sa.Type)
	require.Equal(t, "herald-fake", sa.ProjectID)
	require.Equal(t, b.srv.URL()+"/token", sa.TokenURI)
	require.True(t, strings.HasPrefix(sa.PrivateKey, "-----BEGIN PRIVATE KEY-----"))
	require.NotEmpty(t, sa.ClientEmail)

	// The VAPID pair is a P-256 key pair in webpush-go's encoding.
	pub, err := base64.RawURLEncoding.DecodeString(env[EnvVAPIDPublicKey])
	require.NoError(t, err)
	priv, err := base64.RawURLEncoding.DecodeString(env[EnvVAPIDPrivateKey])
	require.NoError(t, err)
	key, err := ecdh.P256().NewPrivateKey(priv)
	require.NoError(t, err)
	require.Equal(t, pub, key.PublicKey().Bytes())

	for _, name := range []string{fileCAKey, fileAPNsKey, fileFCMAccount, fileVAPIDKey, fileSecret, fileEnv} {
		fi, err := os.Stat(filepath.Join(dir, name))
		require.NoError(t, err)
		require.Equal(t, os.FileMode(0o600), fi.Mode().Perm(), "%s holds secrets", name)
	}
}

func TestRestartKeepsCredentialsValid(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	first, err := New(Config{Addr: "127.0.0.1:0", TLSDir: dir})
	require.NoError(t, err)
	require.NoError(t, first.Start(context.Background()))
	b1 := &bundle{srv: first, env: first.Env(), url: first.URL(), pool: first.CertPool(), client: first.HTTPClient()}
	sub := b1.subscribe(t, false)
	access := b1.accessToken(t)
	require.NoError(t, first.Close())

	second, err := New(Config{Addr: "127.0.0.1:0", TLSDir: dir})
	require.NoError(t, err)
	require.NoError(t, second.Start(context.Background()))
	t.Cleanup(func() { second.Close() })
	b2 := &bundle{srv: second, env: second.Env(), url: second.URL(), pool: second.CertPool(), client: second.HTTPClient()}

	require.Equal(t, first.CACertPEM(), second.CACertPEM())
	for _, k := range []string{EnvAPNsKeyID, EnvAPNsTeamID, EnvVAPIDPublicKey, EnvVAPIDPrivateKey} {
		require.Equal(t, b1.env[k], b2.env[k], k)
	}
	require.True(t, second.checkAccessToken("Bearer "+access), "an FCM access token outlives a restart")

	// A subscription minted before the restart still decrypts, at its new port.
	sub.Endpoint = strings.Replace(sub.Endpoint, first.URL(), second.URL(), 1)
	status, body := sendWebPush(t, sub, b2.webpushOptions(), `{"herald_message_id":"m"}`)
	require.Equal(t, http.StatusCreated, status, body)

	// A half-deleted CA is refused rather than silently replaced.
	require.NoError(t, second.Close())
	require.NoError(t, os.Remove(filepath.Join(dir, fileCAKey)))
	_, err = New(Config{TLSDir: dir})
	require.ErrorContains(t, err, "must both exist")
}

func TestServesHTTP1AndAdvertisesAppleStreamLimit(t *testing.T) {
	t.Parallel()
	b := setup(t)
	addr := strings.TrimPrefix(b.srv.URL(), "https://")

	// HTTP/1.1 clients are served too.
	h1 := &http.Client{Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: b.srv.CertPool()},
		TLSNextProto:    map[string]func(string, *tls.Conn) http.RoundTripper{},
	}}
	resp, err := h1.Get(b.srv.URL() + "/_stats")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, 1, resp.ProtoMajor)
	require.Equal(t, http.StatusOK, resp.StatusCode)

	// Read the server's SETTINGS frame as an HTTP/2 client would.
	conn, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: b.srv.CertPool(), NextProtos: []string{"h2"}})
	require.NoError(t, err)
	defer conn.Close()
	require.Equal(t, "h2", conn.ConnectionState().NegotiatedProtocol)
	_, err = conn.Write([]byte(http2.ClientPreface))
	require.NoError(t, err)
	fr := http2.NewFramer(conn, conn)
	require.NoError(t, fr.WriteSettings())
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(5*time.Second)))
	f, err := fr.ReadFrame()
	require.NoError(t, err)
	settings, ok := f.(*http2.SettingsFrame)
	require.True(t, ok, "first frame is SETTINGS, got %T", f)
	v, ok := settings.Value(http2.SettingMaxConcurrentStreams)
	require.True(t, ok)
	require.Equal(t, uint32(1000), v)
}

func TestConfigValidation(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		cfg   Config
		field string
	}{
		{name: "bad addr", cfg: Config{Addr: "localhost"}, field: "Addr"},
		{name: "negative latency", cfg: Config{Latency: -time.Second}, field: "Latency"},
		{name: "negative sampling", cfg: Config{DecryptOneIn: -1}, field: "DecryptOneIn"},
		{name: "negative streams", cfg: Config{MaxConcurrentStreams: -1}, field: "MaxConcurrentStreams"},
		{name: "bad project", cfg: Config{FCMProjectID: "Herald Fake"}, field: "FCMProjectID"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			err := tt.cfg.withDefaults().validate()
			require.ErrorContains(t, err, tt.field)
		})
	}
	cfg := Config{}.withDefaults()
	require.NoError(t, cfg.validate())
	require.Equal(t, DefaultAddr, cfg.Addr)
	require.Equal(t, 1, cfg.DecryptOneIn)
	require.Equal(t, 1000, cfg.MaxConcurrentStreams)
}

// TestEnvOnlyClients proves that DIR/env is all a process needs: a child process
// gets nothing but those variables, and builds each SDK client the way Herald
// would in production, with default HTTP transports. Only SSL_CERT_FILE makes
// them trust fakepush.
func TestEnvOnlyClients(t *testing.T) {
	t.Parallel()
	b := setup(t)
	env := []string{"PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir(), "FAKEPUSH_ENV_CHILD=1"}
	for k, v := range ParseEnvFile(mustRead(t, b.srv.EnvFile())) {
		env = append(env, k+"="+v)
	}
	sub, err := b.srv.MintSubscription(false)
	require.NoError(t, err)
	subJSON, err := json.Marshal(sub)
	require.NoError(t, err)

	cmd := exec.Command(os.Args[0], "-test.run=^TestEnvOnlyClientsChild$", "-test.v", "--", string(subJSON))
	cmd.Env = env
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "child output:\n%s", out)
	require.Contains(t, string(out), "--- PASS: TestEnvOnlyClientsChild")

	st := b.srv.Stats()
	require.Equal(t, int64(1), st.APNs.Accepted)
	require.Equal(t, int64(1), st.FCM.Accepted)
	require.Equal(t, int64(1), st.WebPush.Accepted)
	require.Len(t, b.srv.Receipts("from-env"), 3)
}

// TestEnvOnlyClientsChild is the child half of TestEnvOnlyClients. Reading the
// environment here is the point: this process stands in for Herald's cmd/.
func TestEnvOnlyClientsChild(t *testing.T) {
	if os.Getenv("FAKEPUSH_ENV_CHILD") != "1" {
		t.Skip("runs only as the child of TestEnvOnlyClients")
	}
	getenv := os.Getenv
	ctx := context.Background()

	// APNs: the .p8, ids and host. apns2's own transport uses the system roots.
	key, err := token.AuthKeyFromFile(getenv("APNS_KEY_FILE"))
	require.NoError(t, err)
	ac := apns2.NewTokenClient(&token.Token{AuthKey: key, KeyID: getenv("APNS_KEY_ID"), TeamID: getenv("APNS_TEAM_ID")})
	ac.Host = getenv("APNS_HOST")
	res, err := ac.Push(&apns2.Notification{DeviceToken: apnsToken, Topic: getenv("APNS_TOPIC"),
		Payload: []byte(`{"aps":{"alert":"hi"},"herald_message_id":"from-env"}`)})
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, res.StatusCode, res.Reason)

	// FCM: the credentials file (whose token_uri is honoured) and the endpoint.
	app, err := firebase.NewApp(ctx, &firebase.Config{},
		option.WithAuthCredentialsFile(option.ServiceAccount, getenv("FCM_CREDENTIALS_FILE")), option.WithEndpoint(getenv("FCM_ENDPOINT")))
	require.NoError(t, err)
	mc, err := app.Messaging(ctx)
	require.NoError(t, err)
	_, err = mc.Send(ctx, &messaging.Message{Token: fcmToken, Data: map[string]string{"herald_message_id": "from-env"}})
	require.NoError(t, err)

	// Web Push: the VAPID keys and subject, with webpush-go's default client.
	var sub webpush.Subscription
	require.NoError(t, json.Unmarshal([]byte(flag.Arg(0)), &sub))
	resp, err := webpush.SendNotification([]byte(`{"herald_message_id":"from-env"}`), &sub, &webpush.Options{
		Subscriber:      strings.TrimPrefix(getenv("VAPID_SUBJECT"), "mailto:"),
		VAPIDPublicKey:  getenv("VAPID_PUBLIC_KEY"),
		VAPIDPrivateKey: getenv("VAPID_PRIVATE_KEY"),
		TTL:             60,
	})
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusCreated, resp.StatusCode)
	fmt.Println("all three SDKs reached fakepush from DIR/env alone")
}

func TestParseEnvFileRoundTrip(t *testing.T) {
	t.Parallel()
	env := map[string]string{"A": "plain/path-1.pem", "B": "has space", "C": "it's", "D": "https://127.0.0.1:8443/v1"}
	data := encodeEnvFile(env)
	require.Equal(t, env, ParseEnvFile(data))
	require.Contains(t, string(data), "\nA=plain/path-1.pem\n")
	require.Contains(t, string(data), "\nB='has space'\n")
	require.Equal(t, map[string]string{"K": "v"}, ParseEnvFile([]byte("# comment\n\nexport K\nK=v\nnot a line\n")))
}

func mustRead(t testing.TB, path string) []byte {
	t.Helper()
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	return bytes.TrimSpace(data)
}
