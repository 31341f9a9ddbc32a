package db_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/heraldpush/herald/db"
	"github.com/heraldpush/herald/db/dbtest"
)

// BenchmarkLedgerFailureEvents is the PostgreSQL CPU, per device, of the
// ledger writes of a 25,000-device message every delivery of which fails,
// without a webhook and with one that wants delivery.failed, whose events
// the same statement writes to the outbox (docs/performance.md).
func BenchmarkLedgerFailureEvents(b *testing.B) {
	for _, mode := range []string{"none", "wanted"} {
		b.Run(mode, func(b *testing.B) {
			ctx := context.Background()
			tdb := dbtest.New(b)
			cpu := clusterCPU(b, tdb.Pool)
			lifePopulation(b, tdb.Pool, lifeDevices)
			if mode != "none" {
				_, err := tdb.Pool.Exec(ctx, `INSERT INTO webhooks (url, events, secret) VALUES ('https://hooks.example.com/', '{delivery.failed}', 'whsec_AA==')`)
				require.NoError(b, err)
			}
			if mode == "wanted-2idx" || mode == "wanted-1idx" {
				_, err := tdb.Pool.Exec(ctx, `DROP INDEX webhook_events_webhook_idx; DROP INDEX webhook_events_created_idx`)
				require.NoError(b, err)
			}
			if mode == "wanted-1idx" {
				_, err := tdb.Pool.Exec(ctx, `DROP INDEX webhook_events_unclaimed_idx`)
				require.NoError(b, err)
			}
			var total time.Duration
			for range b.N {
				id, _ := scheduleLifeMessage(b, tdb.Pool, lifeDevices, false)
				chunks := (lifeDevices + lifeChunkSize - 1) / lifeChunkSize
				for first := 0; first < chunks; first += lifeChunksPerSave {
					w := db.ChunkWrite{MessageID: id, Settle: true, FailureEvents: mode != "none"}
					for c := first; c < min(first+lifeChunksPerSave, chunks); c++ {
						at := time.Now()
						for d := c*lifeChunkSize + 1; d <= min((c+1)*lifeChunkSize, lifeDevices); d++ {
							w.Results.Add(db.DeliveryKey{MessageID: id, DeviceID: int64(d), UserID: "test", Channel: "apns"}, "failed", "unregistered", at.UnixMicro(), 0)
						}
					}
					t0 := cpu()
					_, err := db.WriteChunks(ctx, tdb.Pool, []db.ChunkWrite{w})
					require.NoError(b, err)
					total += cpu() - t0
				}
				// As the batches' deliveries would.
				_, err := tdb.Pool.Exec(ctx, "DELETE FROM webhook_events")
				require.NoError(b, err)
			}
			b.ReportMetric(float64(total.Microseconds())/float64(b.N*lifeDevices), "write_us/device")
		})
	}
}
