package main

import (
	"bytes"
	"context"
	"io"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/heraldpush/herald/api/client"
	"github.com/heraldpush/herald/db"
	"github.com/heraldpush/herald/db/dbtest"
)

// previousRelease is the release a rolling upgrade comes from. Until
// releases are tagged it is the commit the deployable work started from.
const previousRelease = "2db9c0a"

// buildPreviousRelease builds `herald` of previousRelease from this
// repository's history into a temporary directory. It skips, saying why,
// where git or the commit is missing (a shallow clone).
func buildPreviousRelease(t *testing.T) string {
	t.Helper()
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("!!! git is not installed: the previous release cannot be built, and the rolling upgrade is NOT tested")
	}
	root, err := filepath.Abs("../..")
	require.NoError(t, err)
	if err := exec.Command("git", "-C", root, "cat-file", "-e", previousRelease+"^{commit}").Run(); err != nil {
		t.Skipf("!!! commit %s is not in this clone (a shallow one?): the rolling upgrade is NOT tested", previousRelease)
	}
	src := t.TempDir()
	archive := exec.Command("git", "-C", root, "archive", "--format=tar", previousRelease)
	untar := exec.Command("tar", "-x", "-C", src)
	pipe, err := archive.StdoutPipe()
	require.NoError(t, err)
	untar.Stdin = pipe
	require.NoError(t, untar.Start())
	require.NoError(t, archive.Run())
	require.NoError(t, untar.Wait())
	bin := filepath.Join(t.TempDir(), "herald-"+previousRelease)
	build := exec.Command("go", "build", "-o", bin, "./cmd/herald")
	build.Dir = src
	out, err := build.CombinedOutput()
	require.NoError(t, err, "build %s:\n%s", previousRelease, out)
	return bin
}

// TestE2ERollingUpgradeMixesReleases runs the previous release and this one on
// one database, as a rolling deploy does, after this release's migrations
// (docs/operations.md, Upgrading): the previous release's API with this release's
// worker, and the other way round. Each pair delivers a message to every
// device, and a schedule's run.
func TestE2ERollingUpgradeMixesReleases(t *testing.T) {
	t.Parallel()
	prev := buildPreviousRelease(t)
	for _, tc := range []struct {
		name   string
		oldAPI bool
	}{
		{"the previous API with this worker", true},
		{"this API with the previous worker", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			fp, tdb, vars := e2eEnvOn(t, dbtest.NewEmpty(t)) // the previous release migrates it first
			// Runs are made at once and sent within a second of their
			// time (TestScheduleEveryMinute does the same).
			vars["HERALD_MATERIALIZE_EVERY"] = "200ms"
			vars["HERALD_SCHEDULE_LEAD"] = "1s"
			var out bytes.Buffer
			require.NoError(t, run(context.Background(), []string{"herald", "migrate"}, env(vars), &out, io.Discard))

			var base string
			if tc.oldAPI {
				base = startChild(t, []string{prev, "serve", "--role", "api", "--addr", "127.0.0.1:0"}, vars).base(t)
				startWorker(t, vars)
			} else {
				base, _ = startServe(t, vars, "--role", "api")
				startChild(t, []string{prev, "serve", "--role", "worker", "--addr", "127.0.0.1:0"}, vars).base(t)
			}
			e := &e2e{t: t, fake: fp, base: base, vars: vars, db: tdb, api: newAPIClient(t, base, testAPIKey)}
			e.register("ann", false)

			id := e.send(client.NewMessage{Audience: toUsers("ann"), Payload: titled("across releases")}).MessageID
			st := e.settle(id, time.Minute)
			require.Equal(t, client.DeliveryCounts{Total: 3, Accepted: 3}, st.Deliveries)
			require.Len(t, e.fake.Receipts(id), 3, "every device got the push once")

			// A schedule's run: the run a minute back is still alive,
			// so the worker's materializer makes it and it is sent at once.
			sch := e.everyMinute("ann")
			scheduleID, err := strconv.ParseInt(strings.TrimPrefix(sch, "sch_"), 10, 64)
			require.NoError(t, err)
			q := db.On(tdb.Pool)
			now, err := q.DatabaseNow(context.Background())
			require.NoError(t, err)
			back := now.UTC().Truncate(time.Minute).Add(-time.Minute)
			require.NoError(t, q.AdvanceSchedule(context.Background(), db.AdvanceScheduleParams{ID: scheduleID, NextRunAt: &back}))
			require.Eventually(t, func() bool {
				runs := e.listMessages(client.ListMessagesParams{State: new(client.MessageStateDispatched), ScheduleID: &sch})
				return len(runs) > 0 && runs[0].Deliveries.Accepted == 3
			}, time.Minute, 100*time.Millisecond, "no run of the schedule was delivered")
		})
	}
}
