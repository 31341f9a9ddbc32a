package jobs

import (
	"fmt"
	"time"

	"github.com/heraldpush/herald/db"
	"github.com/heraldpush/herald/jobs/wallclock"
)

// LocalDelivery is delivery at a wall time in each recipient's own zone
// (deliver_at_local in the API).
type LocalDelivery struct {
	// Wall is the date and wall time; its location is ignored.
	Wall time.Time
	// FallbackTimezone is the IANA zone of recipients without one; empty
	// means UTC.
	FallbackTimezone string
	// SendIfPassed sends at once to recipients whose wall time has passed
	// (if_passed send_now); otherwise their deliveries end expired.
	SendIfPassed bool
	// TTL is each wave's lifetime, whole seconds from one to MaxLifetime;
	// zero means DefaultLifetime.
	TTL time.Duration
}

func (l *LocalDelivery) check() error {
	if l.FallbackTimezone == "" {
		l.FallbackTimezone = "UTC"
	}
	if err := CheckTimezone("fallback_timezone", l.FallbackTimezone); err != nil {
		return err
	}
	if l.TTL == 0 {
		l.TTL = DefaultLifetime
	}
	if l.TTL < time.Second || l.TTL > MaxLifetime || l.TTL%time.Second != 0 {
		return invalid("ttl_seconds", "ttl_seconds must be from 1 to %d", maxTTLSeconds)
	}
	l.Wall = time.Date(l.Wall.Year(), l.Wall.Month(), l.Wall.Day(), l.Wall.Hour(), l.Wall.Minute(), l.Wall.Second(), 0, time.UTC)
	// Every zone's wave and its lifetime must fall within the instants
	// Herald stores, whoever turns out to be in the audience.
	if first, last := LocalWindow(l.Wall, l.TTL); !InstantInRange(first) || !InstantInRange(last) {
		earliest := EarliestInstant.Add(first.Sub(l.Wall).Abs())
		latest := LatestInstant.Add(-last.Sub(l.Wall)).Truncate(time.Minute)
		return invalid("deliver_at_local", "deliver_at_local must be from %s to %s, so that every zone's wave and its lifetime lie in years 1970 to 9999 UTC",
			earliest.Format(WallLayout), latest.Format(WallLayout))
	}
	return nil
}

// WallLayout is how a wall time is written (deliver_at_local); seconds may
// follow.
const WallLayout = "2006-01-02T15:04"

// LocalTime is per-recipient local-time delivery: each device is due when
// its user's clocks show Wall.
type LocalTime struct {
	// Wall is the wall time, as a time in UTC (its zone is ignored).
	Wall time.Time
	// Fallback is the zone of users without one.
	Fallback *time.Location
	// SendNow sends at Now to users whose Wall has passed; otherwise
	// (if_passed skip) their deliveries end expired.
	SendNow bool
	// Now is the database's time when the message was made.
	Now time.Time
	// Lifetime is each wave's time to live.
	Lifetime time.Duration
	// JSON is the request's local-time part, kept on the message.
	JSON []byte
}

// place gives each zone of the audience ("" for users without one, who
// take Fallback) its wave: the instant its clocks show Wall, or passed when
// that instant is before Now (unless SendNow, which makes it due at Now).
func (lt *LocalTime) place(zones []string, plan *db.Expansion) error {
	wall := time.Date(lt.Wall.Year(), lt.Wall.Month(), lt.Wall.Day(), lt.Wall.Hour(), lt.Wall.Minute(), lt.Wall.Second(), 0, time.UTC)
	for _, zone := range zones {
		loc := lt.Fallback
		if zone != "" {
			var err error
			if loc, err = time.LoadLocation(zone); err != nil {
				return fmt.Errorf("zone %q of a recipient: %w", zone, err)
			}
		}
		due, passed := wallclock.Instant(wall, loc), false
		if due.Before(lt.Now) {
			if lt.SendNow {
				due = lt.Now
			} else {
				passed = true
			}
		}
		plan.Zones, plan.DueAts, plan.Passed = append(plan.Zones, zone), append(plan.DueAts, due), append(plan.Passed, passed)
	}
	return nil
}

// firstWave is the earliest wave still to send, which the message shows
// as its dispatch_at; the earliest passed one when nothing is left to send,
// and Now when the audience is empty.
func (lt *LocalTime) firstWave(plan db.Expansion) time.Time {
	return lt.wave(plan, func(a, b time.Time) bool { return a.Before(b) })
}

// lastWave is the latest wave still to send; the latest passed one when
// nothing is left to send, and Now when the audience is empty.
func (lt *LocalTime) lastWave(plan db.Expansion) time.Time {
	return lt.wave(plan, func(a, b time.Time) bool { return a.After(b) })
}

// wave is the wave that comes first by better among those to send, or
// among the passed ones when none is.
func (lt *LocalTime) wave(plan db.Expansion, better func(a, b time.Time) bool) time.Time {
	for _, passed := range []bool{false, true} {
		var found time.Time
		for i, due := range plan.DueAts {
			if plan.Passed[i] == passed && (found.IsZero() || better(due, found)) {
				found = due
			}
		}
		if !found.IsZero() {
			return found
		}
	}
	return lt.Now
}

// Zones' offsets from UTC run from -12 to +14 hours: a wall time is reached
// first where clocks are 14 hours ahead and last where they are 12 behind.
const (
	mostAhead  = 14 * time.Hour
	mostBehind = 12 * time.Hour
	// localTimeSpread is how far apart the first and the last zone reach
	// the same wall time, and so how much earlier a local-time schedule run
	// is made: a schedule's own zone lies anywhere in between.
	localTimeSpread = mostAhead + mostBehind
)

// LocalWindow bounds a local-time delivery at wall (a wall time, its zone
// ignored) whose waves live for lifetime each: no wave is due before first,
// and none expires after last.
func LocalWindow(wall time.Time, lifetime time.Duration) (first, last time.Time) {
	w := time.Date(wall.Year(), wall.Month(), wall.Day(), wall.Hour(), wall.Minute(), wall.Second(), wall.Nanosecond(), time.UTC)
	return w.Add(-mostAhead), w.Add(mostBehind + lifetime)
}

// RunSpan is how long after its instant a schedule run's message may last:
// its lifetime, and for a local-time run the time the last zone takes to
// reach the run's wall time too.
func RunSpan(ttl time.Duration, localTime bool) time.Duration {
	if localTime {
		return localTimeSpread + ttl
	}
	return ttl
}
