package jobs

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/robfig/cron/v3"

	"github.com/heraldpush/herald/jobs/wallclock"
)

// cronSearchYears bounds the search for a schedule's next run: a spec that
// matches nothing in that long (30 February) has no next run.
const cronSearchYears = 8

// Cron is a cron expression evaluated by wall-clock time in one zone: a
// 09:00 schedule runs at 09:00 local on both sides of a DST change. robfig/cron
// parses the expression (five fields, or @daily-style descriptors); the
// search for the next run is Herald's own, because the rules at the edges
// of DST are the contract's:
//   - a wall time that does not exist (spring forward) runs at the first
//     instant after the gap;
//   - a wall time that happens twice (fall back) runs once, at the first.
type Cron struct {
	expr string
	spec *cron.SpecSchedule
	loc  *time.Location
}

var cronParser = cron.NewParser(cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)

// ParseCron parses expr for zone loc.
func ParseCron(expr string, loc *time.Location) (*Cron, error) {
	if strings.HasPrefix(strings.TrimSpace(expr), "@every") {
		return nil, errors.New("@every is not a calendar schedule; use five cron fields or @hourly, @daily, @weekly, @monthly, @yearly")
	}
	if strings.Contains(expr, "TZ=") {
		return nil, errors.New("give the zone in timezone, not in the expression")
	}
	s, err := cronParser.Parse(expr)
	if err != nil {
		return nil, err
	}
	spec, ok := s.(*cron.SpecSchedule)
	if !ok {
		return nil, fmt.Errorf("%q is not a calendar schedule", expr)
	}
	return &Cron{expr: expr, spec: spec, loc: loc}, nil
}

// ScheduleCron parses a stored schedule's expression in its zone.
func ScheduleCron(expr, zone string) (*Cron, error) {
	loc, err := time.LoadLocation(zone)
	if err != nil {
		return nil, fmt.Errorf("zone %q: %w", zone, err)
	}
	c, err := ParseCron(expr, loc)
	if err != nil {
		return nil, fmt.Errorf("cron %q: %w", expr, err)
	}
	return c, nil
}

// Location is the zone the expression is evaluated in.
func (c *Cron) Location() *time.Location { return c.loc }

// wall is a wall-clock time (wallclock.Wall).
type wall = wallclock.Wall

// Next returns the first run strictly after t, and false when there is none
// within cronSearchYears.
func (c *Cron) Next(t time.Time) (time.Time, bool) {
	after := wallclock.Of(t, c.loc)
	day := time.Date(after.Year(), after.Month(), after.Day(), 0, 0, 0, 0, time.UTC)
	end := day.AddDate(cronSearchYears, 0, 0)
	// On the first day the search starts at after's hour and minute: the
	// wall times before them are not after it, and skipping them keeps a
	// minutely schedule's next run one step away rather than a day's
	// minutes (ScheduleLimits.Check walks eight days of runs).
	fromHour, fromMinute := after.Hour(), after.Minute()
	for ; day.Before(end); day, fromHour, fromMinute = day.AddDate(0, 0, 1), 0, 0 {
		if 1<<uint(day.Month())&c.spec.Month == 0 || !c.dayMatches(day) {
			continue
		}
		for h := fromHour; h < 24; h++ {
			if 1<<uint(h)&c.spec.Hour == 0 {
				continue
			}
			m := 0
			if h == fromHour {
				m = fromMinute
			}
			for ; m < 60; m++ {
				if 1<<uint(m)&c.spec.Minute == 0 {
					continue
				}
				w := day.Add(time.Duration(h)*time.Hour + time.Duration(m)*time.Minute)
				if !w.After(after) {
					continue
				}
				run := wallclock.Instant(w, c.loc)
				// A wall time inside a gap runs at the gap's end, which may
				// not be after t when t is itself that instant.
				if run.After(t) {
					return run, true
				}
			}
		}
	}
	return time.Time{}, false
}

// dayMatches is cron's day rule: when both day of month and day of week are
// restricted, either may match; when one is *, both must.
func (c *Cron) dayMatches(day wall) bool {
	const starBit = 1 << 63
	dom := 1<<uint(day.Day())&c.spec.Dom > 0
	dow := 1<<uint(day.Weekday())&c.spec.Dow > 0
	if c.spec.Dom&starBit > 0 || c.spec.Dow&starBit > 0 {
		return dom && dow
	}
	return dom || dow
}

// NextRun is a schedule's first run strictly after t: not after endsAt
// (when set), and early enough that its message, which lasts span after it
// (RunSpan), ends by LatestInstant. Runs only move later, so a run past
// either bound means there is no next run.
func (c *Cron) NextRun(t time.Time, endsAt *time.Time, span time.Duration) (time.Time, bool) {
	next, ok := c.Next(t)
	if !ok || (endsAt != nil && next.After(*endsAt)) || next.Add(span).After(LatestInstant) {
		return time.Time{}, false
	}
	return next, true
}

// NextRuns lists up to n runs after t, bounded as NextRun bounds them.
func (c *Cron) NextRuns(t time.Time, n int, endsAt *time.Time, span time.Duration) []time.Time {
	var out []time.Time
	for len(out) < n {
		next, ok := c.NextRun(t, endsAt, span)
		if !ok {
			break
		}
		out = append(out, next)
		t = next
	}
	return out
}
