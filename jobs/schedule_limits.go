package jobs

import (
	"cmp"
	"fmt"
	"time"
)

const (
	// scheduleCheckSpan is how far past its first run a schedule's runs are
	// examined at creation: a week catches every weekday's pattern, and
	// since every matching day of a cron has the same times, starting at
	// the first run catches a dense day (every minute on the 1st) however
	// far off it is.
	scheduleCheckSpan = 8 * 24 * time.Hour
)

// ScheduleLimits bound what schedules may cost: how often one runs, how
// many of its runs wait as messages made ahead, and how many schedules
// there are. Zero fields take the defaults (WithDefaults).
type ScheduleLimits struct {
	// MinInterval is the least time between two runs (HERALD_SCHEDULE_MIN_INTERVAL).
	MinInterval time.Duration
	// MaxAhead is how many runs of a schedule may be made into messages
	// that have not started (HERALD_SCHEDULE_MAX_AHEAD). The materializer
	// makes no more, and catches up as they start.
	MaxAhead int
	// MaxSchedules is how many live (not deleted) schedules there may be
	// (HERALD_MAX_SCHEDULES): creating one more is refused.
	MaxSchedules int
}

// WithDefaults fills the zero fields with the defaults, in this one place.
func (l ScheduleLimits) WithDefaults() ScheduleLimits {
	l.MinInterval = cmp.Or(l.MinInterval, DefaultScheduleMinInterval)
	l.MaxAhead = cmp.Or(l.MaxAhead, DefaultScheduleMaxAhead)
	l.MaxSchedules = cmp.Or(l.MaxSchedules, DefaultMaxSchedules)
	return l
}

// Validate refuses limits that cannot be met.
func (l ScheduleLimits) Validate() error {
	if l.MinInterval < 0 {
		return fmt.Errorf("ScheduleLimits.MinInterval is %s; it must not be negative", l.MinInterval)
	}
	if l.MaxAhead < 1 {
		return fmt.Errorf("ScheduleLimits.MaxAhead is %d; it must be at least 1", l.MaxAhead)
	}
	if l.MaxSchedules < 1 {
		return fmt.Errorf("ScheduleLimits.MaxSchedules is %d; it must be at least 1", l.MaxSchedules)
	}
	return nil
}

// Check refuses a schedule whose runs come closer together than
// MinInterval, or, in local time, whose runs made at once (those within
// lead plus 26 hours) would be more than MaxAhead: the materializer would
// then make the last of them late for their easternmost recipients. It
// examines the runs from the first at or after from through eight days
// later (and, in local time, one window more).
func (l ScheduleLimits) Check(c *Cron, localTime bool, lead time.Duration, from time.Time) error {
	l = l.WithDefaults()
	first, ok := c.Next(from.Add(-time.Nanosecond))
	if !ok {
		return nil
	}
	window := cmp.Or(lead, DefaultScheduleLead) + localTimeSpread
	end := first.Add(scheduleCheckSpan)
	if localTime {
		end = end.Add(window)
	}
	runs := []time.Time{first}
	for prev := first; ; {
		next, ok := c.Next(prev)
		if !ok || next.After(end) {
			break
		}
		if gap := next.Sub(prev); gap < l.MinInterval {
			return fmt.Errorf("runs would come %s apart (at %s and %s); a schedule may run at most once every %s",
				gap, prev.UTC().Format(time.RFC3339), next.UTC().Format(time.RFC3339), l.MinInterval)
		}
		runs = append(runs, next)
		prev = next
	}
	if !localTime {
		return nil
	}
	// The most runs inside any window that starts at a run.
	j := 0
	for i := range runs {
		for j < len(runs) && runs[j].Sub(runs[i]) < window {
			j++
		}
		if n := j - i; n > l.MaxAhead {
			return fmt.Errorf("in local time a schedule's runs of the next %s are made at once, and this one would have %d of them from %s; at most %d may wait at once, so run it less often",
				window.Round(time.Minute), n, runs[i].UTC().Format(time.RFC3339), l.MaxAhead)
		}
	}
	return nil
}
