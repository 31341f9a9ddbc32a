package main

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/heraldpush/herald/api/client"
	"github.com/heraldpush/herald/cmd/herald/heraldbench"
	"github.com/heraldpush/herald/db/dbtest"
)

// dbFaultSetup is a fan-out on a PostgreSQL of the test's own, which the
// test restarts or stops under the running worker.
func dbFaultSetup(t *testing.T, devices int) (*fanOutSetup, *dbtest.Cluster) {
	t.Helper()
	c := dbtest.NewCluster(t)
	s := newFanOutSetupOn(t, devices, &dbtest.DB{Pool: c.Pool(), URL: c.URL}, 40*time.Millisecond)
	// Fewer requests in flight than the default 500 per provider: on a
	// loaded test machine a worker with 500 in flight answers some of them
	// after their 5 s timeout, and a send that went unanswered may be sent
	// twice, which would hide what these tests look for. The chunk timeout
	// leaves room for a slow fan-out plus the fault.
	s.vars["HERALD_MAX_IN_FLIGHT_APNS"] = "50"
	s.vars["HERALD_MAX_IN_FLIGHT_FCM"] = "50"
	s.vars["HERALD_CHUNK_TIMEOUT"] = "60s"
	s.vars["HERALD_RESCUE_AFTER"] = "65s"
	return s, c
}

// recorded counts the ledger's accepted deliveries.
func (s *fanOutSetup) recorded() int64 {
	s.t.Helper()
	var n int64
	require.NoError(s.t, s.db.Pool.QueryRow(context.Background(),
		"SELECT count(*) FROM ledger WHERE status = 'accepted'").Scan(&n))
	return n
}

// faultMidFanOut starts a worker, waits until the fan-out is under way with
// part of it still unrecorded, and then runs fault on the database.
func (s *fanOutSetup) faultMidFanOut(devices int, fault func()) *child {
	s.t.Helper()
	w := startWorker(s.t, s.vars)
	w.base(s.t)
	id := s.schedule()
	require.Eventually(s.t, func() bool { return s.accepted() >= int64(devices)/5 }, 2*time.Minute, 2*time.Millisecond,
		"the worker never got going:\n%s", w.out.String())
	recorded := s.recorded()
	require.Less(s.t, recorded, int64(devices), "the fan-out was recorded before the fault; the test proved nothing")
	start := time.Now()
	fault()
	s.t.Logf("message %s: the fault took %s, with %d of %d deliveries recorded before it", id, time.Since(start).Round(time.Millisecond), recorded, devices)
	return w
}

// requireNoResends checks the end of a fan-out that went through a database
// fault: every device reached, none twice unless a send went unanswered,
// and no provider blamed for the database.
func (s *fanOutSetup) requireNoResends(w *child, devices int) {
	s.t.Helper()
	dups := s.checkOnceEach(s.msgID, devices)
	unanswered := w.unanswered(s.t)
	s.t.Logf("duplicates: %d; unanswered sends: %d", dups, unanswered)
	require.LessOrEqual(s.t, int64(dups), unanswered, "a device got the push twice though every send was answered")
	// No chunk gave up what it had sent: a chunk that did so is retried
	// and sends it again, and its cut-short requests count as unanswered,
	// which would make the bound above loose.
	var gaveUp int
	require.NoError(s.t, s.db.Pool.QueryRow(context.Background(),
		`SELECT count(*) FROM river_job, unnest(errors) e WHERE kind LIKE 'fan_out%' AND e->>'error' LIKE '%record results%'`).Scan(&gaveUp))
	require.Zero(s.t, gaveUp, "chunks failed to record their results")
	if unanswered > 0 {
		// The provider timed out (a loaded machine), which may rightly
		// open its breaker.
		return
	}
	require.NotContains(s.t, w.out.String(), "chunk parked", "a provider was blamed for the database")
	for _, channel := range []string{"apns", "fcm"} {
		require.Equal(s.t, "closed", s.breakerState(w, channel), "the %s breaker", channel)
	}
}

// breakerState reads a channel's breaker state from the worker's /metrics.
func (s *fanOutSetup) breakerState(w *child, channel string) string {
	s.t.Helper()
	m := listeningLine.FindStringSubmatch(w.out.String())
	require.NotNil(s.t, m)
	families, err := heraldbench.ScrapeMetrics(m[1])
	require.NoError(s.t, err)
	for _, state := range []string{"closed", "half_open", "open"} {
		if heraldbench.MetricSum(families, "herald_breaker_state", map[string]string{"channel": channel, "state": state}) == 1 {
			return state
		}
	}
	s.t.Fatalf("no breaker state for %s in the worker's metrics", channel)
	return ""
}

// TestE2EDatabaseRestartMidFanOut restarts PostgreSQL (pg_ctl restart -m fast)
// in the middle of a 10,000-device fan-out, quicker than a chunk's timeout:
// the chunks keep what they sent and write it once the database is back, so
// every device gets the push once and neither provider's breaker opens.
func TestE2EDatabaseRestartMidFanOut(t *testing.T) {
	t.Parallel()
	const devices = 10_000
	s, c := dbFaultSetup(t, devices)
	w := s.faultMidFanOut(devices, c.Restart)
	s.requireNoResends(w, devices)
}

// TestE2EDatabaseStopMidFanOut stops PostgreSQL for a few seconds in the middle
// of a fan-out. While it is away the API answers 503 with Retry-After and a
// JSON error and /readyz says not ready; once it is back everything resumes
// by itself and no device gets the push twice.
func TestE2EDatabaseStopMidFanOut(t *testing.T) {
	t.Parallel()
	// Half the restart's fan-out: the end-to-end tests of this package
	// share two cores, and the outage lasts seconds either way.
	const devices = 5_000
	s, c := dbFaultSetup(t, devices)
	w := s.faultMidFanOut(devices, func() {
		c.Stop()
		// What a caller meets while the database is away: 503, a
		// Retry-After and Herald's JSON error, on a read and a write.
		unavailable := func(what string, res answer, header http.Header) {
			require.Equal(t, http.StatusServiceUnavailable, res.StatusCode(), "%s: %s", what, res.GetBody())
			require.NotEmpty(t, header.Get("Retry-After"), what)
			requireAPIError(t, res, "unavailable", "")
		}
		ctx := context.Background()
		msg, err := s.api.GetMessageWithResponse(ctx, s.msgID)
		require.NoError(t, err)
		unavailable("GET /v1/messages/{id}", msg, msg.HTTPResponse.Header)
		late, err := s.api.RegisterDevicesWithResponse(ctx, client.DeviceBatch{Devices: []client.DeviceRegistration{
			{UserID: "late", Channel: client.ChannelFCM, Token: new("late-token")},
		}})
		require.NoError(t, err)
		unavailable("POST /v1/devices/batch", late, late.HTTPResponse.Header)
		resp, err := http.Get(s.base + "/readyz")
		require.NoError(t, err)
		var ready map[string]any
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&ready))
		resp.Body.Close()
		require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode, ready)
		time.Sleep(3 * time.Second)
		c.Start()
	})
	// The API is back by itself.
	require.Eventually(t, func() bool {
		res, err := s.api.GetMessageWithResponse(context.Background(), s.msgID)
		return err == nil && res.StatusCode() == http.StatusOK
	}, 30*time.Second, 100*time.Millisecond)
	s.requireNoResends(w, devices)
}
