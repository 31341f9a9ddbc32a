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

// CheckInstant refuses an instant outside the years Herald stores
// (InstantInRange). An offset can carry a timestamp written in year 9999
// into year 10000, so the bound is on the instant, not the text.
func CheckInstant(field string, t time.Time) error {
	if !InstantInRange(t) {
		return invalid(field, "%s is %s, outside the years 1970 to 9999 UTC that Herald stores and shows", field, t.UTC().Format(time.RFC3339))
	}
	return nil
}
