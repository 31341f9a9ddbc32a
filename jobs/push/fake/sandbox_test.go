package fake

import (
	"net/http"
	"strings"
	"testing"

	"github.com/sideshow/apns2"
	"github.com/stretchr/testify/require"
)

// TestAPNsSandbox checks fakepush's two APNs hosts: each knows only its own
// environment's tokens and refuses the other's as Apple does, 400
// BadDeviceToken, and its receipts say which host took a push.
func TestAPNsSandbox(t *testing.T) {
	t.Parallel()
	b := setup(t)
	sandboxURL := b.env[EnvAPNsSandboxHost]
	require.NotEmpty(t, sandboxURL, "the env file names the sandbox host")
	require.NotEqual(t, b.env[EnvAPNsHost], sandboxURL)

	debug := strings.Repeat("ab", 32)
	status, body := b.postJSON(t, "/_apns/sandbox-tokens", `{"tokens":["`+strings.ToUpper(debug)+`"]}`)
	require.Equal(t, http.StatusNoContent, status, body)

	production := b.apnsClient(t)
	sandbox := b.apnsClient(t)
	sandbox.Host = sandboxURL
	send := func(c *apns2.Client, token, id string) *apns2.Response {
		res, err := c.Push(&apns2.Notification{
			DeviceToken: token, Topic: b.env[EnvAPNsTopic], CollapseID: id,
			Payload: []byte(`{"aps":{"alert":"hi"},"herald_message_id":"` + id + `"}`),
		})
		require.NoError(t, err)
		return res
	}

	for _, tc := range []struct {
		client *apns2.Client
		token  string
		ok     bool
		why    string
	}{
		{sandbox, debug, true, "a sandbox token on the sandbox host"},
		{production, debug, false, "a sandbox token on the production host"},
		{production, apnsToken, true, "a production token on the production host"},
		{sandbox, apnsToken, false, "a production token on the sandbox host"},
	} {
		res := send(tc.client, tc.token, "msg_env")
		if tc.ok {
			require.Equal(t, http.StatusOK, res.StatusCode, tc.why)
		} else {
			require.Equal(t, http.StatusBadRequest, res.StatusCode, tc.why)
			require.Equal(t, apns2.ReasonBadDeviceToken, res.Reason, tc.why)
		}
	}
	receipts := b.srv.Receipts("msg_env")
	require.Len(t, receipts, 2)
	require.Equal(t, "sandbox", receipts[0].Environment)
	require.Equal(t, debug, receipts[0].Token)
	require.Equal(t, "production", receipts[1].Environment)
	require.Equal(t, apnsToken, receipts[1].Token)

	// The sandbox host serves APNs alone; the control endpoints are on the
	// main address.
	resp, err := b.client.Get(sandboxURL + "/_stats")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusNotFound, resp.StatusCode)

	status, _ = b.postJSON(t, "/_apns/sandbox-tokens", `{"tokens":["not-hex"]}`)
	require.Equal(t, http.StatusBadRequest, status)

	// A reset forgets the declarations with the rest.
	status, _ = b.postJSON(t, "/_reset", ``)
	require.Equal(t, http.StatusNoContent, status)
	require.Equal(t, http.StatusBadRequest, send(sandbox, debug, "msg_after").StatusCode)
	require.Equal(t, http.StatusOK, send(production, debug, "msg_after").StatusCode)
}
