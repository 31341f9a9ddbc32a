package preferences

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func at(t *testing.T, zone, wall string) time.Time {
	t.Helper()
	loc, err := time.LoadLocation(zone)
	require.NoError(t, err)
	ts, err := time.ParseInLocation("2006-01-02 15:04", wall, loc)
	require.NoError(t, err)
	return ts
}

func window(t *testing.T, start, end string) Window {
	t.Helper()
	w, err := QuietHours{Start: start, End: end}.Window()
	require.NoError(t, err)
	return w
}

// TestQuietHoursEndAcrossDST: the window's end is the wall time in the
// user's zone on both sides of a change, in two zones that change on
// different days, with an end inside the spring-forward gap (the first
// instant after it) and one that happens twice (the first of the two).
func TestQuietHoursEndAcrossDST(t *testing.T) {
	for _, c := range []struct {
		name, zone, start, end, now string
		inside                      bool
		until                       string // RFC 3339, in UTC
	}{
		// Europe/Berlin springs forward on 2026-03-29 at 02:00 → 03:00: a
		// night of 23 hours, the window still ends at 07:00 local.
		{"berlin spring night", "Europe/Berlin", "22:00", "07:00", "2026-03-28 23:30", true, "2026-03-29T05:00:00Z"},
		{"berlin before spring", "Europe/Berlin", "22:00", "07:00", "2026-03-27 23:30", true, "2026-03-28T06:00:00Z"},
		// New York springs forward two weeks earlier, on 2026-03-08.
		{"new york spring night", "America/New_York", "22:00", "07:00", "2026-03-07 22:00", true, "2026-03-08T11:00:00Z"},
		{"new york falls back", "America/New_York", "22:00", "07:00", "2026-10-31 23:00", true, "2026-11-01T12:00:00Z"},
		{"berlin falls back", "Europe/Berlin", "22:00", "07:00", "2026-10-24 22:30", true, "2026-10-25T06:00:00Z"},
		// An end inside the gap (02:30 does not exist in Berlin on
		// 2026-03-29): the first instant after it, 03:00 CEST.
		{"end in the gap", "Europe/Berlin", "23:00", "02:30", "2026-03-29 01:00", true, "2026-03-29T01:00:00Z"},
		// An end that happens twice (02:30 in Berlin on 2026-10-25):
		// the first, 02:30 CEST.
		{"end twice", "Europe/Berlin", "23:00", "02:30", "2026-10-25 01:00", true, "2026-10-25T00:30:00Z"},
		// Outside, and the edges: the start is inside, the end is not.
		{"outside", "Europe/Berlin", "22:00", "07:00", "2026-03-28 12:00", false, ""},
		{"at start", "Europe/Berlin", "22:00", "07:00", "2026-03-28 22:00", true, "2026-03-29T05:00:00Z"},
		{"at end", "Europe/Berlin", "22:00", "07:00", "2026-03-29 07:00", false, ""},
		{"after midnight", "America/New_York", "22:00", "07:00", "2026-03-08 03:30", true, "2026-03-08T11:00:00Z"},
		// A window within a day.
		{"daytime", "UTC", "12:00", "14:00", "2026-06-01 13:00", true, "2026-06-01T14:00:00Z"},
		{"empty", "UTC", "08:00", "08:00", "2026-06-01 08:00", false, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			until, inside := window(t, c.start, c.end).Until(at(t, c.zone, c.now), Zone(c.zone))
			require.Equal(t, c.inside, inside)
			if c.inside {
				require.Equal(t, c.until, until.UTC().Format(time.RFC3339))
			}
		})
	}
}

// TestQuietHoursInTheRepeatedHour: an hour that happens twice is quiet
// both times when it is inside the window.
func TestQuietHoursInTheRepeatedHour(t *testing.T) {
	loc := Zone("Europe/Berlin")
	w := window(t, "02:00", "02:45")
	first := time.Date(2026, 10, 25, 0, 15, 0, 0, time.UTC)  // 02:15 CEST
	second := time.Date(2026, 10, 25, 1, 15, 0, 0, time.UTC) // 02:15 CET
	until, inside := w.Until(first, loc)
	require.True(t, inside)
	require.Equal(t, time.Date(2026, 10, 25, 0, 45, 0, 0, time.UTC), until.UTC())
	// The second 02:15: the window's end (02:45) happened first at 00:45
	// UTC, behind now, so the second time round it ends at once.
	_, inside = w.Until(second, loc)
	require.False(t, inside)
}

func TestDecide(t *testing.T) {
	now := time.Date(2026, 6, 1, 23, 0, 0, 0, time.UTC)
	expires := now.Add(12 * time.Hour)
	night := window(t, "22:00", "07:00")
	morning := time.Date(2026, 6, 2, 7, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		name    string
		rule    Rule
		user    User
		expires time.Time
		want    Decision
	}{
		{"nothing", Rule{Mode: QuietHold}, User{}, expires, Decision{}},
		{"opted out", Rule{Mode: QuietHold}, User{OptedOut: true}, expires, Decision{Verdict: OptedOut}},
		{"own quiet hours hold", Rule{Mode: QuietHold}, User{Quiet: night, Own: true}, expires, Decision{Verdict: Held, Until: morning}},
		{"own quiet hours skip", Rule{Mode: QuietSkip}, User{Quiet: night, Own: true}, expires, Decision{Verdict: Skipped}},
		{"held past expiry", Rule{Mode: QuietHold}, User{Quiet: night, Own: true}, now.Add(time.Hour), Decision{Verdict: Expired}},
		{"default quiet hours", Rule{Mode: QuietHold, Default: night, HasDefault: true}, User{}, expires, Decision{Verdict: Held, Until: morning}},
		{"own none over the default", Rule{Mode: QuietHold, Default: night, HasDefault: true}, User{Quiet: Window{}, Own: true}, expires, Decision{}},
		{"default's zone", Rule{Mode: QuietHold, Default: night, HasDefault: true, DefaultZone: "Asia/Tokyo"}, User{}, expires, Decision{}},
		{"user's zone over the default's", Rule{Mode: QuietHold, Default: night, HasDefault: true, DefaultZone: "Asia/Tokyo"}, User{Zone: "UTC"}, expires, Decision{Verdict: Held, Until: morning}},
		{"critical", Rule{Mode: QuietHold, Critical: true, Default: night, HasDefault: true}, User{OptedOut: true, Quiet: night, Own: true}, expires, Decision{}},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := Decide(c.rule, c.user, now, c.expires)
			require.Equal(t, c.want.Verdict, got.Verdict)
			require.True(t, c.want.Until.Equal(got.Until), "until %v, want %v", got.Until, c.want.Until)
		})
	}
}

func TestSettingsCheck(t *testing.T) {
	s := Settings{OptOuts: []OptOut{{Category: "news", Channel: "webpush"}, {Category: "marketing"}, {Category: "news", Channel: "webpush"}}}
	require.NoError(t, s.Check())
	require.Equal(t, []OptOut{{Category: "marketing"}, {Category: "news", Channel: "webpush"}}, s.OptOuts)
	require.Equal(t, []string{"marketing", "news:webpush"}, s.Stored())
	require.Equal(t, s.OptOuts, OptOutsOf(s.Stored()))

	var fe *FieldError
	bad := Settings{OptOuts: []OptOut{{Category: "Marketing"}}}
	require.ErrorAs(t, bad.Check(), &fe)
	require.Equal(t, "opt_outs[0].category", fe.Field)
	bad = Settings{OptOuts: []OptOut{{Category: "news", Channel: "sms"}}}
	require.ErrorAs(t, bad.Check(), &fe)
	require.Equal(t, "opt_outs[0].channel", fe.Field)
	bad = Settings{QuietHours: &QuietHours{Start: "22:00", End: "7:00"}}
	require.ErrorAs(t, bad.Check(), &fe)
	require.Equal(t, "quiet_hours", fe.Field)
	bad = Settings{QuietHours: &QuietHours{Start: "24:00", End: "07:00"}}
	require.Error(t, bad.Check())
}
