package push

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestWebPushTopic(t *testing.T) {
	t.Parallel()
	require.Equal(t, "msg_9223372036854775807", WebPushTopic("msg_9223372036854775807"))
	for _, id := range []string{strings.Repeat("x", 33), strings.Repeat("x", 40)} {
		long := WebPushTopic(id)
		require.Len(t, long, 32)
		require.True(t, isBase64URL(long))
	}
	require.Len(t, WebPushTopic("msg.1"), 32, "a character outside base64url is hashed away")
	require.NotEqual(t, WebPushTopic("msg.1"), WebPushTopic("msg.2"))
}

func TestStatusReason(t *testing.T) {
	t.Parallel()
	for status, want := range map[int]Reason{
		429: ReasonRateLimited,
		500: ReasonProviderUnavailable,
		502: ReasonProviderUnavailable,
		503: ReasonProviderUnavailable,
		400: ReasonInternal,
		401: ReasonInternal,
		403: ReasonInternal,
		404: ReasonInternal,
		301: ReasonInternal,
	} {
		require.Equal(t, want, StatusReason(status), "status %d", status)
	}
}
