package api

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// BenchmarkRegisterDevicesBatch measures POST /v1/devices/batch with 10,000
// new devices (a third each APNs, FCM, Web Push) for 3,334 new users, end to
// end through the handler and a real PostgreSQL.
func BenchmarkRegisterDevicesBatch(b *testing.B) {
	bb := setup(b)
	for i := 0; b.Loop(); i++ {
		b.StopTimer()
		devices := batchOf(maxBatchDevices, func(j int) string { return fmt.Sprintf("b%d_u%d", i, j/3) })
		for j, d := range devices {
			switch d["channel"] {
			case "apns":
				d["token"] = fmt.Sprintf("%032x%032x", i, j)
			case "fcm":
				d["token"] = fmt.Sprintf("fcm-%d-%d", i, j)
			default:
				d["subscription"].(map[string]any)["endpoint"] = fmt.Sprintf("https://push.example.test/webpush/%d-%d", i, j)
			}
		}
		body, err := json.Marshal(map[string]any{"devices": devices})
		require.NoError(b, err)
		b.StartTimer()

		rec := bb.call(b, request{method: http.MethodPost, path: "/v1/devices/batch", body: body})
		require.Equal(b, http.StatusOK, rec.Code, rec.Body.String())
	}
	b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N)/maxBatchDevices, "µs/device")
}

// BenchmarkAddSegmentMembers measures adding 10,000 new users to a segment
// in one call.
func BenchmarkAddSegmentMembers(b *testing.B) {
	bb := setup(b)
	status, _ := bb.do(b, http.MethodPut, "/v1/segments/bench", map[string]any{"name": "bench"})
	require.Equal(b, http.StatusCreated, status)
	for i := 0; b.Loop(); i++ {
		b.StopTimer()
		body, err := json.Marshal(map[string]any{"user_ids": userIDs(fmt.Sprintf("b%d_", i), maxMembersPerCall)})
		require.NoError(b, err)
		b.StartTimer()

		rec := bb.call(b, request{method: http.MethodPost, path: "/v1/segments/bench/members", body: body})
		require.Equal(b, http.StatusOK, rec.Code, rec.Body.String())
	}
}

// BenchmarkScheduleSegment measures POST /v1/messages to a 10,000-user
// segment of about 25,000 devices (2 or 3 each): audience expansion, payload,
// ledger (COPY), 50 chunk jobs, all in one transaction.
func BenchmarkScheduleSegment(b *testing.B) {
	bb := setup(b)
	bb.segmentOf25k(b)
	body, err := json.Marshal(messageBody(map[string]any{"type": "segment", "id": "all"}))
	require.NoError(b, err)

	b.ResetTimer()
	for b.Loop() {
		rec := bb.call(b, request{method: http.MethodPost, path: "/v1/messages", body: body})
		require.Equal(b, http.StatusAccepted, rec.Code, rec.Body.String())
	}
}

// segmentOf25k registers 10,000 users with 2 or 3 devices each (25,000 in
// all) in segment "all", and gathers the planner's statistics, as a
// production database has them.
func (bb *bundle) segmentOf25k(b *testing.B) {
	const users = 10_000
	var devices []map[string]any
	for u := range users {
		for d := range 2 + u%2 {
			user := fmt.Sprintf("u%d", u)
			switch (u + d) % 3 {
			case 0:
				devices = append(devices, map[string]any{"user_id": user, "channel": "apns", "token": fmt.Sprintf("%064x", u*10+d)})
			case 1:
				devices = append(devices, map[string]any{"user_id": user, "channel": "fcm", "token": fmt.Sprintf("fcm-%d-%d-%s", u, d, strings.Repeat("x", 140))})
			default:
				devices = append(devices, map[string]any{"user_id": user, "channel": "webpush", "subscription": map[string]any{
					"endpoint": fmt.Sprintf("https://push.example.test/webpush/%d-%d", u, d),
					"keys":     map[string]any{"p256dh": fixedP256dh, "auth": "AAAAAAAAAAAAAAAAAAAAAA"},
				}})
			}
		}
	}
	for start := 0; start < len(devices); start += maxBatchDevices {
		rec := bb.call(b, request{method: http.MethodPost, path: "/v1/devices/batch", body: map[string]any{"devices": devices[start:min(start+maxBatchDevices, len(devices))]}})
		require.Equal(b, http.StatusOK, rec.Code, rec.Body.String())
	}
	status, _ := bb.do(b, http.MethodPut, "/v1/segments/all", map[string]any{"name": "all"})
	require.Equal(b, http.StatusCreated, status)
	status, _ = bb.do(b, http.MethodPost, "/v1/segments/all/members", map[string]any{"user_ids": userIDs("u", users)})
	require.Equal(b, http.StatusOK, status)
	_, err := bb.db.Pool.Exec(context.Background(), "ANALYZE")
	require.NoError(b, err)
}

// BenchmarkGetMessageWhileDispatching measures GET /v1/messages/{id} for a
// 25,000-device message in the middle of its fan-out, when its skew
// percentiles are computed from the ledger (once settled they are read from
// the message row).
func BenchmarkGetMessageWhileDispatching(b *testing.B) {
	bb := setup(b)
	bb.segmentOf25k(b)
	status, resp := bb.do(b, http.MethodPost, "/v1/messages", messageBody(map[string]any{"type": "segment", "id": "all"}))
	require.Equal(b, http.StatusAccepted, status)
	id := resp["message_id"].(string)
	_, err := bb.db.Pool.Exec(context.Background(), `
		WITH a AS (UPDATE deliveries SET status = 'accepted', attempt = 1, attempted_at = due_at,
			accepted_at = due_at + (device_id % 1000) * interval '1 millisecond'
			WHERE message_id = $1 RETURNING 1)
		UPDATE messages SET state = 'dispatching', accepted_count = (SELECT count(*) FROM a),
			pending_count = device_count - (SELECT count(*) FROM a) WHERE id = $1`, strings.TrimPrefix(id, "msg_"))
	require.NoError(b, err)

	b.ResetTimer()
	for b.Loop() {
		rec := bb.call(b, request{method: http.MethodGet, path: "/v1/messages/" + id})
		require.Equal(b, http.StatusOK, rec.Code)
	}
}

// BenchmarkScheduleUrgentSingle measures one-device urgent messages sent by
// 8 concurrent clients (b.SetParallelism(4) on 2 cores).
func BenchmarkScheduleUrgentSingle(b *testing.B) {
	// One key sends as fast as the process serves: past the default rate
	// limit, which this measures around.
	bb := setupWith(b, dbtestNew(b), Config{RateLimit: 1e9, RateBurst: 1e9})
	rec := bb.call(b, request{method: http.MethodPost, path: "/v1/devices", body: map[string]any{"user_id": "otp", "channel": "apns", "token": apnsToken()}})
	require.Equal(b, http.StatusCreated, rec.Code)
	msg := messageBody(map[string]any{"type": "users", "ids": []string{"otp"}})
	msg["priority"] = "urgent"
	delete(msg, "dispatch_at")
	body, err := json.Marshal(msg)
	require.NoError(b, err)

	b.SetParallelism(8 / runtime.GOMAXPROCS(0))
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			rec := bb.call(b, request{method: http.MethodPost, path: "/v1/messages", body: body})
			if rec.Code != http.StatusAccepted {
				b.Errorf("status %d: %s", rec.Code, rec.Body.String())
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
}

// BenchmarkDeleteUser measures DELETE /v1/users/{id} of a user with 2 or 3
// devices in a directory of 10,000 users, while ten messages to all of them
// (500 chunk jobs, 250,000 ledger rows) wait to be sent: the pending
// deliveries are cancelled and the devices' tokens taken out of the chunk
// jobs that hold them.
func BenchmarkDeleteUser(b *testing.B) {
	bb := setup(b)
	bb.segmentOf25k(b)
	body, err := json.Marshal(messageBody(map[string]any{"type": "segment", "id": "all"}))
	require.NoError(b, err)
	for range 10 {
		rec := bb.call(b, request{method: http.MethodPost, path: "/v1/messages", body: body})
		require.Equal(b, http.StatusAccepted, rec.Code, rec.Body.String())
	}
	_, err = bb.db.Pool.Exec(context.Background(), "ANALYZE")
	require.NoError(b, err)

	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		rec := bb.call(b, request{method: http.MethodDelete, path: fmt.Sprintf("/v1/users/u%d", i)})
		require.Equal(b, http.StatusNoContent, rec.Code, rec.Body.String())
	}
}
