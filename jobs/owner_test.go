package jobs

import (
	"context"
	"testing"
	"time"

	"github.com/riverqueue/river"
	"github.com/stretchr/testify/require"

	"github.com/heraldpush/herald/db"
	"github.com/heraldpush/herald/jobs/push"
)

// ownedMessage schedules a message to one user with five devices, then
// changes four of them behind the ledger's back, as the races a chunk can
// meet leave them: one moved to another user (the registration committed
// while the message's ledger was being written, so it cancelled nothing),
// one evicted by another message's send, one deleted without its
// deliveries cancelled (one row of the ledger written after the erasure's
// cancel), and one moved away and back again (its user's own once more).
func ownedMessage(t *testing.T, b *fanOutBundle, dispatchAt time.Time, lifetime time.Duration) chunkJob {
	t.Helper()
	ctx := context.Background()
	require.NoError(t, b.q.EnsureUsers(ctx, []string{"owner", "stranger"}))
	p := db.RegisterDevicesParams{}
	for _, token := range []string{"apns-kept", "apns-moved", "fcm-back", "fcm-deleted", "fcm-evicted"} {
		p.UserIds = append(p.UserIds, "owner")
		p.Channels = append(p.Channels, map[bool]string{true: ChannelAPNs, false: ChannelFCM}[token[:4] == "apns"])
		p.Tokens = append(p.Tokens, token)
		p.P256dhs, p.Auths = append(p.P256dhs, ""), append(p.Auths, "")
	}
	_, err := b.q.RegisterDevices(ctx, p)
	require.NoError(t, err)
	c := b.message([]string{"owner"}, dispatchAt, lifetime)

	_, err = b.db.Pool.Exec(ctx, `UPDATE devices SET user_id = 'stranger' WHERE token IN ('apns-moved', 'fcm-back')`)
	require.NoError(t, err)
	_, err = b.db.Pool.Exec(ctx, `UPDATE devices SET user_id = 'owner' WHERE token = 'fcm-back'`)
	require.NoError(t, err)
	n, err := b.q.EvictDevice(ctx, db.EvictDeviceParams{ID: c.device(t, "fcm-evicted"), Reason: new("unregistered")})
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	n, err = b.q.DeleteDevice(ctx, c.device(t, "fcm-deleted"))
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	return c
}

// TestFanOutSendsOnlyToTheDevicesOwner: a chunk sends a delivery only if its
// device still belongs to the delivery's user and is active. The phone
// that changed hands gets nothing of its former owner's, nor do a deleted
// or an evicted device; the owner's other devices get theirs; the ledger
// says why each was not sent, and the counters stay exact.
func TestFanOutSendsOnlyToTheDevicesOwner(t *testing.T) {
	t.Parallel()
	b := setupFanOut(t)
	c := ownedMessage(t, b, b.clock.Now(), time.Hour)
	apns, fcm := &recordingSender{}, &recordingSender{}
	w := b.worker(map[string]Sender{ChannelAPNs: apns, ChannelFCM: fcm}, FanOutConfig{})

	res := b.work(w, c)
	require.Equal(t, river.EventKindJobCompleted, res.EventKind)
	require.Equal(t, []string{"apns-kept"}, apns.sends())
	require.Equal(t, []string{"fcm-back"}, fcm.sends())
	b.requireStatus(c, "apns-kept", "accepted", "")
	b.requireStatus(c, "fcm-back", "accepted", "")
	b.requireStatus(c, "apns-moved", "cancelled", push.ReasonDeviceMoved)
	b.requireStatus(c, "fcm-deleted", "cancelled", push.ReasonDeviceDeleted)
	b.requireStatus(c, "fcm-evicted", "cancelled", push.ReasonDeviceEvicted)
	for _, token := range []string{"apns-moved", "fcm-deleted", "fcm-evicted"} {
		d := b.ledger(c.msg.ID)[c.device(t, token)]
		require.Nil(t, d.AttemptedAt, "%s: a cancelled delivery was never attempted", token)
	}
	m := b.settled(c.msg.ID)
	require.Equal(t, StateDispatched, m.State)
	require.EqualValues(t, 2, m.AcceptedCount)
	require.EqualValues(t, 3, m.CancelledCount)
}

// TestFanOutExpiringChunkCancelsWhatIsGone: a chunk that begins past its
// lifetime expires what is pending, except what could not have been sent
// anyway: the deliveries of devices no longer their user's are cancelled
// with the reason, as a chunk in time would have.
func TestFanOutExpiringChunkCancelsWhatIsGone(t *testing.T) {
	t.Parallel()
	b := setupFanOut(t)
	c := ownedMessage(t, b, b.clock.Now().Add(-2*time.Minute), time.Minute)
	apns, fcm := &recordingSender{}, &recordingSender{}
	w := b.worker(map[string]Sender{ChannelAPNs: apns, ChannelFCM: fcm}, FanOutConfig{})

	res := b.work(w, c)
	require.Equal(t, river.EventKindJobCompleted, res.EventKind)
	require.Empty(t, apns.sends())
	require.Empty(t, fcm.sends())
	b.requireStatus(c, "apns-kept", "expired", "")
	b.requireStatus(c, "fcm-back", "expired", "")
	b.requireStatus(c, "apns-moved", "cancelled", push.ReasonDeviceMoved)
	b.requireStatus(c, "fcm-deleted", "cancelled", push.ReasonDeviceDeleted)
	b.requireStatus(c, "fcm-evicted", "cancelled", push.ReasonDeviceEvicted)
	m := b.settled(c.msg.ID)
	require.EqualValues(t, 2, m.ExpiredCount)
	require.EqualValues(t, 3, m.CancelledCount)
}

// TestDeviceReasonsAreOneVocabulary: the reasons db writes when it cancels
// a device's deliveries (it cannot import push) are push's, and each
// cancels rather than fails.
func TestDeviceReasonsAreOneVocabulary(t *testing.T) {
	t.Parallel()
	for _, r := range []struct {
		db   string
		push push.Reason
	}{
		{db.ReasonDeviceMoved, push.ReasonDeviceMoved},
		{db.ReasonDeviceDeleted, push.ReasonDeviceDeleted},
		{db.ReasonDeviceEvicted, push.ReasonDeviceEvicted},
		{db.ReasonDeviceReplaced, push.ReasonDeviceReplaced},
	} {
		require.Equal(t, string(r.push), r.db)
		require.True(t, r.push.Cancels(), r.db)
	}
}
