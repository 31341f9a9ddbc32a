// Package pushtest is what the tests and benchmarks of the provider packages
// (apns, fcm, webpush) share: a fakepush to send to and its control
// endpoints, the fixtures every provider sends, the scenarios every provider
// must pass alike, and the benchmark harness. It is imported only by tests.
package pushtest

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/heraldpush/herald/jobs/push"
	"github.com/heraldpush/herald/jobs/push/fake"
)

// Fakepush is a running fakepush as its clients see it: the variables it
// wrote, its base URL, and a client that trusts its CA for the control
// endpoints. It is the same whether fakepush runs in this process or in a
// child, so that tests and benchmarks drive it alike.
type Fakepush struct {
	// Env is what fakepush wrote to DIR/env.
	Env map[string]string
	// URL is the base URL of every endpoint, the providers' and the control
	// ones.
	URL    string
	pool   *x509.CertPool
	client *http.Client
}

// Start runs an in-process fakepush on a free port with a directory of its
// own, with configure applied to its config, closed when t ends.
func Start(t testing.TB, configure ...func(*fake.Config)) *Fakepush {
	t.Helper()
	cfg := fake.Config{Addr: "127.0.0.1:0", TLSDir: t.TempDir()}
	for _, c := range configure {
		c(&cfg)
	}
	srv, err := fake.New(cfg)
	require.NoError(t, err)
	require.NoError(t, srv.Start(context.Background()))
	t.Cleanup(func() { srv.Close() })
	return &Fakepush{Env: srv.Env(), URL: srv.URL(), pool: srv.CertPool(), client: srv.HTTPClient()}
}

// childTest is the test every provider package declares to serve as a
// benchmark's fakepush (see ServeChild).
const childTest = "TestFakepushChild"

// StartChild runs fakepush in a child process, as benchmarks do so that the
// client's CPU is measured apart from fakepush's, and stops it when b ends.
// The calling package must declare TestFakepushChild calling ServeChild.
// decryptOneIn is fake.Config.DecryptOneIn.
func StartChild(b testing.TB, decryptOneIn int) *Fakepush {
	b.Helper()
	child, err := fake.StartChild(childTest, b.TempDir(), decryptOneIn)
	require.NoError(b, err)
	b.Cleanup(func() {
		if err := child.Stop(); err != nil {
			b.Logf("stop the fakepush child: %v", err)
		}
	})
	return &Fakepush{Env: child.Env, URL: child.Env[fake.EnvAPNsHost], pool: child.CertPool(), client: child.HTTPClient()}
}

// ServeChild is the body of TestFakepushChild: it serves fakepush when
// StartChild started the test binary, and skips otherwise.
func ServeChild(t *testing.T) {
	child, err := fake.ServeChild(flag.Args())
	if !child {
		t.Skip("runs only as the benchmark's child process")
	}
	require.NoError(t, err)
}

// CertPool returns a pool holding fakepush's CA, for a provider's RootCAs.
func (f *Fakepush) CertPool() *x509.CertPool { return f.pool.Clone() }

// Post posts a JSON body to path, requires the status want, and returns the
// answer's body.
func (f *Fakepush) Post(t testing.TB, path, body string, want int) []byte {
	t.Helper()
	resp, err := f.client.Post(f.URL+path, "application/json", strings.NewReader(body))
	require.NoError(t, err)
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, want, resp.StatusCode, string(data))
	return data
}

// Control changes a channel's behaviour through POST /_control; body is a
// fake.Control in JSON.
func (f *Fakepush) Control(t testing.TB, body string) {
	t.Helper()
	f.Post(t, "/_control", body, http.StatusOK)
}

// getJSON decodes the answer to GET path into v.
func (f *Fakepush) getJSON(t testing.TB, path string, v any) {
	t.Helper()
	resp, err := f.client.Get(f.URL + path)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.NoError(t, json.NewDecoder(resp.Body).Decode(v))
}

// Stats reads GET /_stats.
func (f *Fakepush) Stats(t testing.TB) fake.Stats {
	t.Helper()
	var st fake.Stats
	f.getJSON(t, "/_stats", &st)
	return st
}

// Receipts reads GET /_receipts: the accepted pushes that carried messageID.
func (f *Fakepush) Receipts(t testing.TB, messageID string) []fake.Receipt {
	t.Helper()
	var rs []fake.Receipt
	f.getJSON(t, "/_receipts?message_id="+url.QueryEscape(messageID), &rs)
	return rs
}

// Subscribe mints n Web Push subscriptions over HTTP, as a browser's would be
// made, and returns them as targets. dead ones answer 410 to every push.
func (f *Fakepush) Subscribe(t testing.TB, n int, dead bool) []push.Target {
	t.Helper()
	ts := make([]push.Target, n)
	for i := range ts {
		var sub fake.Subscription
		require.NoError(t, json.Unmarshal(f.Post(t, "/_webpush/subscriptions", fmt.Sprintf(`{"dead":%t}`, dead), http.StatusCreated), &sub))
		ts[i] = push.Target{DeviceID: int64(i + 1), Token: sub.Endpoint, P256dh: sub.Keys.P256dh, Auth: sub.Keys.Auth}
	}
	return ts
}

// DetailedReceipts reads GET /_receipts with detail=1: the accepted pushes
// that carried messageID, with the headers and decoded body of each.
func (f *Fakepush) DetailedReceipts(t testing.TB, messageID string) []fake.Receipt {
	t.Helper()
	var rs []fake.Receipt
	f.getJSON(t, "/_receipts?detail=1&message_id="+url.QueryEscape(messageID), &rs)
	return rs
}
