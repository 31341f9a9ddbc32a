// Package preferences is what the people reminded are owed, decided when a
// delivery is sent (docs/preferences.md): a message's category, which may
// be critical or capped; each user's opt-outs, of a category or of a
// category on one channel; and quiet hours, the user's own or the
// installation's, in the user's zone, during which a delivery is held to
// the window's end or skipped, as its message asks.
//
// The chunk worker (jobs.FanOutWorker) reads a chunk's rule (Rule) and each
// device's user's preferences (User) in the round trip that begins the
// chunk, asks Decide of each delivery, and claims the cap's places
// (db.ClaimFrequencyCaps) for those it will send.
package preferences

import (
	"errors"
	"fmt"
	"regexp"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/heraldpush/herald/jobs/wallclock"
)

// DefaultCategory is a message's category when it names none.
const DefaultCategory = "default"

// Quiet-hours modes: what a message asks of a delivery due inside its
// user's quiet hours.
const (
	QuietHold = "hold"
	QuietSkip = "skip"
)

var categoryName = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,62}$`)

// CheckCategory says what is wrong with a category's name, nil when
// nothing is.
func CheckCategory(name string) error {
	if !categoryName.MatchString(name) {
		return errors.New("must be 1 to 63 characters of a-z, 0-9, '.', '_' and '-', starting with a letter or a digit")
	}
	return nil
}

// CheckQuietMode says what is wrong with a message's quiet-hours mode.
func CheckQuietMode(mode string) error {
	if mode != QuietHold && mode != QuietSkip {
		return fmt.Errorf("must be %q or %q", QuietHold, QuietSkip)
	}
	return nil
}

// Clock is a wall time of day, seconds after midnight.
type Clock int32

// ParseClock reads "HH:MM" (00:00 to 23:59).
func ParseClock(s string) (Clock, error) {
	t, err := time.Parse("15:04", s)
	if err != nil || len(s) != 5 {
		return 0, fmt.Errorf("%q is not a time of day as HH:MM (00:00 to 23:59)", s)
	}
	return Clock(t.Hour()*3600 + t.Minute()*60), nil
}

// String is c as HH:MM.
func (c Clock) String() string { return fmt.Sprintf("%02d:%02d", c/3600, c%3600/60) }

// PG is c as PostgreSQL's time.
func (c Clock) PG() pgtype.Time { return pgtype.Time{Microseconds: int64(c) * 1e6, Valid: true} }

// clockOf is a PostgreSQL time as a Clock.
func clockOf(t pgtype.Time) Clock { return Clock(t.Microseconds / 1e6) }

// Window is quiet hours: from Start to End, wall times in a zone, across
// midnight when End is before Start. A window whose ends are equal is
// empty: no quiet hours.
type Window struct {
	Start, End Clock
}

// WindowOf is quiet hours as PostgreSQL keeps them (user_preferences,
// quiet_hours_default: migration 0024); ok is false when there are none
// (NULL).
func WindowOf(start, end pgtype.Time) (w Window, ok bool) {
	return Window{Start: clockOf(start), End: clockOf(end)}, start.Valid
}

// PG is w as PostgreSQL keeps it.
func (w Window) PG() (start, end pgtype.Time) { return w.Start.PG(), w.End.PG() }

// Empty says the window holds no time.
func (w Window) Empty() bool { return w.Start == w.End }

// contains says whether the time of day c is inside w: at or after its
// start and before its end.
func (w Window) contains(c Clock) bool {
	if w.Start < w.End {
		return c >= w.Start && c < w.End
	}
	return c >= w.Start || c < w.End
}

// Until says whether now falls in w in zone loc and, when it does, the
// instant the window ends: the next time loc's clocks show End, by the
// rules at the edges of daylight saving time that cron keeps (wallclock):
// an end inside a spring-forward gap ends at the gap's end, one that
// happens twice at the first of the two. now's own wall time decides
// whether it is inside: an hour that happens twice is quiet both times.
func (w Window) Until(now time.Time, loc *time.Location) (end time.Time, inside bool) {
	if w.Empty() {
		return time.Time{}, false
	}
	wall := wallclock.Of(now, loc)
	tod := Clock(wall.Hour()*3600 + wall.Minute()*60 + wall.Second())
	if !w.contains(tod) {
		return time.Time{}, false
	}
	day := time.Date(wall.Year(), wall.Month(), wall.Day(), 0, 0, 0, 0, time.UTC)
	if tod >= w.End {
		// Inside, past the end's time of day: the window ends tomorrow.
		day = day.AddDate(0, 0, 1)
	}
	end = wallclock.Instant(day.Add(time.Duration(w.End)*time.Second), loc)
	if !end.After(now) {
		// An end that happens twice, whose first instant is behind now
		// (now is in the repeated hour, after it): the window ends now.
		return now, false
	}
	return end, true
}

var zones sync.Map // zone name → *time.Location

// Zone is the location named name, UTC when it names none (a zone the
// API checked may still be unknown to an older tzdata). Locations are
// loaded once a process.
func Zone(name string) *time.Location {
	if name == "" || name == "UTC" {
		return time.UTC
	}
	if l, ok := zones.Load(name); ok {
		return l.(*time.Location)
	}
	l, err := time.LoadLocation(name)
	if err != nil {
		l = time.UTC
	}
	zones.Store(name, l)
	return l
}

// Rule is what a chunk needs of its message and category: the category,
// whether it is critical, its cap (Count 0 for none), the message's
// quiet-hours mode, and the installation's default quiet hours and the
// zone of users who have none.
type Rule struct {
	Category string
	Critical bool
	CapCount int32
	CapS     int32
	Mode     string
	// Default is the installation's quiet hours (HasDefault false: none).
	Default     Window
	HasDefault  bool
	DefaultZone string
}

// Capped says whether the category has a cap.
func (r Rule) Capped() bool { return !r.Critical && r.CapCount > 0 }

// User is what a delivery's user asked, as the chunk read it: opted out of
// the message's category (on every channel or the device's), the user's
// own quiet hours (Quiet, when Own) and zone.
type User struct {
	OptedOut bool
	Quiet    Window
	Own      bool
	Zone     string
}

// Verdict is what Decide makes of a delivery.
type Verdict int

const (
	// Send: nothing holds it back (a cap, if any, is claimed next).
	Send Verdict = iota
	// OptedOut: cancelled, its user opted out.
	OptedOut
	// Skipped: cancelled, due in its user's quiet hours and its message
	// asks to skip.
	Skipped
	// Held: pending until the quiet hours end (Decision.Until).
	Held
	// Expired: due in quiet hours that end after its message expires.
	Expired
)

// Decision is a Verdict, and for Held the instant the hold ends.
type Decision struct {
	Verdict Verdict
	Until   time.Time
}

// Decide is what rule and user make of a delivery at now (the database's
// clock) whose message expires at expiresAt. A critical category is never
// withheld.
func Decide(rule Rule, user User, now, expiresAt time.Time) Decision {
	if rule.Critical {
		return Decision{}
	}
	if user.OptedOut {
		return Decision{Verdict: OptedOut}
	}
	window, zone := rule.Default, user.Zone
	if user.Own {
		window = user.Quiet
	} else if !rule.HasDefault {
		return Decision{}
	}
	if zone == "" {
		zone = rule.DefaultZone
	}
	end, inside := window.Until(now, Zone(zone))
	switch {
	case !inside:
		return Decision{}
	case rule.Mode == QuietSkip:
		return Decision{Verdict: Skipped}
	case !end.Before(expiresAt):
		return Decision{Verdict: Expired}
	}
	return Decision{Verdict: Held, Until: end}
}
