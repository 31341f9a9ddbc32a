package fcm

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"

	"golang.org/x/oauth2"
)

// giveUpRetryAfter is a Retry-After (in seconds) beyond the Firebase SDK's
// two-minute cap on retry delays. The SDK does not retry an answer that asks
// for more; it returns the error at once.
const giveUpRetryAfter = "86400"

// failFast stands between the Firebase SDK and the network so that one send
// is one request. The SDK retries 503 answers and every transport error on
// its own, four times over about seven seconds, and offers no setting to stop
// it; Herald's contract is no retries inside the dispatch second, with the
// circuit breaker deciding when to try again. So a 503 gets a Retry-After the
// SDK will not wait for, and a transport error becomes an answer in FCM's own
// error shape (the SDK retries errors, not answers): 503 UNAVAILABLE for a
// failed connection, 401 UNAUTHENTICATED when the token endpoint refused the
// credentials. An error of the request's own context is passed through, since
// the SDK then stops at once by itself.
type failFast struct {
	base http.RoundTripper
}

func (f failFast) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := f.base.RoundTrip(r)
	if err == nil {
		if resp.StatusCode == http.StatusServiceUnavailable {
			// FCM's own Retry-After is kept for classify, which tells the
			// breaker to wait that long.
			if ra := resp.Header.Get("Retry-After"); ra != "" {
				resp.Header.Set(retryAfterHeader, ra)
			}
			resp.Header.Set("Retry-After", giveUpRetryAfter)
		}
		return resp, nil
	}
	if r.Context().Err() != nil {
		return nil, err
	}
	var tokErr *tokenError
	if errors.As(err, &tokErr) {
		// No access token, so nothing went to FCM.
		if tokErr.refused() {
			return answer(r, http.StatusUnauthorized, "UNAUTHENTICATED", "fetch access token: "+tokErr.Error()), nil
		}
		return answer(r, http.StatusServiceUnavailable, "UNAVAILABLE", "fetch access token: "+tokErr.Error()), nil
	}
	resp = answer(r, http.StatusServiceUnavailable, "UNAVAILABLE", "no answer from FCM: "+err.Error())
	resp.Header.Set(noAnswerHeader, "1")
	return resp, nil
}

// noAnswerHeader marks an answer failFast made for a request that may have
// reached FCM but got no answer, so that classify can say so.
const noAnswerHeader = "Herald-No-Answer"

// retryAfterHeader keeps the Retry-After of a 503 that failFast replaced.
const retryAfterHeader = "Herald-Retry-After"

// answer makes a response in Google's error shape, as if FCM had sent it.
func answer(r *http.Request, status int, code, message string) *http.Response {
	body, _ := json.Marshal(map[string]any{ // plain strings: cannot fail
		"error": map[string]any{"code": status, "status": code, "message": message},
	})
	return &http.Response{
		Status:        strconv.Itoa(status) + " " + http.StatusText(status),
		StatusCode:    status,
		Proto:         "HTTP/2.0",
		ProtoMajor:    2,
		Header:        http.Header{"Content-Type": {"application/json"}, "Retry-After": {giveUpRetryAfter}},
		Body:          io.NopCloser(bytes.NewReader(body)),
		ContentLength: int64(len(body)),
		Request:       r,
	}
}

// tokenSource marks the errors of fetching an access token, which
// oauth2.Transport returns as they are, so that failFast can tell refused
// credentials (Herald's misconfiguration) from a token endpoint that is down.
type tokenSource struct {
	src oauth2.TokenSource
}

func (s tokenSource) Token() (*oauth2.Token, error) {
	t, err := s.src.Token()
	if err != nil {
		return nil, &tokenError{err: err}
	}
	return t, nil
}

// tokenError is a failure to fetch an access token.
type tokenError struct {
	err error
}

func (e *tokenError) Error() string { return e.err.Error() }
func (e *tokenError) Unwrap() error { return e.err }

// refused reports whether the token endpoint answered and said no: a 4xx
// other than 429. Anything else (no answer, 429, 5xx) passes by itself.
func (e *tokenError) refused() bool {
	var re *oauth2.RetrieveError
	if !errors.As(e.err, &re) || re.Response == nil {
		return false
	}
	s := re.Response.StatusCode
	return s >= 400 && s < 500 && s != http.StatusTooManyRequests
}
