package push

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestErrorClass: a send's error is described by its class, never by its
// text, which quotes the request's URL and so the device's token.
func TestErrorClass(t *testing.T) {
	t.Parallel()
	const secret = "https://push.example/webpush/erin-token"
	wrap := func(err error) error { return &url.Error{Op: "Post", URL: secret, Err: err} }
	dial := func(errno error) error {
		return &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", errno)}
	}
	for _, tc := range []struct {
		err  error
		want string
	}{
		{wrap(dial(syscall.ECONNREFUSED)), "connection refused"},
		{wrap(dial(syscall.ECONNRESET)), "connection closed"},
		{wrap(dial(syscall.EHOSTUNREACH)), "network unreachable"},
		{wrap(context.DeadlineExceeded), "timeout"},
		{wrap(context.Canceled), "cancelled"},
		{wrap(&net.DNSError{Err: "no such host", Name: "push.example", IsNotFound: true}), "name not resolved"},
		{wrap(x509.UnknownAuthorityError{}), "TLS certificate not trusted"},
		{wrap(forbidden("the endpoint's host resolves to 127.0.0.1, which is a loopback address")),
			"refused: the endpoint's host resolves to 127.0.0.1, which is a loopback address"},
		{wrap(errors.New("http2: something " + secret)), "request failed"},
		{fmt.Errorf("sdk: %s", secret), "error"},
	} {
		got := ErrorClass(tc.err)
		require.Equal(t, tc.want, got, "%v", tc.err)
		require.NotContains(t, got, "erin-token")
	}
}

// TestScrubDetail: any URL in a detail keeps its scheme and host only.
func TestScrubDetail(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		`Post "https://fcm.googleapis.com/fcm/send/tok": EOF`: `Post "https://fcm.googleapis.com": EOF`,
		"push service answered 503 Service Unavailable":       "push service answered 503 Service Unavailable",
		"a https://user:pw@h.example:8443/p?q=tok#f b":        "a https://h.example:8443 b",
		"two: https://a.example/x and wss://b.example/y":      "two: https://a.example and wss://b.example",
		"https:///tok": "(a URL)",
		"":             "",
		`Post "https://api.push.apple.com/3/device/abcd": i/o timeout`: `Post "https://api.push.apple.com": i/o timeout`,
	} {
		require.Equal(t, want, ScrubDetail(in), in)
	}
}
