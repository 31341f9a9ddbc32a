package jobs

import (
	"context"
	"testing"
	"time"

	"github.com/riverqueue/river"
	"github.com/stretchr/testify/require"

	"github.com/heraldpush/herald/db"
	"github.com/heraldpush/herald/jobs/preferences"
	"github.com/heraldpush/herald/jobs/push"
)

// These tests work chunks whose users asked something of the message's
// category, for both ways a chunk reads its devices (a snapshot, and the
// pending rows an earlier release wrote), and set every preference after
// the message was scheduled: it is decided when the chunk is sent.

var ledgerDesigns = []Ledger{LedgerAuto, LedgerSnapshots, LedgerRows}

// prefer sets user's preferences as the API does.
func (b *fanOutBundle) prefer(user string, s preferences.Settings) {
	b.t.Helper()
	require.NoError(b.t, s.Check())
	start, end, err := s.StoredQuietHours()
	require.NoError(b.t, err)
	require.NoError(b.t, b.q.PutUserPreferences(context.Background(), db.PutUserPreferencesParams{UserID: user, OptOuts: s.Stored(), QuietStart: start, QuietEnd: end}))
}

// category declares a category.
func (b *fanOutBundle) declare(name string, critical bool, capCount, capSeconds int32) {
	b.t.Helper()
	p := db.PutCategoryParams{Name: name, Critical: critical}
	if capCount > 0 {
		p.CapCount, p.CapPeriodS = &capCount, &capSeconds
	}
	_, err := b.q.PutCategory(context.Background(), p)
	require.NoError(b.t, err)
}

// quietNow is quiet hours, in UTC, that hold the database's now and end
// between one and two hours later (on a whole minute).
func (b *fanOutBundle) quietNow() (*preferences.QuietHours, time.Time) {
	now := b.clock.Now().UTC()
	start := now.Add(-time.Hour).Truncate(time.Minute)
	end := now.Add(2 * time.Hour).Truncate(time.Minute)
	return &preferences.QuietHours{Start: start.Format("15:04"), End: end.Format("15:04")}, end
}

func TestFanOutWithholdsWhatUsersOptedOutOf(t *testing.T) {
	t.Parallel()
	for _, design := range ledgerDesigns {
		t.Run(string(design), func(t *testing.T) {
			t.Parallel()
			b := setupFanOut(t)
			b.design, b.category = design, "marketing"
			users := b.devices("apns-1", "apns-2", "apns-3", "fcm-4")
			c := b.dueNow(users)
			b.prefer(users[0], preferences.Settings{OptOuts: []preferences.OptOut{{Category: "marketing"}}})
			// On another channel than the device's: sent.
			b.prefer(users[1], preferences.Settings{OptOuts: []preferences.OptOut{{Category: "marketing", Channel: "webpush"}}})
			// Of another category: sent.
			b.prefer(users[2], preferences.Settings{OptOuts: []preferences.OptOut{{Category: "news"}}})
			// On the device's channel: withheld.
			b.prefer(users[3], preferences.Settings{OptOuts: []preferences.OptOut{{Category: "marketing", Channel: "fcm"}}})
			apns, fcm := &recordingSender{}, &recordingSender{}
			w := b.worker(map[string]Sender{ChannelAPNs: apns, ChannelFCM: fcm}, FanOutConfig{})

			res := b.work(w, c)
			require.Equal(t, river.EventKindJobCompleted, res.EventKind)
			require.Equal(t, []string{"apns-2", "apns-3"}, apns.sends())
			require.Empty(t, fcm.sends())
			b.requireStatus(c, "apns-1", "cancelled", push.ReasonOptedOut)
			b.requireStatus(c, "apns-2", "accepted", push.ReasonNone)
			b.requireStatus(c, "fcm-4", "cancelled", push.ReasonOptedOut)
			m := b.settled(c.msg.ID)
			require.Equal(t, StateDispatched, m.State)
			require.EqualValues(t, 2, m.OptedOutCount)
			require.EqualValues(t, 2, m.CancelledCount)
		})
	}
}

func TestFanOutHoldsWhatFallsInQuietHours(t *testing.T) {
	t.Parallel()
	for _, design := range ledgerDesigns {
		t.Run(string(design), func(t *testing.T) {
			t.Parallel()
			b := setupFanOut(t)
			b.design = design
			users := b.devices("apns-1", "apns-2")
			// It lives longer than the hours hold it.
			c := b.message(users, b.clock.Now(), 4*time.Hour)
			quiet, end := b.quietNow()
			b.prefer(users[0], preferences.Settings{QuietHours: quiet})
			apns := &recordingSender{}
			w := b.worker(map[string]Sender{ChannelAPNs: apns}, FanOutConfig{})

			res := b.work(w, c)
			require.Equal(t, []string{"apns-2"}, apns.sends(), "nothing is sent inside the user's quiet hours")
			require.Equal(t, river.EventKindJobSnoozed, res.EventKind, "the chunk waits for the quiet hours to end")
			require.WithinDuration(t, end.Add(-b.clock.Offset()), res.Job.ScheduledAt, time.Second)
			b.requireStatus(c, "apns-1", "pending", push.ReasonQuietHours)
			held := chunkTargets(t, b.q, c.args)
			require.Len(t, held, 1)
			require.True(t, end.Equal(held[0].NotBefore), "held until %s, want %s", held[0].NotBefore, end)
			require.True(t, end.Equal(held[0].DueAt), "due when the quiet hours end")

			// Early, nothing is sent and the chunk snoozes again.
			res = b.work(w, c)
			require.Equal(t, river.EventKindJobSnoozed, res.EventKind)
			require.Empty(t, apns.sends())

			// The hours over (the user took them back, and the wait ran
			// out), the held delivery is sent, its skew measured from the
			// end of the hold.
			b.prefer(users[0], preferences.Settings{QuietHours: &preferences.QuietHours{Start: "00:00", End: "00:00"}})
			_, err := b.db.Pool.Exec(context.Background(), `UPDATE deliveries SET not_before = now() WHERE message_id = $1`, c.msg.ID)
			require.NoError(t, err)
			res = b.work(w, c)
			require.Equal(t, river.EventKindJobCompleted, res.EventKind)
			require.Equal(t, []string{"apns-1"}, apns.sends())
			b.requireStatus(c, "apns-1", "accepted", push.ReasonNone)
			var due time.Time
			require.NoError(t, b.db.Pool.QueryRow(context.Background(),
				`SELECT due_at FROM deliveries WHERE message_id = $1 AND device_id = $2`, c.msg.ID, held[0].DeviceID).Scan(&due))
			require.True(t, end.Equal(due), "due_at %s, want %s", due, end)
			m := b.settled(c.msg.ID)
			require.Equal(t, StateDispatched, m.State)
			require.Zero(t, m.QuietHoursCount, "a delivery held and then sent was not withheld")
		})
	}
}

func TestFanOutSkipsOrExpiresWhatQuietHoursWouldHold(t *testing.T) {
	t.Parallel()
	for _, design := range ledgerDesigns {
		t.Run(string(design), func(t *testing.T) {
			t.Parallel()
			b := setupFanOut(t)
			b.design = design
			users := b.devices("apns-1", "apns-2")
			quiet, _ := b.quietNow()

			// Skip: cancelled at once.
			b.quietHours = preferences.QuietSkip
			skip := b.dueNow(users[:1])
			b.prefer(users[0], preferences.Settings{QuietHours: quiet})
			apns := &recordingSender{}
			w := b.worker(map[string]Sender{ChannelAPNs: apns}, FanOutConfig{})
			require.Equal(t, river.EventKindJobCompleted, b.work(w, skip).EventKind)
			b.requireStatus(skip, "apns-1", "cancelled", push.ReasonQuietHours)
			require.EqualValues(t, 1, b.settled(skip.msg.ID).QuietHoursCount)

			// Hold, but the message expires before the hours end: expired
			// at once, not held to its expiry.
			b.quietHours = preferences.QuietHold
			short := b.message(users[1:], b.clock.Now(), 30*time.Minute)
			b.prefer(users[1], preferences.Settings{QuietHours: quiet})
			require.Equal(t, river.EventKindJobCompleted, b.work(w, short).EventKind)
			b.requireStatus(short, "apns-2", "expired", push.ReasonQuietHours)
			m := b.settled(short.msg.ID)
			require.EqualValues(t, 1, m.QuietHoursCount)
			require.EqualValues(t, 1, m.ExpiredCount)
			require.Empty(t, apns.sends())
		})
	}
}

func TestFanOutInstallationQuietHoursAndTheUsersZone(t *testing.T) {
	t.Parallel()
	b := setupFanOut(t)
	users := b.devices("apns-1", "apns-2", "apns-3")
	c := b.message(users, b.clock.Now(), 4*time.Hour)
	quiet, _ := b.quietNow()
	window, err := quiet.Window()
	require.NoError(t, err)
	start, end := window.PG()
	_, err = b.q.PutQuietHoursDefault(context.Background(), db.PutQuietHoursDefaultParams{QuietStart: start, QuietEnd: end, Timezone: "UTC"})
	require.NoError(t, err)
	// users[1] lives twelve hours away: the same hours are not quiet there.
	_, err = b.db.Pool.Exec(context.Background(), `UPDATE users SET timezone = 'Etc/GMT-12' WHERE id = $1`, users[1])
	require.NoError(t, err)
	// users[2] has no quiet hours of their own, over the installation's.
	b.prefer(users[2], preferences.Settings{QuietHours: &preferences.QuietHours{Start: "03:00", End: "03:00"}})
	apns := &recordingSender{}
	w := b.worker(map[string]Sender{ChannelAPNs: apns}, FanOutConfig{})
	require.Equal(t, river.EventKindJobSnoozed, b.work(w, c).EventKind)
	require.Equal(t, []string{"apns-2", "apns-3"}, apns.sends())
	b.requireStatus(c, "apns-1", "pending", push.ReasonQuietHours)
}

func TestFanOutCapsMessagesPerUser(t *testing.T) {
	t.Parallel()
	for _, design := range ledgerDesigns {
		t.Run(string(design), func(t *testing.T) {
			t.Parallel()
			b := setupFanOut(t)
			b.design, b.category = design, "promo"
			b.declare("promo", false, 1, 86400)
			ctx := context.Background()
			// One user with two phones, one with one.
			require.NoError(t, b.q.EnsureUsers(ctx, []string{"both", "one"}))
			_, err := b.q.RegisterDevices(ctx, db.RegisterDevicesParams{
				UserIds: []string{"both", "both", "one"}, Channels: []string{ChannelAPNs, ChannelFCM, ChannelAPNs},
				Tokens: []string{"apns-b", "fcm-b", "apns-o"}, P256dhs: []string{"", "", ""}, Auths: []string{"", "", ""}})
			require.NoError(t, err)
			apns, fcm := &recordingSender{}, &recordingSender{}
			w := b.worker(map[string]Sender{ChannelAPNs: apns, ChannelFCM: fcm}, FanOutConfig{})

			first := b.dueNow([]string{"both", "one"})
			require.Equal(t, river.EventKindJobCompleted, b.work(w, first).EventKind)
			require.Equal(t, []string{"apns-b", "apns-o"}, apns.sends())
			require.Equal(t, []string{"fcm-b"}, fcm.sends(), "a message reaching two phones of one user counts once")

			second := b.dueNow([]string{"both"})
			require.Equal(t, river.EventKindJobCompleted, b.work(w, second).EventKind)
			require.Empty(t, apns.sends())
			require.Empty(t, fcm.sends())
			b.requireStatus(second, "apns-b", "cancelled", push.ReasonCapped)
			b.requireStatus(second, "fcm-b", "cancelled", push.ReasonCapped)
			require.EqualValues(t, 2, b.settled(second.msg.ID).CappedCount)

			// Another category has a cap of its own; the history holds one
			// message for "both".
			var ids []int64
			require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT message_ids FROM frequency_caps WHERE user_id = 'both' AND category = 'promo'`).Scan(&ids))
			require.Equal(t, []int64{first.msg.ID}, ids)
		})
	}
}

// TestCriticalCategoryBypassesEveryPreference: a critical category is
// never opted out of, held by quiet hours or capped.
func TestCriticalCategoryBypassesEveryPreference(t *testing.T) {
	t.Parallel()
	b := setupFanOut(t)
	b.category = "alerts"
	b.declare("alerts", true, 0, 0)
	users := b.devices("apns-1")
	quiet, _ := b.quietNow()
	apns := &recordingSender{}
	w := b.worker(map[string]Sender{ChannelAPNs: apns}, FanOutConfig{})
	for i := range 3 {
		c := b.dueNow(users)
		b.prefer(users[0], preferences.Settings{OptOuts: []preferences.OptOut{{Category: "alerts"}, {Category: "marketing"}}, QuietHours: quiet})
		require.Equal(t, river.EventKindJobCompleted, b.work(w, c).EventKind, "message %d", i)
		b.requireStatus(c, "apns-1", "accepted", push.ReasonNone)
	}
	require.Len(t, apns.sends(), 3)

	// The same preferences withhold an ordinary category's message.
	b.category = "marketing"
	c := b.dueNow(users)
	require.Equal(t, river.EventKindJobCompleted, b.work(w, c).EventKind)
	b.requireStatus(c, "apns-1", "cancelled", push.ReasonOptedOut)
	require.Empty(t, apns.sends())
}
