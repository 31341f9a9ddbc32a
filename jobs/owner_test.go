package jobs

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/stretchr/testify/require"

	"github.com/heraldpush/herald/db"
	"github.com/heraldpush/herald/jobs/push"
)

// ownerChanges are the ways ownedMessage changes its devices.
var ownerChanges = []struct {
	name   string
	ledger Ledger
	// bypass changes the devices behind the ledger's back, as the races
	// a chunk of a message scheduled with ledger rows can meet leave them;
	// otherwise they change as the API changes them.
	bypass bool
}{
	{"runs", LedgerAuto, false},
	{"snapshot", LedgerSnapshots, false},
	{"rows", LedgerRows, false},
	{"rows, behind the ledger's back", LedgerRows, true},
}

// ownedMessage schedules a message to one user with five devices, then
// changes four of them: one moved to another user, one moved away and back
// again, one evicted by another message's send, one deleted. With bypass
// (a message of ledger rows) they change behind the ledger's back, as the
// races its chunk can meet leave them: the moves committed while the
// message's ledger was being written, so they cancelled nothing, and the
// deletion's cancel ran before the row was written; the device moved back
// is its user's own once more. Otherwise they change as the API changes
// them (a registration, an erasure), which cancels the deliveries of the
// devices moved (both: the one moved back was someone else's meanwhile)
// and deleted.
func ownedMessage(t *testing.T, b *fanOutBundle, bypass bool, dispatchAt time.Time, lifetime time.Duration) chunkJob {
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

	move := func(user string, tokens ...string) {
		if bypass {
			_, err := b.db.Pool.Exec(ctx, `UPDATE devices SET user_id = $1 WHERE token = ANY ($2)`, user, tokens)
			require.NoError(t, err)
			return
		}
		require.NoError(t, db.InTx(ctx, b.db.Pool, func(tx pgx.Tx) error {
			var regs []db.Registration
			for _, token := range tokens {
				regs = append(regs, db.Registration{UserID: user, Channel: map[bool]string{true: ChannelAPNs, false: ChannelFCM}[token[:4] == "apns"], Token: token, Environment: "production"})
			}
			r, err := db.BeginRegistration(ctx, tx, regs)
			if err != nil {
				return err
			}
			_, err = r.Write(ctx)
			return err
		}))
	}
	move("stranger", "apns-moved", "fcm-back")
	move("owner", "fcm-back")
	n, err := b.q.EvictDevice(ctx, db.EvictDeviceParams{ID: c.device(t, "fcm-evicted"), Reason: new("unregistered")})
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	deleted := c.device(t, "fcm-deleted")
	require.NoError(t, db.InTx(ctx, b.db.Pool, func(tx pgx.Tx) error {
		if !bypass {
			if err := db.EraseDevices(ctx, tx, []int64{deleted}); err != nil {
				return err
			}
		}
		n, err := db.On(tx).DeleteDevice(ctx, deleted)
		require.EqualValues(t, 1, n)
		return err
	}))
	return c
}

// TestFanOutSendsOnlyToTheDevicesOwner: a chunk sends a delivery only if its
// device still belongs to the delivery's user and is active. The phone
// that changed hands gets nothing of its former owner's, nor do a deleted
// or an evicted device; the owner's other devices get theirs; the ledger
// says why each was not sent, and the counters stay exact.
func TestFanOutSendsOnlyToTheDevicesOwner(t *testing.T) {
	t.Parallel()
	for _, change := range ownerChanges {
		t.Run(change.name, func(t *testing.T) {
			t.Parallel()
			b := setupFanOut(t)
			b.design = change.ledger
			c := ownedMessage(t, b, change.bypass, b.clock.Now(), time.Hour)
			apns, fcm := &recordingSender{}, &recordingSender{}
			w := b.worker(map[string]Sender{ChannelAPNs: apns, ChannelFCM: fcm}, FanOutConfig{})

			res := b.work(w, c)
			require.Equal(t, river.EventKindJobCompleted, res.EventKind)
			require.Equal(t, []string{"apns-kept"}, apns.sends())
			b.requireStatus(c, "apns-kept", "accepted", "")
			cancelled := []string{"apns-moved", "fcm-deleted", "fcm-evicted"}
			if change.bypass {
				require.Equal(t, []string{"fcm-back"}, fcm.sends())
				b.requireStatus(c, "fcm-back", "accepted", "")
			} else {
				require.Empty(t, fcm.sends())
				b.requireStatus(c, "fcm-back", "cancelled", push.ReasonDeviceMoved)
				cancelled = append(cancelled, "fcm-back")
			}
			b.requireStatus(c, "apns-moved", "cancelled", push.ReasonDeviceMoved)
			b.requireStatus(c, "fcm-deleted", "cancelled", push.ReasonDeviceDeleted)
			b.requireStatus(c, "fcm-evicted", "cancelled", push.ReasonDeviceEvicted)
			for _, token := range cancelled {
				d := b.ledger(c.msg.ID)[c.device(t, token)]
				require.Nil(t, d.AttemptedAt, "%s: a cancelled delivery was never attempted", token)
			}
			m := b.settled(c.msg.ID)
			require.Equal(t, StateDispatched, m.State)
			require.EqualValues(t, 5-len(cancelled), m.AcceptedCount)
			require.EqualValues(t, len(cancelled), m.CancelledCount)
		})
	}
}

// TestFanOutExpiringChunkCancelsWhatIsGone: a chunk that begins past its
// lifetime expires what is pending, except what could not have been sent
// anyway: the deliveries of devices no longer their user's are cancelled
// with the reason, as a chunk in time would have.
func TestFanOutExpiringChunkCancelsWhatIsGone(t *testing.T) {
	t.Parallel()
	for _, change := range ownerChanges {
		t.Run(change.name, func(t *testing.T) {
			t.Parallel()
			b := setupFanOut(t)
			b.design = change.ledger
			c := ownedMessage(t, b, change.bypass, b.clock.Now().Add(-2*time.Minute), time.Minute)
			apns, fcm := &recordingSender{}, &recordingSender{}
			w := b.worker(map[string]Sender{ChannelAPNs: apns, ChannelFCM: fcm}, FanOutConfig{})

			res := b.work(w, c)
			require.Equal(t, river.EventKindJobCompleted, res.EventKind)
			require.Empty(t, apns.sends())
			require.Empty(t, fcm.sends())
			b.requireStatus(c, "apns-kept", "expired", "")
			expired, cancelled := 1, 3
			if change.bypass {
				b.requireStatus(c, "fcm-back", "expired", "")
				expired++
			} else {
				b.requireStatus(c, "fcm-back", "cancelled", push.ReasonDeviceMoved)
				cancelled++
			}
			b.requireStatus(c, "apns-moved", "cancelled", push.ReasonDeviceMoved)
			b.requireStatus(c, "fcm-deleted", "cancelled", push.ReasonDeviceDeleted)
			b.requireStatus(c, "fcm-evicted", "cancelled", push.ReasonDeviceEvicted)
			m := b.settled(c.msg.ID)
			require.EqualValues(t, expired, m.ExpiredCount)
			require.EqualValues(t, cancelled, m.CancelledCount)
		})
	}
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
