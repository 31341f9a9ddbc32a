package db_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/heraldpush/herald/db"
	"github.com/heraldpush/herald/db/dbtest"
)

// TestLedgerWritesWebhookEvents: a ledger write records a webhook's
// delivery.failed events for its failures, in the same statement, when the
// write asks for them, and device.evicted for the devices it evicts, and
// the message's settle writes message.settled; only webhooks that want a
// type get its events, each once.
func TestLedgerWritesWebhookEvents(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tdb := dbtest.New(t)
	q := db.On(tdb.Pool)
	lifePopulation(t, tdb.Pool, 6)
	wants := func(events ...string) int64 {
		w, err := q.CreateWebhook(ctx, db.CreateWebhookParams{Url: "https://hooks.example.com/", Events: events, Secret: "whsec_AA==", MaxWebhooks: 10})
		require.NoError(t, err)
		return w.ID
	}
	all := wants("delivery.failed", "device.evicted", "message.settled")
	settled := wants("message.settled")

	write := func(id int64, failureEvents bool) {
		at := time.Now()
		w := db.ChunkWrite{MessageID: id, Settle: true, FailureEvents: failureEvents,
			Evict: db.EvictDevicesParams{SentAfter: at, Ids: []int64{1}, Reasons: []string{"unregistered"}}}
		w.Results.Add(db.DeliveryKey{MessageID: id, DeviceID: 1, UserID: "test", Channel: "apns"}, "failed", "unregistered", at.UnixMicro(), 0)
		w.Results.Add(db.DeliveryKey{MessageID: id, DeviceID: 2, UserID: "test", Channel: "apns"}, "failed", "bad_token", at.UnixMicro(), 0)
		for d := int64(3); d <= 6; d++ {
			w.Results.Add(db.DeliveryKey{MessageID: id, DeviceID: d, UserID: "test", Channel: "apns"}, "accepted", "", at.UnixMicro(), at.UnixMicro())
		}
		_, err := db.WriteChunks(ctx, tdb.Pool, []db.ChunkWrite{w})
		require.NoError(t, err)
		// Written again (a retried chunk), nothing changes.
		_, err = db.WriteChunks(ctx, tdb.Pool, []db.ChunkWrite{w})
		require.NoError(t, err)
	}
	type event struct {
		webhook int64
		typ     string
		device  *int64
		user    *string
		reason  *string
	}
	events := func(message int64) []event {
		rows, err := tdb.Pool.Query(ctx, "SELECT webhook_id, type, device_id, user_id, reason FROM webhook_events WHERE message_id = $1 ORDER BY id", message)
		require.NoError(t, err)
		defer rows.Close()
		var out []event
		for rows.Next() {
			var e event
			require.NoError(t, rows.Scan(&e.webhook, &e.typ, &e.device, &e.user, &e.reason))
			out = append(out, e)
		}
		require.NoError(t, rows.Err())
		return out
	}
	dev := func(n int64) *int64 { return &n }
	str := func(s string) *string { return &s }

	first, _ := scheduleLifeMessage(t, tdb.Pool, 6, false)
	write(first, true)
	require.ElementsMatch(t, []event{
		{all, "device.evicted", dev(1), str("user_0"), str("unregistered")},
		{all, "delivery.failed", dev(1), str("user_0"), str("unregistered")},
		{all, "delivery.failed", dev(2), str("user_1"), str("bad_token")},
		{all, "message.settled", nil, nil, nil},
		{settled, "message.settled", nil, nil, nil},
	}, events(first))

	// A write whose process knows no webhook wants failures writes none;
	// the settle's event does not depend on it.
	_, err := tdb.Pool.Exec(ctx, "UPDATE devices SET status = 'active', evicted_at = NULL, evicted_reason = NULL, updated_at = now() - interval '1 hour'")
	require.NoError(t, err)
	second, _ := scheduleLifeMessage(t, tdb.Pool, 6, false)
	write(second, false)
	require.ElementsMatch(t, []event{
		{all, "device.evicted", dev(1), str("user_0"), str("unregistered")},
		{all, "message.settled", nil, nil, nil},
		{settled, "message.settled", nil, nil, nil},
	}, events(second))
}
