package jobs

import (
	"fmt"
	"strings"
	"time"
	"unicode/utf8"
)

// The rules of a message, the same for POST /v1/messages and for
// Scheduler.Schedule.
const (
	// MaxLifetime is the longest a message may live: APNs, FCM and Web
	// Push services keep a push for at most four weeks, so a later expiry
	// would promise what none of them keeps.
	MaxLifetime = 28 * 24 * time.Hour
	// MaxIdempotencyKey is the longest idempotency key, in bytes.
	MaxIdempotencyKey = 255
	// maxIDLen bounds caller-chosen ids (users, segments).
	maxIDLen = 128
)

// InvalidError is a message that breaks a rule. Field names the one field to
// blame as POST /v1/messages' body names it (priority, audience.ids[3],
// payload.title, expires_at...), which Message's fields mirror.
type InvalidError struct {
	Field, Message string
	// Err is the cause, when there is one: ErrUnknownSegment, or a
	// *push.SizeError for a payload too large for the providers.
	Err error
}

func (e *InvalidError) Error() string { return e.Field + ": " + e.Message }

func (e *InvalidError) Unwrap() error { return e.Err }

func invalid(field, format string, args ...any) *InvalidError {
	return &InvalidError{Field: field, Message: fmt.Sprintf(format, args...)}
}

// maxTTLSeconds is the longest ttl_seconds.
const maxTTLSeconds = int(MaxLifetime / time.Second)

// CheckText refuses a string PostgreSQL cannot store: one that is not UTF-8,
// or holds the NUL character.
func CheckText(field, s string) error {
	if !utf8.ValidString(s) || strings.ContainsRune(s, 0) {
		return invalid(field, "%s must be UTF-8 without the NUL character", field)
	}
	return nil
}

// CheckID validates a caller-chosen id (a user's, a segment's): 1 to 128
// characters from a set that is safe in a URL path without escaping.
func CheckID(field, id string) error {
	if id == "" {
		return invalid(field, "%s is required", field)
	}
	if len(id) > maxIDLen {
		return invalid(field, "%s is longer than %d characters", field, maxIDLen)
	}
	for _, r := range id {
		ok := r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' ||
			strings.ContainsRune("_-.:@+=", r)
		if !ok {
			return invalid(field, "%s may hold only letters, digits and _-.:@+= (found %q)", field, r)
		}
	}
	return nil
}

// CheckTimezone validates an IANA zone name. The binary embeds the zone
// database, so the answer does not depend on the host.
func CheckTimezone(field, name string) error {
	// LoadLocation reads "" as UTC and "Local" as the host's zone; neither is
	// a zone a caller can mean.
	if name == "" || name == "Local" {
		return invalid(field, "%s must be an IANA time zone name such as Europe/Berlin", field)
	}
	if _, err := time.LoadLocation(name); err != nil {
		return invalid(field, "%s %q is not a known IANA time zone", field, name)
	}
	return nil
}
