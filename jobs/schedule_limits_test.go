package jobs

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestScheduleLimitsCheck(t *testing.T) {
	t.Parallel()
	from := time.Date(2026, 3, 5, 12, 0, 0, 0, time.UTC)
	every5 := ScheduleLimits{MinInterval: 5 * time.Minute}
	hourly := ScheduleLimits{MinInterval: time.Hour}
	tests := []struct {
		name      string
		cron      string
		zone      string
		localTime bool
		limits    ScheduleLimits
		from      time.Time
		refused   string // a part of the error; empty when taken
	}{
		{"every minute", "* * * * *", "UTC", false, ScheduleLimits{}, from, ""},
		{"every minute under a 5m minimum", "* * * * *", "UTC", false, every5, from, "1m0s apart"},
		{"two runs close once a day", "0,2 9 * * *", "UTC", false, every5, from, "2m0s apart"},
		{"a dense day weeks off", "* 3 1 * *", "UTC", false, every5, from, "1m0s apart"},
		{"never runs", "0 0 30 2 *", "UTC", false, every5, from, ""},
		// 01:30 EST, then 02:30, which does not exist on 8 March and runs
		// at 03:00 EDT: half an hour later.
		{"closer across spring forward", "30 1,2 * * *", "America/New_York", false, hourly, from, "30m0s apart"},
		{"spring forward out of sight", "30 1,2 * * *", "America/New_York", false, hourly, from.AddDate(0, 1, 0), ""},
		{"local every quarter hour", "*/15 * * * *", "UTC", true, ScheduleLimits{}, from, ""},
		{"local every ten minutes", "*/10 * * * *", "UTC", true, ScheduleLimits{}, from, "would have 157"},
		{"local every minute", "* * * * *", "Europe/Berlin", true, ScheduleLimits{}, from, "at most 120 may wait"},
		{"local hourly under a cap of 30", "0 * * * *", "UTC", true, ScheduleLimits{MaxAhead: 30}, from, ""},
		{"local half-hourly under a cap of 30", "*/30 * * * *", "UTC", true, ScheduleLimits{MaxAhead: 30}, from, "would have 53"},
		{"the cap is for local time only", "*/30 * * * *", "UTC", false, ScheduleLimits{MaxAhead: 30}, from, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c, err := ParseCron(tt.cron, mustZone(t, tt.zone))
			require.NoError(t, err)
			err = tt.limits.Check(c, tt.localTime, 0, tt.from)
			if tt.refused == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorContains(t, err, tt.refused)
		})
	}
}

func TestScheduleLimitsDefaultsAndValidate(t *testing.T) {
	t.Parallel()
	l := ScheduleLimits{}.WithDefaults()
	require.Equal(t, ScheduleLimits{MinInterval: DefaultScheduleMinInterval, MaxAhead: DefaultScheduleMaxAhead, MaxSchedules: DefaultMaxSchedules}, l)
	require.NoError(t, l.Validate())
	require.ErrorContains(t, ScheduleLimits{MinInterval: time.Minute, MaxAhead: -1, MaxSchedules: 1}.Validate(), "MaxAhead")
	require.ErrorContains(t, ScheduleLimits{MinInterval: -time.Minute, MaxAhead: 1, MaxSchedules: 1}.Validate(), "MinInterval")
	require.ErrorContains(t, ScheduleLimits{MinInterval: time.Minute, MaxAhead: 1, MaxSchedules: -1}.Validate(), "MaxSchedules")
}

// BenchmarkScheduleLimitsCheck is the check every POST /v1/schedules runs,
// for the schedule that makes it work hardest: every minute, so that
// eight days of runs are walked, in a zone with DST.
func BenchmarkScheduleLimitsCheck(b *testing.B) {
	loc, err := time.LoadLocation("America/New_York")
	require.NoError(b, err)
	c, err := ParseCron("* * * * *", loc)
	require.NoError(b, err)
	from := time.Date(2026, 3, 5, 17, 59, 30, 0, time.UTC) // a DST change inside the span
	for b.Loop() {
		require.NoError(b, ScheduleLimits{}.Check(c, false, 0, from))
	}
}
