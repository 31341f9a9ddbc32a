package main

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/heraldpush/herald/api/client"
	"github.com/heraldpush/herald/cmd/herald/heraldbench"
	"github.com/heraldpush/herald/db/dbtest"
)

// TestE2ERestoreFromBackupMidFanOut takes a base backup of Herald's database
// (pg_basebackup -X stream) a fifth of the way into a 20,000-device fan-out,
// lets the fan-out finish, stops Herald and the database, and starts Herald
// (an API and a worker, the same fakepush) on a cluster started from the
// backup, as a restore to that point would leave it. The message's chunks
// were running in the backup under a worker whose liveness lock no restore
// brings back, so the new worker takes them over; the devices the backup had
// not recorded are sent the push again, with the same collapse id, and none
// is lost. What was made after the backup point (a device, messages) is
// gone, and the API must be told again. The figures are logged
// (docs/operations.md, Backups and restore).
func TestE2ERestoreFromBackupMidFanOut(t *testing.T) {
	t.Parallel()
	const devices = 20_000
	ctx := context.Background()
	c := dbtest.NewCluster(t)
	s := newFanOutSetupOn(t, devices, &dbtest.DB{Pool: c.Pool(), URL: c.URL}, 40*time.Millisecond)
	// As dbFaultSetup: fewer requests in flight than the default, so that a
	// loaded machine leaves none unanswered, and River's rescue well after
	// the takeover, so that the takeover is what is seen.
	s.vars["HERALD_MAX_IN_FLIGHT_APNS"] = "50"
	s.vars["HERALD_MAX_IN_FLIGHT_FCM"] = "50"
	s.vars["HERALD_CHUNK_TIMEOUT"] = "60s"
	s.vars["HERALD_RESCUE_AFTER"] = "65s"

	var (
		backup                         *dbtest.Cluster
		backupTook                     time.Duration
		recordedAtStart, recordedAtEnd int64
	)
	w := s.faultMidFanOut(devices, func() {
		recordedAtStart = s.recorded()
		start := time.Now()
		backup = c.Backup()
		backupTook = time.Since(start)
		recordedAtEnd = s.recorded()
	})
	// The fan-out ends on the original database as if nothing happened.
	firstDups := s.checkOnceEach(s.msgID, devices)
	firstUnanswered := w.unanswered(t)

	// After the backup point: a device registered and messages sent to it,
	// more of them than PostgreSQL logs a sequence ahead (32), so that
	// their ids are past anything the backup's sequence can have reached.
	const later = 40
	s.registerDevice(client.DeviceRegistration{UserID: "after", Channel: client.ChannelFCM, Token: new("after-token")})
	var afterIDs []string
	for i := range later {
		afterIDs = append(afterIDs, s.send(client.NewMessage{Audience: toUsers("after"), Payload: titled(fmt.Sprintf("after %d", i))}).MessageID)
	}
	for _, id := range afterIDs {
		require.Equal(t, client.DeliveryCounts{Total: 1, Accepted: 1}, s.settle(id, 3*time.Minute).Deliveries)
	}

	// Herald and the database stop; what fakepush took by then is final.
	w.kill(t)
	require.NoError(t, s.stop())
	c.Stop()
	before := map[string]int{}
	for _, r := range s.fake.Receipts(s.msgID) {
		before[r.Channel+"/"+r.Token]++
	}
	acceptedBefore := s.accepted()
	dupsBefore := s.fake.Stats().APNs.Duplicates + s.fake.Stats().FCM.Duplicates

	// The restore: the backup's cluster started, Herald on it.
	backup.Start()
	restored := &dbtest.DB{Pool: backup.Pool(), URL: backup.URL}
	msg, err := strconv.ParseInt(strings.TrimPrefix(s.msgID, "msg_"), 10, 64)
	require.NoError(t, err)
	var atPoint, runningAtPoint int64
	var stateAtPoint string
	require.NoError(t, restored.Pool.QueryRow(ctx, "SELECT count(*) FROM ledger WHERE message_id = $1 AND status = 'accepted'", msg).Scan(&atPoint))
	require.NoError(t, restored.Pool.QueryRow(ctx, "SELECT count(*) FROM river_job WHERE kind LIKE 'fan_out%' AND state = 'running'").Scan(&runningAtPoint))
	require.NoError(t, restored.Pool.QueryRow(ctx, "SELECT state FROM messages WHERE id = $1", msg).Scan(&stateAtPoint))
	require.Less(t, atPoint, int64(devices), "the backup had the whole fan-out recorded; the test proved nothing")
	require.Equal(t, "dispatching", stateAtPoint)
	unrecorded := map[string]bool{}
	rows, err := restored.Pool.Query(ctx, `SELECT v.channel || '/' || v.token FROM ledger l JOIN devices v ON v.id = l.device_id
		WHERE l.message_id = $1 AND l.status <> 'accepted'`, msg)
	require.NoError(t, err)
	for rows.Next() {
		var key string
		require.NoError(t, rows.Scan(&key))
		unrecorded[key] = true
	}
	require.NoError(t, rows.Err())
	require.Len(t, unrecorded, devices-int(atPoint))

	// What the restored sequence hands out next, and then the step
	// docs/operations.md gives before Herald starts on a restored database:
	// every sequence moved past what it can have handed out.
	var last int64
	var called bool
	require.NoError(t, restored.Pool.QueryRow(ctx, "SELECT last_value, is_called FROM messages_id_seq").Scan(&last, &called))
	if called {
		last++
	}
	nextAtPoint := fmt.Sprintf("msg_%d", last)
	_, err = restored.Pool.Exec(ctx, restoreStep(t))
	require.NoError(t, err)

	vars := maps.Clone(s.vars)
	vars["DATABASE_URL"] = restored.URL
	base, stop := startServe(t, maps.Clone(vars), "--role", "api")
	t.Cleanup(func() { _ = stop() })
	s.e2e = &e2e{t: t, fake: s.fake, base: base, stop: stop, api: newAPIClient(t, base, testAPIKey)}
	s.db = restored
	restartedAt := time.Now()
	w2 := startWorker(t, vars)
	metrics := w2.base(t)
	// The chunks running at the point are taken over (their worker's
	// liveness lock is nowhere): logged, not asserted, how soon.
	var takenOverAfter time.Duration
	require.Eventually(t, func() bool {
		families, err := heraldbench.ScrapeMetrics(metrics)
		if err != nil || heraldbench.MetricSum(families, "herald_chunks_taken_over_total", nil) < float64(runningAtPoint) {
			return false
		}
		takenOverAfter = time.Since(restartedAt)
		return true
	}, 3*time.Minute, 100*time.Millisecond, "the chunks running in the backup were not taken over:\n%s", w2.out.String())

	// The message settles on the restored database with every device
	// accepted once in its ledger; the devices the backup had not recorded
	// get the push again, and only they, unless a send went unanswered.
	s.checkOnceEach(s.msgID, devices)
	settled := time.Since(restartedAt)
	resent, resentRecorded := 0, 0
	perDevice := map[string]int{}
	for _, r := range s.fake.Receipts(s.msgID) {
		perDevice[r.Channel+"/"+r.Token]++
	}
	for key, n := range perDevice {
		if n == before[key] {
			continue
		}
		resent++
		if !unrecorded[key] {
			resentRecorded++
		}
	}
	for key := range unrecorded {
		require.Greater(t, perDevice[key], before[key], "device %s, not recorded at the backup point, was not sent the push again", key)
	}
	unanswered := w2.unanswered(t)
	families, err := heraldbench.ScrapeMetrics(metrics)
	require.NoError(t, err)
	takenOver := heraldbench.MetricSum(families, "herald_chunks_taken_over_total", nil)
	st := s.fake.Stats()
	sentAgain := st.APNs.Accepted + st.FCM.Accepted - acceptedBefore
	dupsAfter := st.APNs.Duplicates + st.FCM.Duplicates - dupsBefore
	t.Logf("backup of a %d-device fan-out: taken in %s, %d deliveries recorded at its start, %d at its end, %d in the restored database (%d chunks running, the message %s); "+
		"the original fan-out: %d duplicates, %d unanswered sends",
		devices, backupTook.Round(time.Millisecond), recordedAtStart, recordedAtEnd, atPoint, runningAtPoint, stateAtPoint, firstDups, firstUnanswered)
	t.Logf("restored Herald: took over the %d chunks running at the point %s after its worker's start and settled the message %s after it; %.0f chunks taken over in all; sent again to %d devices (%d pushes, %d duplicates as fakepush counts them), "+
		"%d of them recorded accepted at the backup point; unanswered sends %d; lost 0",
		runningAtPoint, takenOverAfter.Round(time.Millisecond), settled.Round(time.Millisecond), takenOver, resent, sentAgain, dupsAfter, resentRecorded, unanswered)
	require.LessOrEqual(t, int64(resentRecorded), unanswered, "a device the backup had recorded was sent the push again though every send was answered")
	if runningAtPoint > 0 {
		require.Positive(t, takenOver, "no chunk running in the backup was taken over")
	}

	// What was made after the backup point is gone: the device and the
	// messages are unknown to the restored Herald, and nothing more is sent
	// to them.
	users, err := s.api.ListUserDevicesWithResponse(ctx, "after", nil)
	answered(t, http.StatusNotFound, users, err)
	for _, id := range afterIDs {
		res, err := s.api.GetMessageWithResponse(ctx, id)
		answered(t, http.StatusNotFound, res, err)
		require.Len(t, s.fake.Receipts(id), 1, "message %s, made after the backup point", id)
	}
	// Told again, Herald sends it again, under an id past every one handed
	// out after the point: the step moved the sequences on.
	s.registerDevice(client.DeviceRegistration{UserID: "after", Channel: client.ChannelFCM, Token: new("after-token")})
	again := s.send(client.NewMessage{Audience: toUsers("after"), Payload: titled("after, again")}).MessageID
	require.Equal(t, client.DeliveryCounts{Total: 1, Accepted: 1}, s.settle(again, 3*time.Minute).Deliveries)
	t.Logf("after the restore: the device and the %d messages made after the backup point are gone (404); ids after the point were %s to %s, "+
		"and the restored database would have handed out %s next; after the step the message sent again got %s",
		later, afterIDs[0], afterIDs[later-1], nextAtPoint, again)
	againID, err := strconv.ParseInt(strings.TrimPrefix(again, "msg_"), 10, 64)
	require.NoError(t, err)
	lastAfter, err := strconv.ParseInt(strings.TrimPrefix(afterIDs[later-1], "msg_"), 10, 64)
	require.NoError(t, err)
	require.Greater(t, againID, lastAfter, "a message made after the restore has the id of one made after the point")
}

// restoreStep is the statement docs/operations.md (Backups and restore)
// gives to run on a restored database before Herald starts on it: its
// first sql block.
func restoreStep(t *testing.T) string {
	t.Helper()
	doc := readDoc(t, "docs/operations.md")
	_, section, ok := strings.Cut(doc, "\n## Backups and restore\n")
	require.True(t, ok, "docs/operations.md has no Backups and restore")
	_, block, ok := strings.Cut(section, "\n```sql\n")
	require.True(t, ok, "Backups and restore has no sql block")
	stmt, _, ok := strings.Cut(block, "\n```\n")
	require.True(t, ok)
	return stmt
}
