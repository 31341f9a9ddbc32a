package jobs

import (
	"time"

	"github.com/heraldpush/herald/db"
	"github.com/heraldpush/herald/jobs/preferences"
	"github.com/heraldpush/herald/jobs/push"
)

// Target is one device of a chunk: what its provider needs to send to it,
// which provider that is, and which of the message's localizations it gets
// ("" for the message's own text), picked by its user's locale when the
// message was scheduled.
type Target struct {
	push.Target
	Channel string
	Locale  string
	// Gone, when set, is why the device must not be sent the delivery:
	// it was moved to another user, deleted or evicted since the message
	// was scheduled. The delivery is cancelled with it as its reason.
	Gone push.Reason
	// Attempt counts the delivery's earlier attempts.
	Attempt int
	// NotBefore, when set, is the instant (in the database's frame) before
	// which the delivery must not be sent: its device was throttled.
	NotBefore time.Time
	// App is the device's app (jobs/apps), whose credentials it is sent
	// with; Credential, for a Web Push device, the credential whose VAPID
	// key it subscribed with (0 for none recorded).
	App        int32
	Credential int64
	// UserID is the delivery's user: the device's when its message was
	// scheduled, which its ledger row records.
	UserID string
	// Prefs are what the user asked of the message's category, read when
	// the chunk began (jobs/preferences).
	Prefs preferences.User
	// DueAt, when set, is when the delivery is due: the end of the quiet
	// hours that held it (its row's due time); else its chunk's.
	DueAt time.Time
	// Held says the delivery waits, pending, for its user's quiet hours to
	// end (NotBefore); Expires that it expires unsent for them (Gone says
	// quiet hours): both decided by withhold.
	Held, Expires bool
	// Written says the delivery had a ledger row when its chunk read it
	// (db.ChunkPendingRow): one without is written as its row's first.
	Written bool
}

// sendable says whether the delivery may be sent at now (the database's
// clock): its device is still its user's, and no wait (a throttle, quiet
// hours) holds it past now.
func (t *Target) sendable(now time.Time) bool {
	return t.Gone == push.ReasonNone && !t.NotBefore.After(now)
}

// targetOf is the target of a pending delivery the chunk read.
func targetOf(r db.ChunkPendingRow) Target {
	t := NewTarget(r.DeviceID, r.Channel, r.Locale, r.Token, r.P256dh, r.Auth, r.Environment)
	t.Gone = push.Reason(r.Gone)
	t.Attempt = int(r.Attempt)
	if r.NotBefore != nil {
		t.NotBefore = *r.NotBefore
	}
	t.App, t.Credential, t.UserID = r.AppID, r.CredentialID, r.UserID
	t.DueAt = r.HeldDue
	t.Written = r.Written
	t.Prefs = preferences.User{OptedOut: r.OptedOut}
	t.Prefs.Quiet, t.Prefs.Own = preferences.WindowOf(r.QuietStart, r.QuietEnd)
	t.Prefs.Zone = r.Timezone
	return t
}

// NewTarget is a device as the ledger and the directory hold it, ready to
// send to: its channel and picked localization (the delivery's), its token,
// Web Push keys and APNs environment (the device's). herald bench's blast
// builds its targets with it too, so that it sends what a worker sends.
func NewTarget(deviceID int64, channel string, locale *string, token string, p256dh, auth *string, environment string) Target {
	t := Target{Target: push.Target{DeviceID: deviceID, Token: token, Sandbox: environment == "sandbox"}, Channel: channel}
	if locale != nil {
		t.Locale = *locale
	}
	if p256dh != nil && auth != nil {
		t.P256dh, t.Auth = *p256dh, *auth
	}
	return t
}
