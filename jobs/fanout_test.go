package jobs

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestTargetsRoundTrip(t *testing.T) {
	t.Parallel()
	in := FanOutArgs{MessageID: 7, Chunk: 2, Targets: Targets{
		{DeviceID: 1, Channel: "apns", Token: "ab12"},
		{DeviceID: 22, Channel: "fcm", Token: "fcm:tok-en_x"},
		{DeviceID: 333, Channel: "webpush", Token: "https://push.example/w/1?x=y", P256dh: "BKey", Auth: "AuthKey"},
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
	_, err := json.Marshal(Targets{{DeviceID: 1, Channel: "sms", Token: "x"}})
	require.Error(t, err)
	_, err = json.Marshal(Targets{{DeviceID: 1, Channel: "fcm", Token: "a\tb"}})
	require.Error(t, err)

	for _, bad := range []string{`"x\ta\n"`, `"1\tq\ttok\n"`, `"1\t\ttok\n"`, `"1\tf\ttok\tonly-one-key\n"`, `42`} {
		var ts Targets
		require.Error(t, json.Unmarshal([]byte(bad), &ts), bad)
	}
}
