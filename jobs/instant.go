package jobs

import "time"

// Every instant Herald stores lies in years 1970 to 9999, in UTC. The API
// writes instants in RFC 3339, whose years have four digits: a later instant
// could be stored (PostgreSQL's go on to year 294276) but never shown again,
// since encoding/json refuses to write it, and one stored row like that
// would break every listing it is part of. Nothing Herald sends is due
// before 1970.
var (
	// EarliestInstant is the first instant Herald stores.
	EarliestInstant = time.Date(1970, 1, 1, 0, 0, 0, 0, time.UTC)
	// LatestInstant is the last instant Herald stores.
	LatestInstant = time.Date(9999, 12, 31, 23, 59, 59, 999_999_999, time.UTC)
)

// InstantInRange reports whether t lies from EarliestInstant to
// LatestInstant.
func InstantInRange(t time.Time) bool {
	return !t.Before(EarliestInstant) && !t.After(LatestInstant)
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
