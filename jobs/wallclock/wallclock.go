// Package wallclock is the arithmetic of wall-clock times in a zone, with
// the rules Herald keeps at the edges of daylight saving time wherever it
// turns a wall time into an instant (a cron schedule's run, the end of a
// user's quiet hours):
//   - a wall time that does not exist (spring forward) is the first instant
//     after the gap;
//   - a wall time that happens twice (fall back) is the first of the two.
package wallclock

import "time"

// Wall is a wall-clock time, held as a time in UTC so that arithmetic on it
// knows nothing of any zone's transitions.
type Wall = time.Time

// Of is the wall time loc's clocks show at t.
func Of(t time.Time, loc *time.Location) Wall {
	l := t.In(loc)
	return time.Date(l.Year(), l.Month(), l.Day(), l.Hour(), l.Minute(), l.Second(), 0, time.UTC)
}

// Instant is the instant at which loc's clocks show w: the first of two
// when w happens twice, and the first instant after the gap when w does not
// happen at all.
func Instant(w Wall, loc *time.Location) time.Time {
	t := time.Date(w.Year(), w.Month(), w.Day(), w.Hour(), w.Minute(), w.Second(), 0, loc)
	if Of(t, loc).Equal(w) {
		// Twice? The earlier instant is up to two hours before (DST shifts
		// are 30 minutes to 2 hours).
		for _, back := range []time.Duration{2 * time.Hour, time.Hour, 30 * time.Minute} {
			if e := t.Add(-back); Of(e, loc).Equal(w) {
				return e
			}
		}
		return t
	}
	// In a gap: the first instant whose wall time is at or after w. Wall
	// time only moves forward across a spring-forward transition, so a
	// binary search over the surrounding hours finds it.
	lo, hi := t.Add(-3*time.Hour), t.Add(3*time.Hour)
	for hi.Sub(lo) > time.Second {
		mid := lo.Add(hi.Sub(lo) / 2)
		if Of(mid, loc).Before(w) {
			lo = mid
		} else {
			hi = mid
		}
	}
	return hi.Truncate(time.Second)
}
