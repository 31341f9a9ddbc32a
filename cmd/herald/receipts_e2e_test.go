package main

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/heraldpush/herald/api/client"
	"github.com/heraldpush/herald/jobs/push"
	"github.com/heraldpush/herald/jobs/receipt"
)

// TestPushesCarryReceiptTokens sends a message through the whole of Herald
// to a user with a device on every channel and reads, in fakepush's
// detailed receipts, the receipt token each push carried where its app
// reads it: it verifies under the key the processes share to that
// message and that device, and is good until a week after the message's
// expiry. With HERALD_RECEIPTS=off the pushes carry none.
func TestPushesCarryReceiptTokens(t *testing.T) {
	t.Parallel()
	for _, on := range []bool{true, false} {
		vars := map[string]string{}
		if !on {
			vars["HERALD_RECEIPTS"] = "off"
		}
		e := startE2E(t, vars)
		e.register("ann", false)
		head := e.send(client.NewMessage{Audience: toUsers("ann"), Payload: client.Payload{Title: new("Standup")}})
		st := e.settle(head.MessageID, 30*time.Second)
		require.Equal(t, client.MessageStateDispatched, st.State)

		devices := map[string]int64{}
		for _, d := range e.deliveries(head.MessageID, client.DeliveryStatusAccepted) {
			id, ok := push.ParseID("dev_", d.DeviceID)
			require.True(t, ok, d.DeviceID)
			devices[string(d.Channel)] = id
		}
		require.Len(t, devices, 3)

		var signer *receipt.Signer
		if on {
			// The key the worker drew, as every process reads it.
			var err error
			signer, err = receipt.Shared(context.Background(), e.db.Pool)
			require.NoError(t, err)
		}
		messageID, _ := push.ParseMessageID(head.MessageID)
		expires := st.ExpiresAt.Add(7 * 24 * time.Hour)
		rs := e.fake.DetailedReceipts(head.MessageID)
		require.Len(t, rs, 3)
		for _, r := range rs {
			var body map[string]any
			require.NoError(t, json.Unmarshal(r.Body, &body))
			keys := body
			if r.Channel == "fcm" {
				keys = body["data"].(map[string]any)
			}
			token, ok := keys[push.ReceiptKey].(string)
			if !on {
				require.False(t, ok, "%s: receipts off, no token: %s", r.Channel, r.Body)
				continue
			}
			require.True(t, ok, "%s carries its token: %s", r.Channel, r.Body)
			d, err := signer.Verify(token, expires.Add(-time.Second))
			require.NoError(t, err, r.Channel)
			require.Equal(t, receipt.Delivery{MessageID: messageID, DeviceID: devices[r.Channel]}, d, r.Channel)
			_, err = signer.Verify(token, expires.Add(time.Second))
			require.ErrorIs(t, err, receipt.ErrExpired, r.Channel)
		}
	}
}
