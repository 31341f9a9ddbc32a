package webhook

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/heraldpush/herald/jobs/push"
)

// TestSignMatchesTheStandard: the example of the Standard Webhooks
// specification, signed as any of its libraries signs it.
func TestSignMatchesTheStandard(t *testing.T) {
	t.Parallel()
	sig, err := Sign("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, []byte(`{"test": 2432232314}`))
	require.NoError(t, err)
	require.Equal(t, "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=", sig)
}

func TestSecrets(t *testing.T) {
	t.Parallel()
	a, b := NewSecret(), NewSecret()
	require.NotEqual(t, a, b)
	for _, s := range []string{a, b} {
		_, err := Sign(s, "whb_1", 1, []byte("{}"))
		require.NoError(t, err)
	}
	for _, bad := range []string{"", "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "whsec_", "whsec_***"} {
		_, err := Sign(bad, "whb_1", 1, nil)
		require.Error(t, err, bad)
	}
}

func TestCheckURL(t *testing.T) {
	t.Parallel()
	p, err := NewPolicy([]string{"10.1.1.1:8080", "hooks.lan"})
	require.NoError(t, err)
	for url, ok := range map[string]bool{
		"https://hooks.example.com/x":          true,
		"https://hooks.example.com:8443/x?a=b": true,
		"https://93.184.215.14/x":              true,
		"http://hooks.example.com/x":           false,
		"https://10.1.1.2/x":                   false,
		"https://[fd00::1]/x":                  false,
		"https://[::ffff:127.0.0.1]/x":         false,
		"https://0.0.0.0/x":                    false,
		"https://LOCALHOST./x":                 false,
		"https://hooks.example.com/x#frag":     false,
		"ftp://hooks.example.com/x":            false,
		"http://10.1.1.1:8080/x":               true,
		"http://10.1.1.1:8081/x":               false,
		"http://hooks.lan:9000/x":              true,
	} {
		require.Equal(t, ok, p.CheckURL(url) == nil, "%s: %v", url, p.CheckURL(url))
	}
	_, err = NewPolicy([]string{"*.lan"})
	require.Error(t, err)
	_, err = NewPolicy([]string{"hooks.lan:0"})
	require.Error(t, err)
}

// TestClientKeepsToThePolicy: the client connects to an internal address
// only when the operator trusts its host, and follows no redirect.
func TestClientKeepsToThePolicy(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/moved" {
			http.Redirect(w, r, "/hook", http.StatusFound)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(srv.Close)
	// The URL is checked when the webhook is made; this is the connection's
	// own check, for a name that resolves inside the network later.
	public, err := NewPolicy(nil)
	require.NoError(t, err)
	_, err = Post(context.Background(), public.Client(time.Second), srv.URL+"/hook", NewSecret(), "whb_1", time.Now(), []byte("{}"))
	require.ErrorIs(t, err, push.ErrEndpointForbidden)

	trusted, err := NewPolicy([]string{"127.0.0.1"})
	require.NoError(t, err)
	status, err := Post(context.Background(), trusted.Client(time.Second), srv.URL+"/hook", NewSecret(), "whb_1", time.Now(), []byte("{}"))
	require.NoError(t, err)
	require.Equal(t, http.StatusNoContent, status)
	status, err = Post(context.Background(), trusted.Client(time.Second), srv.URL+"/moved", NewSecret(), "whb_1", time.Now(), []byte("{}"))
	require.NoError(t, err)
	require.Equal(t, http.StatusFound, status, "a redirect is an answer, not followed")
}
