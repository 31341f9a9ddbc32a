package main

import (
	"context"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/heraldpush/herald/api/client"
	"github.com/heraldpush/herald/cmd/herald/heraldbench"
	"github.com/heraldpush/herald/db"
	"github.com/heraldpush/herald/db/dbtest"
	"github.com/heraldpush/herald/jobs"
)

// vanishing is a worker that stops being heard from without a goodbye, in
// the middle of a fan-out, and later comes back: vanish and comeBack do it
// (a SIGSTOP and a SIGCONT, a link dropped and restored).
type vanishing struct {
	what             string
	vanish, comeBack func(t *testing.T)
}

// takenOverWithoutAGoodbye runs the fan-out of s (devices devices, due
// once scheduled) on worker a, which vanishes a quarter of the way
// through, and worker b: with River's rescue an hour away, only b can
// finish a's chunks, by ending a's silent liveness session after the lease
// (3 s) and taking its chunks once its lock stayed free for the grace. The
// message settles with every device accepted once while a is still gone.
// a then comes back: fenced, and under a new session once it holds its
// lock again, it sends nothing that was taken from it, so the duplicates
// stay within what it had in flight when it vanished. What it had in flight
// is at most jobs.MaxUnwritten places, plus the sends it had given up on
// before (their places freed, their pushes perhaps taken), plus what it
// wrote to a socket while gone: a link that comes back delivers the
// requests its kernel kept retransmitting, and those are the pushes
// accepted after it came back (a CI run saw one, a duplicate past the
// places alone). How long after it
// vanished the message settled is logged, not asserted (a speed; a busy
// machine would make a bound flaky).
func takenOverWithoutAGoodbye(t *testing.T, s *fanOutSetup, devices int, a, b *child, v vanishing) {
	t.Helper()
	id := s.schedule()
	require.Eventually(t, func() bool { return s.accepted() >= int64(devices/4) }, 2*time.Minute, 5*time.Millisecond,
		"the fan-out never got going:\n%s\n%s", a.out.String(), b.out.String())
	aUnanswered := a.unanswered(t)
	v.vanish(t)
	goneAt := time.Now()
	require.Less(t, s.accepted(), int64(devices), "the fan-out finished before the worker vanished; the test proved nothing")

	st := s.settle(id, 3*time.Minute)
	settled := time.Since(goneAt)
	require.Equal(t, client.MessageStateDispatched, st.State)
	require.Equal(t, client.DeliveryCounts{Total: devices, Accepted: devices}, st.Deliveries, "settled while the worker was %s", v.what)
	families, err := heraldbench.ScrapeMetrics(b.base(t))
	require.NoError(t, err)
	ended := heraldbench.MetricSum(families, "herald_liveness_sessions_ended_total", nil)
	takenOver := heraldbench.MetricSum(families, "herald_chunks_taken_over_total", nil)
	require.Positive(t, ended, "the survivor never ended the session of the worker %s at %s; the liveness sessions now:\n%s\n%s\n%s",
		v.what, goneAt.Format("15:04:05.000"), livenessSessions(t, s.db), a.out.String(), b.out.String())
	require.Positive(t, takenOver, "the survivor took over none of the %s worker's chunks", v.what)

	acceptedBefore := s.accepted()
	v.comeBack(t)
	// Long enough for a worker that was not fenced to send thousands: its
	// chunks had that many devices pending when it vanished.
	time.Sleep(5 * time.Second)
	afterwards := s.accepted() - acceptedBefore
	dups := s.checkOnceEach(id, devices)
	bUnanswered := b.unanswered(t)
	t.Logf("settled %s after the worker was %s; %.0f sessions ended, %.0f chunks taken over; %d pushes accepted after it came back; duplicates %d; unanswered sends %d (the %s worker, before) and %d",
		settled.Round(time.Millisecond), v.what, ended, takenOver, afterwards, dups, aUnanswered, v.what, bUnanswered)
	require.LessOrEqual(t, int64(dups), jobs.MaxUnwritten+aUnanswered+bUnanswered+afterwards,
		"the worker that came back sent more than it can have had in flight when it vanished")
	require.LessOrEqual(t, afterwards, int64(jobs.MaxUnwritten), "the worker that came back sent what another worker had taken")
}

// vanishingSetup is a fan-out of 20,000 devices whose workers' chunks are
// never rescued by River within the test (an hour away) and never time
// out: only the takeover can move them.
func vanishingSetup(t *testing.T, tdb *dbtest.DB, fakeAddr string) *fanOutSetup {
	t.Helper()
	s := newFanOutSetupAt(t, 20_000, tdb, 40*time.Millisecond, fakeAddr)
	s.onlyTakeover()
	return s
}

// TestE2EFrozenWorkerIsTakenOver stops one of two workers with SIGSTOP in
// the middle of a 20,000-device fan-out: a frozen process (or VM) whose
// host still answers for its sockets, so PostgreSQL keeps its session, and
// its liveness lock, open (takenOverWithoutAGoodbye).
func TestE2EFrozenWorkerIsTakenOver(t *testing.T) {
	t.Parallel()
	s := vanishingSetup(t, dbtest.New(t), "127.0.0.1:0")
	a, b := startListeningWorkers(t, s.vars)
	t.Cleanup(func() { _ = a.cmd.Process.Signal(syscall.SIGCONT) })
	takenOverWithoutAGoodbye(t, s, 20_000, a, b, vanishing{
		what:   "frozen",
		vanish: func(t *testing.T) { require.NoError(t, a.cmd.Process.Signal(syscall.SIGSTOP)) },
		comeBack: func(t *testing.T) {
			require.NoError(t, a.cmd.Process.Signal(syscall.SIGCONT))
		},
	})
	a.base(t) // it is alive again, and answers
}

// livenessSessions lists the sessions that hold a liveness lock on tdb, as
// the survivor's look for silent ones sees them (db.EndSilentLiveness), for
// a failure to say why none was ended.
func livenessSessions(t *testing.T, tdb *dbtest.DB) string {
	t.Helper()
	rows, err := tdb.Pool.Query(context.Background(), `
		SELECT format('key %s pid %s state %s for %s, started %s ago, last %s', l.objid, a.pid, a.state,
		              clock_timestamp() - a.state_change, clock_timestamp() - a.backend_start, left(a.query, 60))
		FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
		WHERE l.locktype = 'advisory' AND l.granted AND l.classid = $1::bigint::oid AND l.objsubid = 2
		  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())`, int64(db.LivenessLockSpace))
	if err != nil {
		return err.Error()
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return err.Error()
	}
	return fmt.Sprintf("%d holding a liveness lock:\n%s", len(lines), strings.Join(lines, "\n"))
}
