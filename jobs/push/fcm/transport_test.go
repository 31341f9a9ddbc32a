package fcm

import (
	"net"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/oauth2"
)

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// TestFailFastMarksWhatMayHaveBeenSent checks that failFast turns failures
// into answers, and marks as unanswered only a request that may have gone
// out: not one that never got an access token.
func TestFailFastMarksWhatMayHaveBeenSent(t *testing.T) {
	t.Parallel()
	// A port nothing listens on: the network's own failure.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())

	for _, tc := range []struct {
		name       string
		base       http.RoundTripper
		status     int
		unanswered bool
	}{
		{"no connection", http.DefaultTransport, http.StatusServiceUnavailable, true},
		{"token refused", roundTripFunc(func(*http.Request) (*http.Response, error) {
			return nil, &tokenError{err: &oauth2.RetrieveError{Response: &http.Response{StatusCode: http.StatusBadRequest}}}
		}), http.StatusUnauthorized, false},
		{"token endpoint down", roundTripFunc(func(*http.Request) (*http.Response, error) {
			return nil, &tokenError{err: &oauth2.RetrieveError{Response: &http.Response{StatusCode: http.StatusBadGateway}}}
		}), http.StatusServiceUnavailable, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := httptest.NewRequest(http.MethodPost, "http://"+addr+"/v1/projects/p/messages:send", nil)
			req.RequestURI = ""
			resp, err := failFast{base: tc.base}.RoundTrip(req)
			require.NoError(t, err)
			require.Equal(t, tc.status, resp.StatusCode)
			require.Equal(t, tc.unanswered, resp.Header.Get(noAnswerHeader) != "")
			require.Equal(t, giveUpRetryAfter, resp.Header.Get("Retry-After"), "the SDK must not retry it")
		})
	}
}
