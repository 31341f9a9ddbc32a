package api

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"
)

// deliveriesOf reads a message's deliveries through the API, by device id.
func deliveriesOf(t *testing.T, b *bundle, messageID string) map[string]map[string]any {
	t.Helper()
	status, resp := b.do(t, http.MethodGet, "/v1/messages/"+messageID+"/deliveries", nil)
	require.Equal(t, http.StatusOK, status, resp)
	out := map[string]map[string]any{}
	for _, it := range resp["items"].([]any) {
		d := it.(map[string]any)
		out[d["device_id"].(string)] = d
	}
	return out
}

// registerFCM registers an FCM token, with an installation id unless it
// is "", and returns the answer's status and device id.
func registerFCM(t *testing.T, b *bundle, path, user, token, installation string) (int, string) {
	t.Helper()
	dev := map[string]any{"user_id": user, "channel": "fcm", "token": token}
	if installation != "" {
		dev["installation_id"] = installation
	}
	if path == "/v1/devices/batch" {
		status, resp := b.do(t, http.MethodPost, path, map[string]any{"devices": []any{dev}})
		require.Equal(t, http.StatusOK, status, resp)
		return status, ""
	}
	status, resp := b.do(t, http.MethodPost, path, dev)
	require.Contains(t, []int{http.StatusOK, http.StatusCreated}, status, resp)
	return status, resp["device_id"].(string)
}

// TestRegisteringForAnotherUserCancelsTheFormerOwners: user A logs out of
// an app and B logs in on the same phone, whose token is then registered
// for B. A's message scheduled before that must not reach the phone: the
// registration cancels A's pending delivery to it in its own transaction,
// as device_moved, and leaves A's other device's alone. Alone and in a
// batch.
func TestRegisteringForAnotherUserCancelsTheFormerOwners(t *testing.T) {
	t.Parallel()
	for _, path := range []string{"/v1/devices", "/v1/devices/batch"} {
		t.Run(path, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			_, shared := registerFCM(t, b, "/v1/devices", "u_a", "tok-shared", "")
			_, own := registerFCM(t, b, "/v1/devices", "u_a", "tok-own", "")
			status, resp := b.do(t, http.MethodPost, "/v1/messages", messageBody(map[string]any{"type": "users", "ids": []string{"u_a"}}))
			require.Equal(t, http.StatusAccepted, status, resp)
			msg := resp["message_id"].(string)

			// Registering it again for its own user changes nothing.
			registerFCM(t, b, path, "u_a", "tok-shared", "")
			require.Equal(t, "pending", deliveriesOf(t, b, msg)[shared]["status"])

			registerFCM(t, b, path, "u_b", "tok-shared", "")
			ds := deliveriesOf(t, b, msg)
			require.Equal(t, "cancelled", ds[shared]["status"])
			require.Equal(t, "device_moved", ds[shared]["reason"])
			require.Equal(t, "pending", ds[own]["status"])
			require.Nil(t, ds[own]["reason"])

			status, resp = b.do(t, http.MethodGet, "/v1/messages/"+msg, nil)
			require.Equal(t, http.StatusOK, status, resp)
			require.EqualValues(t, 1, resp["deliveries"].(map[string]any)["pending"], resp)
			require.EqualValues(t, 1, resp["deliveries"].(map[string]any)["cancelled"], resp)
		})
	}
}

// TestInstallationReplacesItsToken: an app's installation gets a new token
// (a reinstall, a restore, a refresh) and registers it under its
// installation id: the same device takes the new token in place, so the
// phone is one device, not two, and a message scheduled before goes to the
// new token. A token the installation takes over from another device
// replaces that device, whose pending deliveries are cancelled as
// device_replaced (the installation's own get the same messages).
func TestInstallationReplacesItsToken(t *testing.T) {
	t.Parallel()
	b := setup(t)
	status, dev := registerFCM(t, b, "/v1/devices", "u_a", "tok-1", "inst-1")
	require.Equal(t, http.StatusCreated, status)
	status, resp := b.do(t, http.MethodPost, "/v1/messages", messageBody(map[string]any{"type": "users", "ids": []string{"u_a"}}))
	require.Equal(t, http.StatusAccepted, status, resp)
	msg := resp["message_id"].(string)

	status, again := registerFCM(t, b, "/v1/devices", "u_a", "tok-2", "inst-1")
	require.Equal(t, http.StatusOK, status, "a new token of a known installation is that device again")
	require.Equal(t, dev, again)
	status, list := b.do(t, http.MethodGet, "/v1/users/u_a/devices", nil)
	require.Equal(t, http.StatusOK, status, list)
	items := list["items"].([]any)
	require.Len(t, items, 1)
	require.Equal(t, "tok-2", items[0].(map[string]any)["token"])
	require.Equal(t, "inst-1", items[0].(map[string]any)["installation_id"])
	require.Equal(t, "pending", deliveriesOf(t, b, msg)[dev]["status"], "the message goes to the new token")

	// The batch form does the same; a registration without the
	// installation id keeps the one the device has.
	registerFCM(t, b, "/v1/devices/batch", "u_a", "tok-3", "inst-1")
	registerFCM(t, b, "/v1/devices/batch", "u_a", "tok-3", "")
	_, list = b.do(t, http.MethodGet, "/v1/users/u_a/devices", nil)
	items = list["items"].([]any)
	require.Len(t, items, 1)
	require.Equal(t, "tok-3", items[0].(map[string]any)["token"])
	require.Equal(t, "inst-1", items[0].(map[string]any)["installation_id"])

	// tok-4 is a device of its own, with a message pending; then the
	// installation registers it as its new token.
	_, other := registerFCM(t, b, "/v1/devices", "u_a", "tok-4", "")
	status, resp = b.do(t, http.MethodPost, "/v1/messages", messageBody(map[string]any{"type": "users", "ids": []string{"u_a"}}))
	require.Equal(t, http.StatusAccepted, status, resp)
	second := resp["message_id"].(string)
	_, again = registerFCM(t, b, "/v1/devices", "u_a", "tok-4", "inst-1")
	require.Equal(t, dev, again)
	_, list = b.do(t, http.MethodGet, "/v1/users/u_a/devices", nil)
	items = list["items"].([]any)
	require.Len(t, items, 1)
	require.Equal(t, "tok-4", items[0].(map[string]any)["token"])
	ds := deliveriesOf(t, b, second)
	require.Equal(t, "pending", ds[dev]["status"])
	require.Equal(t, "cancelled", ds[other]["status"])
	require.Equal(t, "device_replaced", ds[other]["reason"])

	// Another user logging in on the installation moves it, and A's
	// pending deliveries to it are cancelled.
	_, again = registerFCM(t, b, "/v1/devices", "u_b", "tok-5", "inst-1")
	require.Equal(t, dev, again)
	ds = deliveriesOf(t, b, msg)
	require.Equal(t, "cancelled", ds[dev]["status"])
	require.Equal(t, "device_moved", ds[dev]["reason"])

	// One installation with two tokens in one batch is a guess: refused.
	status, resp = b.do(t, http.MethodPost, "/v1/devices/batch", map[string]any{"devices": []any{
		map[string]any{"user_id": "u_b", "channel": "fcm", "token": "tok-6", "installation_id": "inst-1"},
		map[string]any{"user_id": "u_b", "channel": "fcm", "token": "tok-7", "installation_id": "inst-1"},
	}})
	require.Equal(t, http.StatusBadRequest, status, resp)
	require.Equal(t, "devices[1].installation_id", resp["error"].(map[string]any)["field"])
}
