package main

import (
	"bytes"
	"context"
	"fmt"
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
	"github.com/heraldpush/herald/jobs"
)

// previousReleases are the releases a rolling upgrade comes from, and the
// feature each lacks: the last one before the ledger's snapshots
// (migration 0022), whose workers read pending ledger rows and know no
// snapshot chunk, and the last one before the accepted runs (migration
// 0028), whose workers would read a run's devices as pending and know no
// chunk that writes runs.
var previousReleases = []struct{ commit, lacks string }{
	{"e3825bd", jobs.FeatureSnapshots},
	{"9293bb7", jobs.FeatureRuns},
}

// buildPreviousRelease builds `herald` of previousRelease from this
// repository's history into a temporary directory. It skips, saying why,
// where git or the commit is missing (a shallow clone).
func buildPreviousRelease(t *testing.T, previousRelease string) string {
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
// device, and a schedule's run; then, with both releases' workers running,
// a fan-out of 2,000 devices whose chunks either takes, each device sent
// exactly once. While a worker of the previous release is alive, this
// release's API writes the ledger as that worker can send it (pending
// rows before the snapshots, a row a result before the runs), and this
// release's worker sends what the previous API wrote. Both releases before
// a change of the ledger's write are mixed so.
func TestE2ERollingUpgradeMixesReleases(t *testing.T) {
	t.Parallel()
	for _, release := range previousReleases {
		t.Run(release.commit, func(t *testing.T) {
			t.Parallel()
			rollingUpgrade(t, buildPreviousRelease(t, release.commit), release.lacks)
		})
	}
}

// rollingUpgrade is TestE2ERollingUpgradeMixesReleases from prev, the
// binary of a release without the feature lacks.
func rollingUpgrade(t *testing.T, prev, lacks string) {
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
			startPrevWorker := func() {
				startChild(t, []string{prev, "serve", "--role", "worker", "--addr", "127.0.0.1:0"}, vars).base(t)
				// Seen by this release's API once it has reported.
				require.Eventually(t, func() bool {
					older, err := db.On(tdb.Pool).ProcessesWithoutFeature(context.Background(), lacks)
					return err == nil && len(older) > 0
				}, 30*time.Second, 50*time.Millisecond, "the previous release's worker never reported")
			}
			if tc.oldAPI {
				base = startChild(t, []string{prev, "serve", "--role", "api", "--addr", "127.0.0.1:0"}, vars).base(t)
				startWorker(t, vars).base(t)
			} else {
				base, _ = startServe(t, vars, "--role", "api")
				startPrevWorker()
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

			// Both releases' workers, one fan-out.
			if tc.oldAPI {
				startPrevWorker()
			} else {
				startWorker(t, vars).base(t)
			}
			users := make([]string, 2000)
			for i := range users {
				users[i] = fmt.Sprintf("fan-%04d", i)
			}
			e.fcmDevices(users, false)
			at := time.Now().Add(2 * time.Second)
			fan := e.send(client.NewMessage{Audience: toUsers(users...), Payload: titled("both releases"), DispatchAt: &at}).MessageID
			st = e.settle(fan, time.Minute)
			require.Equal(t, client.DeliveryCounts{Total: len(users), Accepted: len(users)}, st.Deliveries)
			require.Len(t, e.fake.Receipts(fan), len(users), "every device got the push once")
			fanID, err := strconv.ParseInt(strings.TrimPrefix(fan, "msg_"), 10, 64)
			require.NoError(t, err)
			if lacks == jobs.FeatureSnapshots {
				var snapshots, snapshotJobs int
				require.NoError(t, tdb.Pool.QueryRow(context.Background(), `
					SELECT (SELECT count(*) FROM chunk_devices WHERE message_id = $1),
					       (SELECT count(*) FROM river_job j JOIN message_chunks c ON c.job_id = j.id
					        WHERE c.message_id = $1 AND j.kind <> 'fan_out')`, fanID).Scan(&snapshots, &snapshotJobs))
				require.Zero(t, snapshots, "a snapshot was written while a worker of the previous release was alive")
				require.Zero(t, snapshotJobs, "a chunk of a kind the previous release does not run")
				return
			}
			var runs, runsJobs, snapshots int
			require.NoError(t, tdb.Pool.QueryRow(context.Background(), `
				SELECT (SELECT count(*) FROM accepted_runs WHERE message_id = $1),
				       (SELECT count(*) FROM river_job j JOIN message_chunks c ON c.job_id = j.id
				        WHERE c.message_id = $1 AND j.kind = 'fan_out_runs'),
				       (SELECT count(*) FROM chunk_devices WHERE message_id = $1)`, fanID).Scan(&runs, &runsJobs, &snapshots))
			require.Zero(t, runs, "a run was written while a worker of the previous release was alive")
			require.Zero(t, runsJobs, "a chunk of a kind the previous release does not run")
			require.NotZero(t, snapshots, "both releases write snapshots")
		})
	}
}
