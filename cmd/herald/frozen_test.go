package main

import (
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/heraldpush/herald/api/client"
	"github.com/heraldpush/herald/cmd/herald/heraldbench"
	"github.com/heraldpush/herald/db/dbtest"
	"github.com/heraldpush/herald/jobs"
)

// TestE2EFrozenWorkerIsTakenOver stops one of two workers with SIGSTOP in
// the middle of a 20,000-device fan-out: a frozen process (or VM) whose
// host still answers for its sockets, so PostgreSQL keeps its session, and
// its liveness lock, open. River's rescue is an hour away, so only the
// survivor can finish the frozen worker's chunks: it ends the frozen
// worker's silent liveness session after the lease (3 s) and takes its
// chunks once its lock has stayed free for the grace. The message settles
// with every device accepted once while the worker is still frozen. The
// worker is then let go on: it finds itself fenced and sends nothing that
// was taken from it, so the duplicates stay within what it had in flight
// when it froze. How long after the freeze the message settled is logged,
// not asserted (a speed; a busy machine would make a bound flaky).
func TestE2EFrozenWorkerIsTakenOver(t *testing.T) {
	t.Parallel()
	const devices = 20_000
	s := newFanOutSetupOn(t, devices, dbtest.New(t), 40*time.Millisecond)
	s.vars["HERALD_BULK_WORKERS"] = "10"
	s.vars["HERALD_CHUNK_TIMEOUT"] = "50m"
	s.vars["HERALD_RESCUE_AFTER"] = "1h"
	a, b := startListeningWorkers(t, s.vars)
	id := s.schedule()
	require.Eventually(t, func() bool { return s.accepted() >= devices/4 }, 2*time.Minute, 5*time.Millisecond,
		"the fan-out never got going:\n%s\n%s", a.out.String(), b.out.String())
	aUnanswered := a.unanswered(t)
	require.NoError(t, a.cmd.Process.Signal(syscall.SIGSTOP))
	frozenAt := time.Now()
	t.Cleanup(func() { _ = a.cmd.Process.Signal(syscall.SIGCONT) })
	require.Less(t, s.accepted(), int64(devices), "the fan-out finished before the freeze; the test proved nothing")

	st := s.settle(id, 3*time.Minute)
	settled := time.Since(frozenAt)
	require.Equal(t, client.MessageStateDispatched, st.State)
	require.Equal(t, client.DeliveryCounts{Total: devices, Accepted: devices}, st.Deliveries, "settled while the worker was frozen")
	families, err := heraldbench.ScrapeMetrics(b.base(t))
	require.NoError(t, err)
	ended := heraldbench.MetricSum(families, "herald_liveness_sessions_ended_total", nil)
	takenOver := heraldbench.MetricSum(families, "herald_chunks_taken_over_total", nil)
	require.Positive(t, ended, "the survivor never ended the frozen worker's session")
	require.Positive(t, takenOver, "the survivor took over none of the frozen worker's chunks")

	// The frozen worker comes back: whatever it had in flight may still be
	// answered, but it starts no new request for a chunk taken from it.
	acceptedBefore := s.accepted()
	require.NoError(t, a.cmd.Process.Signal(syscall.SIGCONT))
	// Long enough for a worker that was not fenced to send thousands: its
	// chunks had that many devices pending when it froze.
	time.Sleep(5 * time.Second)
	a.base(t) // it is alive again, and answers
	afterResume := s.accepted() - acceptedBefore
	dups := s.checkOnceEach(id, devices)
	bUnanswered := b.unanswered(t)
	t.Logf("settled %s after the freeze; %.0f sessions ended, %.0f chunks taken over; %d pushes accepted after the resume; duplicates %d; unanswered sends %d (frozen worker) and %d",
		settled.Round(time.Millisecond), ended, takenOver, afterResume, dups, aUnanswered, bUnanswered)
	require.LessOrEqual(t, int64(dups), jobs.MaxUnwritten+aUnanswered+bUnanswered,
		"the resumed worker sent more than it can have had in flight when it froze")
	require.LessOrEqual(t, afterResume, int64(jobs.MaxUnwritten), "the resumed worker sent what another worker had taken")
}
