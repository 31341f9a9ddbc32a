package webpush

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/heraldpush/herald/jobs/push/pushtest"
)

// TestWarmForOpensOnlyAdmittedPushServices: a warm-up opens one connection
// a push service, however many of the targets' endpoints it holds, and none
// to a host the egress policy refuses, which the warm-up skips rather than
// fails on (its sends fail endpoint_forbidden without a request).
func TestWarmForOpensOnlyAdmittedPushServices(t *testing.T) {
	t.Parallel()
	b := setup(t)
	inside := pushtest.StartInside(t)
	ts := b.Targets(t, 3)
	refused := ts[0]
	refused.Token = "https://127.0.0.1:" + inside.Port + "/x"
	before := b.Fakepush.Stats(t)

	require.NoError(t, b.P.WarmFor(context.Background(), append(ts, refused)))
	after := b.Fakepush.Stats(t)
	require.Equal(t, before.Connections.Opened+1, after.Connections.Opened, "one connection to the push service of the three")
	require.Equal(t, before.WebPush.Warmups+1, after.WebPush.Warmups)
	require.Zero(t, inside.Connections(), "the refused host was not dialled")
}
