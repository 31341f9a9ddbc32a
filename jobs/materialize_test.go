package jobs

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/heraldpush/herald/db"
	"github.com/heraldpush/herald/db/dbtest"
)

// schedBundle is a database with three users and a River client that only
// enqueues, for driving the materializer with a clock of the test's own.
type schedBundle struct {
	t     *testing.T
	db    *dbtest.DB
	q     *db.Queries
	users []string
	now   time.Time
	mu    sync.Mutex
}

func newSchedBundle(t *testing.T) *schedBundle {
	tdb := dbtest.New(t)
	q := db.On(tdb.Pool)
	return &schedBundle{t: t, db: tdb, q: q, users: registerUsers(t, q, "s", 3)}
}

func (b *schedBundle) clock(context.Context) (time.Time, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.now, nil
}

func (b *schedBundle) setNow(t time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.now = t
}

// materializer is the bundle's materializer, on its clock, with limits (the
// defaults when none), and the River client it enqueues through.
func (b *schedBundle) materializer(limits ...ScheduleLimits) (*Materializer, jobClient) {
	client, err := NewRiverClient(b.db.Pool, RiverConfig{Logger: discard})
	require.NoError(b.t, err)
	cfg := &MaterializerConfig{Pool: b.db.Pool, Logger: discard, Lead: 2 * time.Minute, Now: b.clock}
	for _, l := range limits {
		cfg.Limits = l
	}
	m, err := NewMaterializer(cfg)
	require.NoError(b.t, err)
	return m, client
}

// schedule stores a schedule whose first run is first.
func (b *schedBundle) schedule(expr, zone string, ttl int32, first time.Time, endsAt *time.Time) db.Schedule {
	b.t.Helper()
	ctx := context.Background()
	payload, err := b.q.InsertPayload(ctx, []byte(`{"title":"standup"}`))
	require.NoError(b.t, err)
	s, err := b.q.InsertSchedule(ctx, db.InsertScheduleParams{
		Cron: expr, Timezone: zone, Audience: []byte(`{"type":"users","ids":["s000","s001","s002"]}`),
		PayloadID: payload, Priority: PriorityBulk, TtlSeconds: ttl, FallbackTimezone: "UTC", IfPassed: "skip",
		EndsAt: endsAt, NextRunAt: &first,
	})
	require.NoError(b.t, err)
	return s
}

type run struct {
	at    time.Time
	state string
	devs  int32
}

func (b *schedBundle) runs(scheduleID int64) []run {
	b.t.Helper()
	rows, err := b.db.Pool.Query(context.Background(),
		"SELECT schedule_run_at, state, device_count FROM messages WHERE schedule_id = $1 ORDER BY schedule_run_at", scheduleID)
	require.NoError(b.t, err)
	defer rows.Close()
	var out []run
	for rows.Next() {
		var r run
		require.NoError(b.t, rows.Scan(&r.at, &r.state, &r.devs))
		out = append(out, r)
	}
	return out
}

func TestMaterializeEachRunOnce(t *testing.T) {
	t.Parallel()
	b := newSchedBundle(t)
	ctx := context.Background()
	t0 := time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)
	s := b.schedule("*/5 * * * *", "UTC", 600, t0, nil)

	// Two minutes ahead: the 09:00 run is made, and only it.
	b.setNow(t0.Add(-90 * time.Second))
	m, client := b.materializer()
	n, err := m.Run(ctx, client)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	runs := b.runs(s.ID)
	require.Len(t, runs, 1)
	require.True(t, runs[0].at.Equal(t0))
	require.Equal(t, StateScheduled, runs[0].state)
	require.EqualValues(t, 3, runs[0].devs)

	// Again at the same moment: nothing new.
	n, err = m.Run(ctx, client)
	require.NoError(t, err)
	require.Zero(t, n)

	// A restarted process and a second one, racing, at 09:04: the 09:05
	// run is made once.
	b.setNow(t0.Add(4 * time.Minute))
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			m, client := b.materializer()
			_, err := m.Run(ctx, client)
			require.NoError(t, err)
		})
	}
	wg.Wait()
	runs = b.runs(s.ID)
	require.Len(t, runs, 2)
	require.True(t, runs[1].at.Equal(t0.Add(5*time.Minute)))
	var chunks int
	require.NoError(t, b.db.Pool.QueryRow(ctx, "SELECT count(*) FROM river_job WHERE kind LIKE 'fan_out%'").Scan(&chunks))
	require.Equal(t, 2, chunks, "one chunk per run, never two")
}

func TestMaterializeMissedRuns(t *testing.T) {
	t.Parallel()
	b := newSchedBundle(t)
	ctx := context.Background()
	t0 := time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)
	s := b.schedule("*/10 * * * *", "UTC", 900, t0, nil)

	// Herald was down from before 09:00 until 09:52: runs 09:00 to 09:30
	// had their 15-minute lifetime end (recorded expired, nothing sent);
	// 09:40 and 09:50 are still alive (sent late); 09:52 + 2 min lead
	// reaches no further run.
	b.setNow(t0.Add(52 * time.Minute))
	m, client := b.materializer()
	n, err := m.Run(ctx, client)
	require.NoError(t, err)
	require.Equal(t, 6, n)
	runs := b.runs(s.ID)
	require.Len(t, runs, 6)
	for i, r := range runs {
		require.True(t, r.at.Equal(t0.Add(time.Duration(i)*10*time.Minute)))
		if i < 4 {
			require.Equal(t, StateExpired, r.state, "run %d", i)
			require.Zero(t, r.devs)
		} else {
			require.Equal(t, StateScheduled, r.state, "run %d", i)
			require.EqualValues(t, 3, r.devs)
		}
	}
	sch, err := b.q.GetSchedule(ctx, s.ID)
	require.NoError(t, err)
	require.True(t, sch.NextRunAt.Equal(t0.Add(60*time.Minute)))
}

func TestMaterializeStopsAtEndsAt(t *testing.T) {
	t.Parallel()
	b := newSchedBundle(t)
	ctx := context.Background()
	t0 := time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)
	ends := t0.Add(10 * time.Minute)
	s := b.schedule("*/5 * * * *", "UTC", 600, t0, &ends)
	m, client := b.materializer()
	for _, at := range []time.Duration{0, 5 * time.Minute, 10 * time.Minute, 15 * time.Minute, time.Hour} {
		b.setNow(t0.Add(at))
		_, err := m.Run(ctx, client)
		require.NoError(t, err)
	}
	runs := b.runs(s.ID)
	require.Len(t, runs, 3, "09:00, 09:05 and 09:10, the last at ends_at")
	sch, err := b.q.GetSchedule(ctx, s.ID)
	require.NoError(t, err)
	require.Nil(t, sch.NextRunAt, "nothing left to run")
}

func TestMaterializeSkipsPausedAndDeleted(t *testing.T) {
	t.Parallel()
	b := newSchedBundle(t)
	ctx := context.Background()
	t0 := time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)
	paused := b.schedule("*/5 * * * *", "UTC", 600, t0, nil)
	deleted := b.schedule("*/5 * * * *", "UTC", 600, t0, nil)
	_, err := b.q.SetSchedulePaused(ctx, db.SetSchedulePausedParams{ID: paused.ID, Paused: true})
	require.NoError(t, err)
	_, err = b.q.DeleteSchedule(ctx, deleted.ID)
	require.NoError(t, err)

	b.setNow(t0)
	m, client := b.materializer()
	n, err := m.Run(ctx, client)
	require.NoError(t, err)
	require.Zero(t, n)
	require.Empty(t, b.runs(paused.ID))
	require.Empty(t, b.runs(deleted.ID))
}

// TestMaterializeAcrossBerlinDST makes the runs of a 09:00 Berlin schedule
// over the spring-forward weekend, a day at a time.
func TestMaterializeAcrossBerlinDST(t *testing.T) {
	t.Parallel()
	b := newSchedBundle(t)
	ctx := context.Background()
	berlin := mustZone(t, "Europe/Berlin")
	c, err := ParseCron("0 9 * * *", berlin)
	require.NoError(t, err)
	first, _ := c.Next(time.Date(2026, 3, 27, 12, 0, 0, 0, berlin))
	s := b.schedule("0 9 * * *", "Europe/Berlin", 3600, first, nil)
	m, client := b.materializer()
	for day := 28; day <= 30; day++ {
		b.setNow(time.Date(2026, 3, day, 8, 59, 0, 0, berlin))
		_, err := m.Run(ctx, client)
		require.NoError(t, err)
	}
	runs := b.runs(s.ID)
	require.Len(t, runs, 3)
	for i, r := range runs {
		local := r.at.In(berlin)
		require.Equal(t, 9, local.Hour(), "run %d at %s", i, local)
		require.Equal(t, 28+i, local.Day())
	}
	require.Equal(t, 23*time.Hour, runs[1].at.Sub(runs[0].at), "the spring-forward day is 23 hours long")
}

// TestMaterializeLocalTimeRun makes a local-time schedule's 09:00 run a day
// ahead, as three waves: 09:00 in Kolkata, Berlin and New York.
func TestMaterializeLocalTimeRun(t *testing.T) {
	t.Parallel()
	b := newSchedBundle(t)
	ctx := context.Background()
	for user, zone := range map[string]string{"s000": "Asia/Kolkata", "s001": "Europe/Berlin", "s002": "America/New_York"} {
		_, err := b.q.UpsertUser(ctx, db.UpsertUserParams{ID: user, Timezone: &zone})
		require.NoError(t, err)
	}
	run := time.Date(2026, 12, 2, 9, 0, 0, 0, time.UTC)
	s := b.schedule("0 9 * * *", "UTC", 600, run, nil)
	_, err := b.db.Pool.Exec(ctx, "UPDATE schedules SET local_time = true WHERE id = $1", s.ID)
	require.NoError(t, err)

	// Two minutes ahead is too late for Kolkata; a day ahead is not.
	b.setNow(run.Add(-21 * time.Hour))
	m, client := b.materializer()
	n, err := m.Run(ctx, client)
	require.NoError(t, err)
	require.Equal(t, 1, n)

	rows, err := b.q.MessageWaves(ctx, b.runs(s.ID)[0].id(t, b))
	require.NoError(t, err)
	var waves []time.Time
	for _, r := range rows {
		waves = append(waves, r.DueAt.UTC())
		require.EqualValues(t, 1, r.Devices)
	}
	require.Equal(t, []time.Time{
		time.Date(2026, 12, 2, 3, 30, 0, 0, time.UTC), // 09:00 in Kolkata
		time.Date(2026, 12, 2, 8, 0, 0, 0, time.UTC),  // 09:00 in Berlin
		time.Date(2026, 12, 2, 14, 0, 0, 0, time.UTC), // 09:00 in New York
	}, waves)
}

// id finds the message of a run.
func (r run) id(t *testing.T, b *schedBundle) int64 {
	t.Helper()
	var id int64
	require.NoError(t, b.db.Pool.QueryRow(context.Background(), "SELECT id FROM messages WHERE schedule_run_at = $1", r.at).Scan(&id))
	return id
}

// TestMaterializeKeepsAtMostMaxAheadWaiting runs an every-minute local-time
// schedule, as one stored before the limits were: its 26 hours ahead would
// be some 1,500 messages in one pass. The materializer makes no more than
// the cap, makes more as the waiting ones start, and meanwhile serves the
// other schedules.
func TestMaterializeKeepsAtMostMaxAheadWaiting(t *testing.T) {
	t.Parallel()
	b := newSchedBundle(t)
	ctx := context.Background()
	t0 := time.Date(2026, 12, 2, 9, 0, 0, 0, time.UTC)
	dense := b.schedule("* * * * *", "UTC", 600, t0, nil)
	_, err := b.db.Pool.Exec(ctx, "UPDATE schedules SET local_time = true WHERE id = $1", dense.ID)
	require.NoError(t, err)
	b.setNow(t0.Add(-time.Hour))
	other := b.schedule("0 * * * *", "UTC", 600, t0.Add(-time.Hour).Add(time.Minute), nil)

	m, client := b.materializer(ScheduleLimits{MaxAhead: 40})
	n, err := m.Run(ctx, client)
	require.NoError(t, err)
	require.Equal(t, 41, n, "40 runs of the dense schedule and the other's one")
	require.Len(t, b.runs(other.ID), 1)
	requireRuns := func(want int) {
		t.Helper()
		runs := b.runs(dense.ID)
		require.Len(t, runs, want)
		for i, r := range runs {
			require.True(t, r.at.Equal(t0.Add(time.Duration(i)*time.Minute)), "runs in order, none skipped: %d at %s", i, r.at)
		}
	}
	requireRuns(40)

	// The next pass makes nothing: all 40 still wait.
	n, err = m.Run(ctx, client)
	require.NoError(t, err)
	require.Zero(t, n)

	// Fifteen start; the next pass makes fifteen more.
	_, err = b.db.Pool.Exec(ctx, `UPDATE messages SET state = 'dispatching' WHERE id IN (
		SELECT id FROM messages WHERE schedule_id = $1 ORDER BY schedule_run_at LIMIT 15)`, dense.ID)
	require.NoError(t, err)
	n, err = m.Run(ctx, client)
	require.NoError(t, err)
	require.Equal(t, 15, n)
	requireRuns(55)
	var waiting int
	require.NoError(t, b.db.Pool.QueryRow(ctx, "SELECT count(*) FROM messages WHERE schedule_id = $1 AND state = 'scheduled'", dense.ID).Scan(&waiting))
	require.Equal(t, 40, waiting)
}
