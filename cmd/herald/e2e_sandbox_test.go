package main

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestE2EAPNsSandboxDevices runs issue 14's sandbox case through Herald and
// fakepush as processes see them: a device registered with environment
// sandbox reaches only the sandbox host (APNS_SANDBOX_HOST, from fakepush's
// env), a production one only the production host, and a sandbox token
// registered as production fails wrong_environment without being evicted,
// so that registering it again with its environment is all it takes.
func TestE2EAPNsSandboxDevices(t *testing.T) {
	t.Parallel()
	e := startE2E(t, nil)
	debug, release, misregistered := hexToken(""), hexToken(""), hexToken("")
	require.NoError(t, e.fake.DeclareSandboxTokens([]string{debug, misregistered}))
	e.must(http.StatusCreated, http.MethodPost, "/v1/devices", map[string]any{"user_id": "dev", "channel": "apns", "token": debug, "environment": "sandbox"})
	e.must(http.StatusCreated, http.MethodPost, "/v1/devices", map[string]any{"user_id": "rel", "channel": "apns", "token": release})
	e.must(http.StatusCreated, http.MethodPost, "/v1/devices", map[string]any{"user_id": "oops", "channel": "apns", "token": misregistered})

	send := func() string {
		msg := e.must(http.StatusAccepted, http.MethodPost, "/v1/messages", map[string]any{
			"audience": map[string]any{"type": "users", "ids": []string{"dev", "rel", "oops"}},
			"payload":  map[string]any{"title": "build 42"},
		})
		id := msg["message_id"].(string)
		require.Equal(t, "dispatched", e.settle(id, 30*time.Second)["state"])
		return id
	}
	id := send()
	hosts := map[string]string{}
	for _, r := range e.fake.Receipts(id) {
		hosts[r.Token] = r.Environment
	}
	require.Equal(t, map[string]string{debug: "sandbox", release: "production"}, hosts)
	failed := e.deliveries(id, "failed")
	require.Len(t, failed, 1)
	require.Equal(t, "oops", failed[0]["user_id"])
	require.Equal(t, "wrong_environment", failed[0]["reason"])
	list := e.must(http.StatusOK, http.MethodGet, "/v1/users/oops/devices", nil)
	device := list["items"].([]any)[0].(map[string]any)
	require.Equal(t, "active", device["status"], "a device in the wrong environment is not evicted")

	e.must(http.StatusOK, http.MethodPost, "/v1/devices", map[string]any{"user_id": "oops", "channel": "apns", "token": misregistered, "environment": "sandbox"})
	id = send()
	require.Len(t, e.fake.Receipts(id), 3)
	require.Empty(t, e.deliveries(id, "failed"))
}
