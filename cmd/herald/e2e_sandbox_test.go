package main

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/heraldpush/herald/api/client"
)

// TestAPNsSandboxDevices runs issue 14's sandbox case through Herald and
// fakepush as processes see them: a device registered with environment
// sandbox reaches only the sandbox host (APNS_SANDBOX_HOST, from fakepush's
// env), a production one only the production host, and a sandbox token
// registered as production fails wrong_environment without being evicted,
// so that registering it again with its environment is all it takes.
func TestAPNsSandboxDevices(t *testing.T) {
	t.Parallel()
	e := startE2E(t, nil)
	debug, release, misregistered := hexToken(""), hexToken(""), hexToken("")
	require.NoError(t, e.fake.DeclareSandboxTokens([]string{debug, misregistered}))
	sandbox := client.DeviceRegistrationEnvironmentSandbox
	e.registerDevice(client.DeviceRegistration{UserID: "dev", Channel: client.ChannelAPNs, Token: &debug, Environment: &sandbox})
	e.registerDevice(client.DeviceRegistration{UserID: "rel", Channel: client.ChannelAPNs, Token: &release})
	e.registerDevice(client.DeviceRegistration{UserID: "oops", Channel: client.ChannelAPNs, Token: &misregistered})

	send := func() string {
		id := e.send(client.NewMessage{Audience: toUsers("dev", "rel", "oops"), Payload: titled("build 42")}).MessageID
		require.Equal(t, client.MessageStateDispatched, e.settle(id, 30*time.Second).State)
		return id
	}
	id := send()
	hosts := map[string]string{}
	for _, r := range e.fake.Receipts(id) {
		hosts[r.Token] = r.Environment
	}
	require.Equal(t, map[string]string{debug: "sandbox", release: "production"}, hosts)
	failed := e.deliveries(id, client.DeliveryStatusFailed)
	require.Len(t, failed, 1)
	require.Equal(t, "oops", failed[0].UserID)
	require.Equal(t, client.ReasonWrongEnvironment, *failed[0].Reason)
	devices := e.userDevices("oops")
	require.Equal(t, client.DeviceStatusActive, devices[0].Status, "a device in the wrong environment is not evicted")

	again, err := e.api.RegisterDeviceWithResponse(context.Background(), client.DeviceRegistration{
		UserID: "oops", Channel: client.ChannelAPNs, Token: &misregistered, Environment: &sandbox,
	})
	answered(t, http.StatusOK, again, err)
	id = send()
	require.Len(t, e.fake.Receipts(id), 3)
	require.Empty(t, e.deliveries(id, client.DeliveryStatusFailed))
}
