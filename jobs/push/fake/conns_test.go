package fake

import (
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/sideshow/apns2"
	"github.com/stretchr/testify/require"
)

// TestConnectionsCountedAndClosed: /_stats counts the connections clients
// open, on each listener, and not the requests they carry; closing them
// (POST /_connections/close, as a provider closes idle ones) leaves the
// caller's own, and the next push on a closed one opens a new connection.
func TestConnectionsCountedAndClosed(t *testing.T) {
	t.Parallel()
	b := setup(t)
	production := b.apnsClient(t)
	sandbox := b.apnsClient(t)
	sandbox.Host = b.env[EnvAPNsSandboxHost]
	push := func(c *apns2.Client) {
		t.Helper()
		_, err := c.Push(&apns2.Notification{DeviceToken: apnsToken, Topic: b.env[EnvAPNsTopic], Payload: []byte(`{"aps":{}}`)})
		require.NoError(t, err)
	}

	base := b.stats(t).Connections // the control client's own connection
	require.Equal(t, int64(1), base.Open)
	push(production)
	push(production)
	push(sandbox)
	st := b.stats(t).Connections
	require.Equal(t, ConnStats{Opened: base.Opened + 2, Sandbox: base.Sandbox + 1, Open: 3}, st,
		"one connection a client and host, however many pushes it carries")

	status, body := b.postJSON(t, "/_connections/close", `{}`)
	require.Equal(t, http.StatusOK, status, body)
	var closed ClosedConnections
	require.NoError(t, json.Unmarshal([]byte(body), &closed))
	require.Equal(t, 2, closed.Closed, "every connection but the caller's")
	require.Eventually(t, func() bool { return b.stats(t).Connections.Open == 1 }, 5*time.Second, 5*time.Millisecond)

	push(production)
	st = b.stats(t).Connections
	require.Equal(t, base.Opened+3, st.Opened, "a push after the close opens a new connection")
	require.Equal(t, base.Sandbox+1, st.Sandbox)

	require.Equal(t, 2, b.srv.CloseConnections(), "in process: every connection, the control client's too")
	// The control client forgets its closed connection, so that its next
	// read does not race the close.
	b.client.CloseIdleConnections()
	b.srv.Reset()
	require.Eventually(t, func() bool { return b.stats(t).Connections.Open == 1 }, 5*time.Second, 5*time.Millisecond)
	require.Equal(t, int64(1), b.stats(t).Connections.Opened, "Reset counts from zero: the stats read's new connection")
}
