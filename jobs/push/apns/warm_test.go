package apns

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/heraldpush/herald/jobs/push"
	"github.com/heraldpush/herald/jobs/push/pushtest"
)

// TestWarmForOpensTheTargetsEnvironments: an instant's warm-up opens the
// sandbox's connection for a debug build's device, which Warm at start
// leaves closed, and the production pool only for production devices; the
// push to the sandbox device then opens no connection of its own.
func TestWarmForOpensTheTargetsEnvironments(t *testing.T) {
	t.Parallel()
	b := setup(t)
	debug := strings.Repeat("d", 64)
	b.Post(t, "/_apns/sandbox-tokens", `{"tokens":["`+debug+`"]}`, 204)
	ts := []push.Target{{DeviceID: 1, Token: debug, Sandbox: true}}
	before := b.Fakepush.Stats(t).Connections

	require.NoError(t, b.P.WarmFor(context.Background(), ts))
	warmed := b.Fakepush.Stats(t).Connections
	require.Equal(t, before.Sandbox+1, warmed.Sandbox, "the sandbox's connection")
	require.Equal(t, before.Opened+1, warmed.Opened, "and no production one: no production device is due")

	b.SendAccepted(t, pushtest.Message(t, "msg_debug", false), ts)
	require.Equal(t, warmed, b.Fakepush.Stats(t).Connections, "the push went out on the warmed connection")
}
