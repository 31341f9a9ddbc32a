package preferences

import (
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5/pgtype"
)

// Channels are the channels an opt-out may name.
var Channels = []string{"apns", "fcm", "webpush"}

// MaxOptOuts bounds a user's opt-outs.
const MaxOptOuts = 200

// OptOut is a user's opting out of a category, on every channel (Channel
// empty) or on one.
type OptOut struct {
	Category string `json:"category"`
	Channel  string `json:"channel,omitempty"`
}

// QuietHours are quiet hours as the API spells them: wall times "HH:MM".
type QuietHours struct {
	Start string `json:"start"`
	End   string `json:"end"`
}

// Window is q as a Window; q is checked (Settings.Check).
func (q QuietHours) Window() (Window, error) {
	start, err := ParseClock(q.Start)
	if err != nil {
		return Window{}, fmt.Errorf("start: %w", err)
	}
	end, err := ParseClock(q.End)
	if err != nil {
		return Window{}, fmt.Errorf("end: %w", err)
	}
	return Window{Start: start, End: end}, nil
}

// QuietHoursOf is w as the API spells it.
func QuietHoursOf(w Window) QuietHours {
	return QuietHours{Start: w.Start.String(), End: w.End.String()}
}

// Settings are what a user may set: opt-outs and quiet hours (nil: the
// installation's; equal start and end: none). The API takes them from the
// caller's backend and from the user's own form alike.
type Settings struct {
	OptOuts    []OptOut    `json:"opt_outs"`
	QuietHours *QuietHours `json:"quiet_hours"`
}

// FieldError is a setting that breaks a rule: the field's JSON path and
// what is wrong with it.
type FieldError struct {
	Field, Problem string
}

func (e *FieldError) Error() string { return e.Field + ": " + e.Problem }

// Check holds s to the rules and puts its opt-outs in one order, without
// repeats; the first broken rule is a *FieldError.
func (s *Settings) Check() error {
	if len(s.OptOuts) > MaxOptOuts {
		return &FieldError{"opt_outs", fmt.Sprintf("at most %d opt-outs", MaxOptOuts)}
	}
	for i, o := range s.OptOuts {
		if err := CheckCategory(o.Category); err != nil {
			return &FieldError{fmt.Sprintf("opt_outs[%d].category", i), err.Error()}
		}
		if o.Channel != "" && !slices.Contains(Channels, o.Channel) {
			return &FieldError{fmt.Sprintf("opt_outs[%d].channel", i), fmt.Sprintf("%q is not one of %s", o.Channel, strings.Join(Channels, ", "))}
		}
	}
	slices.SortFunc(s.OptOuts, func(a, b OptOut) int {
		return strings.Compare(a.Category+":"+a.Channel, b.Category+":"+b.Channel)
	})
	s.OptOuts = slices.Compact(s.OptOuts)
	if s.OptOuts == nil {
		s.OptOuts = []OptOut{}
	}
	if s.QuietHours != nil {
		if _, err := s.QuietHours.Window(); err != nil {
			return &FieldError{"quiet_hours", err.Error()}
		}
	}
	return nil
}

// Stored is s as user_preferences holds its opt-outs: "category" or
// "category:channel" (migration 0024).
func (s Settings) Stored() []string {
	out := make([]string, len(s.OptOuts))
	for i, o := range s.OptOuts {
		out[i] = o.Category
		if o.Channel != "" {
			out[i] += ":" + o.Channel
		}
	}
	return out
}

// StoredQuietHours is s's quiet hours as user_preferences holds them: NULL
// for the installation's.
func (s Settings) StoredQuietHours() (start, end pgtype.Time, err error) {
	if s.QuietHours == nil {
		return pgtype.Time{}, pgtype.Time{}, nil
	}
	w, err := s.QuietHours.Window()
	if err != nil {
		return pgtype.Time{}, pgtype.Time{}, &FieldError{Field: "quiet_hours", Problem: err.Error()}
	}
	start, end = w.PG()
	return start, end, nil
}

// OptOutsOf reads stored opt-outs back.
func OptOutsOf(stored []string) []OptOut {
	out := make([]OptOut, 0, len(stored))
	for _, s := range stored {
		category, channel, _ := strings.Cut(s, ":")
		out = append(out, OptOut{Category: category, Channel: channel})
	}
	return out
}
