package main

import (
	"context"
	"fmt"
	"net/http"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/heraldpush/herald/api/client"
	"github.com/heraldpush/herald/cmd/herald/heraldbench"
	"github.com/heraldpush/herald/db/dbtest"
	"github.com/heraldpush/herald/jobs"
	"github.com/heraldpush/herald/jobs/push/fake"
)

// startWorker runs `herald serve --role worker` in a process of its own,
// with vars as its whole environment.
func startWorker(t *testing.T, vars map[string]string) *child {
	t.Helper()
	return startChild(t, asHerald("serve", "--role", "worker", "--addr", "127.0.0.1:0"), vars)
}

// startListeningWorkers starts two workers and waits until both listen,
// so that both are up before a message falls due.
func startListeningWorkers(t *testing.T, vars map[string]string) (a, b *child) {
	t.Helper()
	a, b = startWorker(t, vars), startWorker(t, vars)
	a.base(t)
	b.base(t)
	return a, b
}

// unanswered scrapes the worker's /metrics for its provider requests that
// got no answer: pushes the provider may have taken while the worker could
// not know it, which it sends again (with the same collapse id).
func (w *child) unanswered(t *testing.T) int64 {
	t.Helper()
	m := listeningLine.FindStringSubmatch(w.out.String())
	require.NotNil(t, m, "the worker never said where it listens:\n%s", w.out.String())
	n, err := heraldbench.UnansweredSends(m[1])
	require.NoError(t, err)
	return n
}

// kill ends the worker the hard way, as a crash or an OOM kill would.
func (w *child) kill(t *testing.T) {
	t.Helper()
	require.NoError(t, w.cmd.Process.Signal(syscall.SIGKILL))
	_ = w.cmd.Wait()
}

// fanOutSetup is an API-only Herald in-process, a fakepush and the
// environment for worker processes, with n devices registered (half APNs,
// half FCM) for n users.
type fanOutSetup struct {
	*e2e
	db    *dbtest.DB
	vars  map[string]string
	users []string
	msgID string
}

func newFanOutSetup(t *testing.T, n int) *fanOutSetup {
	t.Helper()
	return newFanOutSetupOn(t, n, dbtest.New(t), 20*time.Millisecond)
}

// newFanOutSetupOn is newFanOutSetup on a database of the test's
// choosing, with fakepush answering after latency.
func newFanOutSetupOn(t *testing.T, n int, tdb *dbtest.DB, latency time.Duration) *fanOutSetup {
	t.Helper()
	return newFanOutSetupAt(t, n, tdb, latency, "127.0.0.1:0")
}

// newFanOutSetupAt is newFanOutSetupOn with fakepush listening at addr.
func newFanOutSetupAt(t *testing.T, n int, tdb *dbtest.DB, latency time.Duration, addr string) *fanOutSetup {
	t.Helper()
	fp, err := fake.New(fake.Config{Addr: addr, TLSDir: t.TempDir(), Latency: latency})
	require.NoError(t, err)
	require.NoError(t, fp.Start(context.Background()))
	t.Cleanup(func() { _ = fp.Close() })

	vars := fp.Env()
	vars["DATABASE_URL"] = tdb.URL
	vars["HERALD_API_KEYS"] = testAPIKey
	vars["HERALD_LOG_LEVEL"] = "warn"
	// Short enough that the test sees a dead worker's chunks rescued within
	// seconds rather than River's minute, long enough that no chunk times
	// out under the race detector; the rescuer still only retries a chunk
	// whose attempt is over.
	vars["HERALD_CHUNK_TIMEOUT"] = "20s"
	vars["HERALD_RESCUE_AFTER"] = "22s"
	apiVars := map[string]string{}
	for k, v := range vars {
		apiVars[k] = v
	}
	base, stop := startServe(t, apiVars, "--migrate", "--role", "api")
	t.Cleanup(func() { _ = stop() })
	s := &fanOutSetup{e2e: &e2e{t: t, fake: fp, base: base, stop: stop, api: newAPIClient(t, base, testAPIKey)}, db: tdb, vars: vars}
	t.Cleanup(func() {
		if t.Failed() {
			s.diagnose()
		}
	})

	for start := 0; start < n; start += 10_000 {
		var batch []client.DeviceRegistration
		for i := start; i < min(start+10_000, n); i++ {
			u := fmt.Sprintf("u%d", i)
			s.users = append(s.users, u)
			if i%2 == 0 {
				batch = append(batch, client.DeviceRegistration{UserID: u, Channel: client.ChannelAPNs, Token: new(fmt.Sprintf("%064x", i))})
			} else {
				batch = append(batch, client.DeviceRegistration{UserID: u, Channel: client.ChannelFCM, Token: new(fmt.Sprintf("fcm-token-%d", i))})
			}
		}
		s.registerDevices(batch)
	}
	return s
}

func (s *fanOutSetup) schedule() string {
	s.t.Helper()
	ctx := s.t.Context()
	seg, err := s.api.CreateSegmentWithResponse(ctx, "all", client.SegmentUpdate{Name: new("all")})
	require.NoError(s.t, err)
	if seg.StatusCode() == http.StatusCreated {
		for start := 0; start < len(s.users); start += 10_000 {
			res, err := s.api.AddSegmentMembersWithResponse(ctx, "all", client.MemberIDs{UserIDs: s.users[start:min(start+10_000, len(s.users))]})
			answered(s.t, http.StatusOK, res, err)
		}
	} else {
		require.Equal(s.t, http.StatusOK, seg.StatusCode(), "%s", seg.Body)
	}
	s.msgID = s.send(client.NewMessage{
		Audience: client.Audience{Type: client.AudienceTypeSegment, ID: new("all")},
		Payload:  client.Payload{Title: new("digest"), Body: new("twenty thousand of these")},
	}).MessageID
	return s.msgID
}

// diagnose logs what a failed fan-out test needs to be understood: the
// chunk jobs' attempts and errors, and the ledger by attempt and outcome.
func (s *fanOutSetup) diagnose() {
	ctx := context.Background()
	for _, q := range []string{
		`SELECT state, attempt, count(*), coalesce(string_agg(DISTINCT left(e->>'error', 200), ' | '), '')
		   FROM river_job LEFT JOIN LATERAL unnest(errors) e ON true
		  WHERE kind LIKE 'fan_out%' GROUP BY state, attempt ORDER BY state, attempt`,
		`SELECT status, attempt, coalesce(reason, ''), count(*)::text FROM ledger
		  GROUP BY status, attempt, reason ORDER BY status, attempt`,
		`SELECT d.device_id, v.token, d.attempted_at, d.accepted_at FROM ledger d JOIN devices v ON v.id = d.device_id WHERE attempt > 1 ORDER BY device_id LIMIT 50`,
		`SELECT 'unclosed chunks', j.state, count(*) FROM message_chunks mc LEFT JOIN river_job j ON j.id = mc.job_id
		  WHERE mc.finished_at IS NULL GROUP BY j.state`,
	} {
		rows, err := s.db.Pool.Query(ctx, q)
		if err != nil {
			s.t.Logf("diagnose: %v", err)
			continue
		}
		for rows.Next() {
			vals, _ := rows.Values()
			s.t.Logf("diagnose: %v", vals)
		}
		rows.Close()
	}
	if s.msgID != "" {
		seen := map[string][]time.Time{}
		for _, r := range s.fake.Receipts(s.msgID) {
			seen[r.Token] = append(seen[r.Token], r.ReceivedAt)
		}
		n := 0
		for tok, at := range seen {
			if len(at) > 1 && n < 20 {
				n++
				s.t.Logf("diagnose: twice %s %v", tok, at)
			}
		}
	}
	st := s.fake.Stats()
	s.t.Logf("diagnose: fakepush apns %+v fcm %+v", st.APNs, st.FCM)
}

func (s *fanOutSetup) accepted() int64 {
	st := s.fake.Stats()
	return st.APNs.Accepted + st.FCM.Accepted
}

// checkOnceEach checks the ledger and fakepush after a fan-out: every device
// settled exactly once (accepted), and any push fakepush took twice carried
// the message id as its collapse key, so the device showed it once.
func (s *fanOutSetup) checkOnceEach(id string, devices int) (duplicates int) {
	s.t.Helper()
	st := s.settle(id, 3*time.Minute)
	require.Equal(s.t, client.MessageStateDispatched, st.State)
	require.Equal(s.t, client.DeliveryCounts{Total: devices, Accepted: devices}, st.Deliveries)
	require.Len(s.t, s.deliveries(id, client.DeliveryStatusAccepted), devices, "one ledger row per device, each accepted")

	receipts := s.fake.Receipts(id)
	perDevice := map[string]int{}
	for _, r := range receipts {
		require.Equal(s.t, id, r.CollapseKey)
		perDevice[r.Channel+"/"+r.Token]++
	}
	require.Len(s.t, perDevice, devices, "every device got the push")
	stats := s.fake.Stats()
	return int(stats.APNs.Duplicates + stats.FCM.Duplicates)
}

// TestE2ECrashMidFanOut kills -9 the only worker in the middle of a
// 20,000-device fan-out (40 ms provider latency) and starts another: the
// message still ends with every device settled once, and the pushes sent
// twice are at most the requests that can be in flight at the kill (500 per
// provider): the answers a process had and had not yet written are about
// one ledger write's worth (jobs/ledger.go), and the requests cut short by
// the kill are not taken by fakepush.
func TestE2ECrashMidFanOut(t *testing.T) {
	t.Parallel()
	const devices = 20_000
	s := newFanOutSetupOn(t, devices, dbtest.New(t), 40*time.Millisecond)
	id := s.schedule()

	first := startWorker(t, s.vars)
	require.Eventually(t, func() bool { return s.accepted() >= devices/4 }, 2*time.Minute, 5*time.Millisecond,
		"the first worker never got going:\n%s", first.out.String())
	inFlight := s.fake.Stats().Process.InFlight
	// Sends the first worker gave up on (timeouts on a loaded machine)
	// leave their deliveries pending without holding a place: fakepush may
	// have taken them, and they are sent again.
	firstUnanswered := first.unanswered(t)
	first.kill(t)
	// Requests the dead process had already written may still be answered,
	// and some may still sit unread in fakepush's socket buffers, which its
	// in-flight count does not see (a busy machine showed three). The count
	// is final once nothing is in flight and it has stopped moving.
	var atKill int64
	require.Eventually(t, func() bool {
		before := s.accepted()
		if s.fake.Stats().Process.InFlight != 0 {
			return false
		}
		time.Sleep(300 * time.Millisecond)
		atKill = s.accepted()
		return atKill == before && s.fake.Stats().Process.InFlight == 0
	}, time.Minute, 5*time.Millisecond)
	var recorded int64
	require.NoError(t, s.db.Pool.QueryRow(context.Background(),
		"SELECT count(*) FROM ledger WHERE status = 'accepted'").Scan(&recorded))
	t.Logf("killed the worker with %d requests in flight and %d of %d pushes accepted by fakepush, %d of them recorded",
		inFlight, atKill, devices, recorded)
	require.Less(t, atKill, int64(devices), "the fan-out finished before the kill; the test proved nothing")

	second := startWorker(t, s.vars)
	dups := s.checkOnceEach(id, devices)
	// A device gets a second send only if the process died between the
	// provider's answer and the ledger write, or if a send got no answer
	// (a timeout on a loaded machine) though the provider took it: the
	// duplicates are at most the pushes accepted but not recorded at the
	// kill, plus the second worker's unanswered sends. A push holds a place
	// in its lane's ledger writer from its request until its answer is
	// written, and there are jobs.MaxUnwritten places: the first term is at
	// most that, however slowly a loaded machine writes (the message is
	// bulk, one lane).
	unanswered := second.unanswered(t)
	t.Logf("duplicates after the crash: %d; unanswered sends of the first worker before the kill: %d, of the second: %d",
		dups, firstUnanswered, unanswered)
	require.LessOrEqual(t, int64(dups), atKill-recorded+unanswered)
	require.LessOrEqual(t, int64(dups), jobs.MaxUnwritten+firstUnanswered+unanswered,
		"more answers were lost with the process than the ledger writer lets be unwritten")
}

// TestE2EWorkerGoneIsTakenOverInSeconds kills -9 one of two workers in the
// middle of a 20,000-device fan-out. River's own rescue is an hour away, so
// only the takeover can finish the dead worker's chunks: the survivor makes
// them available as soon as the dead worker's liveness lock has been free
// for the grace (2 s), and the message ends with every device accepted
// once, the duplicates within what the dead worker can have had in flight.
// How long after the kill the message settled is logged, not asserted (a
// speed; a busy machine would make a bound flaky).
func TestE2EWorkerGoneIsTakenOverInSeconds(t *testing.T) {
	t.Parallel()
	const devices = 20_000
	s := newFanOutSetupOn(t, devices, dbtest.New(t), 40*time.Millisecond)
	s.onlyTakeover()
	a, b := startListeningWorkers(t, s.vars)
	id := s.schedule()
	require.Eventually(t, func() bool { return s.accepted() >= devices/4 }, 2*time.Minute, 5*time.Millisecond,
		"the fan-out never got going:\n%s\n%s", a.out.String(), b.out.String())
	aUnanswered := a.unanswered(t)
	a.kill(t)
	killedAt := time.Now()
	require.Less(t, s.accepted(), int64(devices), "the fan-out finished before the kill; the test proved nothing")

	dups := s.checkOnceEach(id, devices)
	settled := time.Since(killedAt)
	families, err := heraldbench.ScrapeMetrics(b.base(t))
	require.NoError(t, err)
	takenOver := heraldbench.MetricSum(families, "herald_chunks_taken_over_total", nil)
	bUnanswered := b.unanswered(t)
	t.Logf("settled %s after the kill; %.0f chunks taken over; duplicates %d; unanswered sends %d (killed worker) and %d",
		settled.Round(time.Millisecond), takenOver, dups, aUnanswered, bUnanswered)
	require.Positive(t, takenOver, "the survivor took over none of the dead worker's chunks")
	require.LessOrEqual(t, int64(dups), jobs.MaxUnwritten+aUnanswered+bUnanswered,
		"more answers were lost with the process than the ledger writer lets be unwritten")
}

// TestE2ETwoWorkersShareTheFanOut runs two worker processes on one database:
// they split the chunks, and no device gets the push twice unless a send to
// it went unanswered (a timeout, which a loaded test machine can cause) and
// so had to be made again.
func TestE2ETwoWorkersShareTheFanOut(t *testing.T) {
	t.Parallel()
	const devices = 20_000
	s := newFanOutSetup(t, devices)
	// A process fetches as many chunks as it has free workers; with the
	// default 50 the first would take all 40 chunks. A deployment of
	// several workers sizes them to share (docs/operations.md, Sizing).
	s.vars["HERALD_BULK_WORKERS"] = "10"
	a, b := startListeningWorkers(t, s.vars)
	id := s.schedule()
	dups := s.checkOnceEach(id, devices)
	unanswered := a.unanswered(t) + b.unanswered(t)
	t.Logf("duplicates: %d; unanswered sends: %d", dups, unanswered)
	require.LessOrEqual(t, int64(dups), unanswered, "a device got the push twice though every send was answered")

	// Both processes worked chunks of it.
	var clients int
	require.NoError(t, s.db.Pool.QueryRow(context.Background(),
		"SELECT count(DISTINCT attempted_by[array_length(attempted_by, 1)]) FROM river_job WHERE kind LIKE 'fan_out%'").Scan(&clients))
	require.Equal(t, 2, clients, "both workers should have taken chunks")
}

// onlyTakeover sets the workers' chunks never to time out nor be rescued by
// River within the test (an hour away), with ten bulk workers each: only
// the takeover can move a gone worker's chunks.
func (s *fanOutSetup) onlyTakeover() {
	s.vars["HERALD_BULK_WORKERS"] = "10"
	s.vars["HERALD_CHUNK_TIMEOUT"] = "50m"
	s.vars["HERALD_RESCUE_AFTER"] = "1h"
}
