package jobs

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/heraldpush/herald/jobs/push"
)

func TestTargetsRoundTrip(t *testing.T) {
	t.Parallel()
	in := FanOutArgs{MessageID: 7, Chunk: 2, Targets: Targets{
		{Target: push.Target{DeviceID: 1, Token: "ab12"}, Channel: "apns"},
		{Target: push.Target{DeviceID: 22, Token: "fcm:tok-en_x"}, Channel: "fcm"},
		{Target: push.Target{DeviceID: 333, Token: "https://push.example/w/1?x=y", P256dh: "BKey", Auth: "AuthKey"}, Channel: "webpush"},
		// A sandbox token and devices with localizations keep both.
		{Target: push.Target{DeviceID: 4, Token: "cd34", Sandbox: true}, Channel: "apns", Locale: "de"},
		{Target: push.Target{DeviceID: 5, Token: "ef56", Sandbox: true}, Channel: "apns"},
		{Target: push.Target{DeviceID: 6, Token: "fcm-6"}, Channel: "fcm", Locale: "pt-BR"},
		{Target: push.Target{DeviceID: 7, Token: "https://push.example/w/7", P256dh: "K", Auth: "A"}, Channel: "webpush", Locale: "zh-Hant-TW"},
	}}
	raw, err := json.Marshal(in)
	require.NoError(t, err)

	// Targets are one string in the args, so River's GIN index takes one
	// entry for them.
	var shape map[string]any
	require.NoError(t, json.Unmarshal(raw, &shape))
	require.IsType(t, "", shape["targets"])

	var out FanOutArgs
	require.NoError(t, json.Unmarshal(raw, &out))
	require.Equal(t, in, out)

	var empty FanOutArgs
	raw, err = json.Marshal(FanOutArgs{})
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(raw, &empty))
	require.Empty(t, empty.Targets)
}

func TestTargetsRejectMalformed(t *testing.T) {
	t.Parallel()
	_, err := json.Marshal(Targets{{Target: push.Target{DeviceID: 1, Token: "x"}, Channel: "sms"}})
	require.Error(t, err)
	_, err = json.Marshal(Targets{{Target: push.Target{DeviceID: 1, Token: "a\tb"}, Channel: "fcm"}})
	require.Error(t, err)
	_, err = json.Marshal(Targets{{Target: push.Target{DeviceID: 1, Token: "x", Sandbox: true}, Channel: "fcm"}})
	require.Error(t, err, "only APNs has a sandbox")

	for _, bad := range []string{`"x\ta\n"`, `"1\tq\ttok\n"`, `"1\t\ttok\n"`, `"1\tf\ttok\tonly-one-key\n"`, `42`} {
		var ts Targets
		require.Error(t, json.Unmarshal([]byte(bad), &ts), bad)
	}
}
