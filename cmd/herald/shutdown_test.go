package main

import (
	"context"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/heraldpush/herald/db/dbtest"
)

// TestE2ESIGTERMMidFanOut stops one of two workers with SIGTERM in the middle
// of a 20,000-device fan-out, as a rolling deploy does. The stopping worker
// fetches no new chunk, lets the ones it runs finish and write their
// ledger, and exits; the other takes the rest. Nothing is lost, a push
// reaches a device twice only as a recorded second attempt (a send that got
// no answer, made again), no chunk waits for River's rescuer, and a
// shutdown is never taken for a provider's failure.
func TestE2ESIGTERMMidFanOut(t *testing.T) {
	t.Parallel()
	const devices = 20_000
	s := newFanOutSetupOn(t, devices, dbtest.New(t), 40*time.Millisecond)
	s.vars["HERALD_BULK_WORKERS"] = "10"
	s.vars["HERALD_LOG_LEVEL"] = "info"
	a, _ := startListeningWorkers(t, s.vars) // the second takes over what the first hands back
	id := s.schedule()
	require.Eventually(t, func() bool { return s.accepted() >= devices/4 }, 2*time.Minute, 5*time.Millisecond,
		"the workers never got going:\n%s", a.out.String())

	atSignal := s.accepted()
	signalled := time.Now()
	require.NoError(t, a.cmd.Process.Signal(syscall.SIGTERM))
	require.NoError(t, a.cmd.Wait(), "the worker should exit cleanly:\n%s", a.out.String())
	exited := time.Since(signalled)
	require.Less(t, atSignal, int64(devices), "the fan-out finished before the stop; the test proved nothing")

	dups := s.checkOnceEach(id, devices)
	settled := time.Since(signalled)
	// Every attempt after a delivery's first is recorded: a device sent
	// three times (two sends that got no answer) is two extra attempts.
	var resent int
	require.NoError(t, s.db.Pool.QueryRow(context.Background(),
		"SELECT coalesce(sum(attempt - 1), 0) FROM ledger WHERE attempt > 1").Scan(&resent))
	t.Logf("SIGTERM with %d of %d pushes accepted; the worker exited after %s, the message settled %s after the signal; duplicates %d, recorded attempts after a delivery's first %d",
		atSignal, devices, exited.Round(time.Millisecond), settled.Round(time.Millisecond), dups, resent)
	require.LessOrEqual(t, dups, resent, "a push was sent again without a recorded attempt: an answer was lost in the stop")

	// What the stopping worker said after the signal: no chunk was parked
	// for the stop's sake (a send cut short by it, taken for a provider's
	// failure). A loaded machine may time a request out, genuinely, before
	// or after the signal; those say so.
	out := a.out.String()
	_, afterSignal, ok := strings.Cut(out, `"msg":"shutting down"`)
	require.True(t, ok, "the worker never said it was shutting down:\n%s", out)
	for line := range strings.Lines(afterSignal) {
		if strings.Contains(line, "a provider is failing") {
			require.NotContains(t, line, "context canceled", "a chunk cut short by the stop was taken for a provider's failure")
			require.NotContains(t, line, "context ended", "a chunk cut short by the stop was taken for a provider's failure")
		}
	}
	require.Contains(t, afterSignal, `"msg":"stopped"`)
	var rescued int
	require.NoError(t, s.db.Pool.QueryRow(context.Background(),
		`SELECT count(*) FROM river_job, unnest(errors) e WHERE kind LIKE 'fan_out%' AND e->>'error' ILIKE '%rescue%'`).Scan(&rescued))
	require.Zero(t, rescued, "a chunk of the stopped worker waited for River's rescuer")
}
