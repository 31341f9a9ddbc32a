package api

import (
	"encoding/json"
	"fmt"
	"net/http"
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

		rec := bb.call(request{method: http.MethodPost, path: "/v1/devices/batch", body: body})
		require.Equal(b, http.StatusOK, rec.Code, rec.Body.String())
	}
	b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N)/maxBatchDevices, "µs/device")
}

// BenchmarkAddSegmentMembers measures adding 10,000 new users to a segment
// in one call.
func BenchmarkAddSegmentMembers(b *testing.B) {
	bb := setup(b)
	status, _ := bb.do(http.MethodPut, "/v1/segments/bench", map[string]any{"name": "bench"})
	require.Equal(b, http.StatusCreated, status)
	for i := 0; b.Loop(); i++ {
		b.StopTimer()
		body, err := json.Marshal(map[string]any{"user_ids": userIDs(fmt.Sprintf("b%d_", i), maxMembersPerCall)})
		require.NoError(b, err)
		b.StartTimer()

		rec := bb.call(request{method: http.MethodPost, path: "/v1/segments/bench/members", body: body})
		require.Equal(b, http.StatusOK, rec.Code, rec.Body.String())
	}
}
