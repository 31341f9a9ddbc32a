package jobs

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func mustZone(t *testing.T, name string) *time.Location {
	t.Helper()
	loc, err := time.LoadLocation(name)
	require.NoError(t, err)
	return loc
}

func rfc(t *testing.T, s string) time.Time {
	t.Helper()
	v, err := time.Parse(time.RFC3339, s)
	require.NoError(t, err)
	return v
}

func TestCronAcrossDST(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name, zone, expr, from string
		want                   []string
	}{
		{
			name: "09:00 stays 09:00 across Berlin's spring forward", zone: "Europe/Berlin", expr: "0 9 * * *",
			from: "2026-03-27T12:00:00Z",
			want: []string{"2026-03-28T09:00:00+01:00", "2026-03-29T09:00:00+02:00", "2026-03-30T09:00:00+02:00"},
		},
		{
			name: "weekdays at 09:00 across Berlin's fall back", zone: "Europe/Berlin", expr: "0 9 * * MON-FRI",
			from: "2026-10-22T12:00:00Z",
			want: []string{"2026-10-23T09:00:00+02:00", "2026-10-26T09:00:00+01:00", "2026-10-27T09:00:00+01:00"},
		},
		{
			name: "a time in Berlin's gap runs at the gap's end", zone: "Europe/Berlin", expr: "30 2 * * *",
			from: "2026-03-27T12:00:00Z",
			want: []string{"2026-03-28T02:30:00+01:00", "2026-03-29T03:00:00+02:00", "2026-03-30T02:30:00+02:00"},
		},
		{
			name: "a time Berlin has twice runs once", zone: "Europe/Berlin", expr: "30 2 * * *",
			from: "2026-10-24T12:00:00Z",
			want: []string{"2026-10-25T02:30:00+02:00", "2026-10-26T02:30:00+01:00"},
		},
		{
			name: "every 30 minutes through New York's gap", zone: "America/New_York", expr: "*/30 1-3 8 3 *",
			from: "2026-03-08T00:00:00-05:00",
			// 02:00 and 02:30 do not exist: both run at 03:00, once.
			want: []string{"2026-03-08T01:00:00-05:00", "2026-03-08T01:30:00-05:00", "2026-03-08T03:00:00-04:00", "2026-03-08T03:30:00-04:00"},
		},
		{
			name: "every 30 minutes through New York's fall back", zone: "America/New_York", expr: "*/30 0-2 1 11 *",
			from: "2026-11-01T00:10:00-04:00",
			// 01:00 and 01:30 happen twice; each runs once, the first time.
			want: []string{"2026-11-01T00:30:00-04:00", "2026-11-01T01:00:00-04:00", "2026-11-01T01:30:00-04:00", "2026-11-01T02:00:00-05:00", "2026-11-01T02:30:00-05:00"},
		},
		{
			name: "descriptor", zone: "UTC", expr: "@daily",
			from: "2026-01-01T10:00:00Z",
			want: []string{"2026-01-02T00:00:00Z", "2026-01-03T00:00:00Z"},
		},
		{
			name: "day of month or day of week", zone: "UTC", expr: "0 12 13 * FRI",
			from: "2026-02-10T00:00:00Z",
			want: []string{"2026-02-13T12:00:00Z", "2026-02-20T12:00:00Z", "2026-02-27T12:00:00Z", "2026-03-06T12:00:00Z", "2026-03-13T12:00:00Z"},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c, err := ParseCron(tc.expr, mustZone(t, tc.zone))
			require.NoError(t, err)
			got := c.NextRuns(rfc(t, tc.from), len(tc.want), nil, 0)
			require.Len(t, got, len(tc.want))
			for i, w := range tc.want {
				require.True(t, rfc(t, w).Equal(got[i]), "run %d: want %s, got %s", i, w, got[i].In(mustZone(t, tc.zone)))
			}
		})
	}
}

func TestCronRejects(t *testing.T) {
	t.Parallel()
	for _, expr := range []string{"", "61 * * * *", "* * *", "@every 5m", "CRON_TZ=UTC 0 9 * * *", "0 9 * * FUNDAY"} {
		_, err := ParseCron(expr, time.UTC)
		require.Error(t, err, expr)
	}
	c, err := ParseCron("0 0 30 2 *", time.UTC)
	require.NoError(t, err)
	_, ok := c.Next(time.Now())
	require.False(t, ok, "30 February never comes")
}

func TestNextRunStaysWithinTheBounds(t *testing.T) {
	t.Parallel()
	c, err := ParseCron("0 9 * * *", time.UTC)
	require.NoError(t, err)
	from := rfc(t, "9999-12-29T12:00:00Z")
	require.Equal(t, []time.Time{rfc(t, "9999-12-30T09:00:00Z"), rfc(t, "9999-12-31T09:00:00Z")},
		c.NextRuns(from, 5, nil, time.Hour), "no run whose message outlives year 9999")
	require.Equal(t, []time.Time{rfc(t, "9999-12-30T09:00:00Z")},
		c.NextRuns(from, 5, nil, 24*time.Hour+time.Hour))
	ends := rfc(t, "9999-12-30T08:59:59Z")
	_, ok := c.NextRun(from, &ends, time.Hour)
	require.False(t, ok, "no run after ends_at")
	_, ok = c.NextRun(rfc(t, "9999-12-30T12:00:00Z"), nil, RunSpan(time.Hour, true))
	require.False(t, ok, "a local-time run lasts 26 hours longer")
}
