package db_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/heraldpush/herald/db"
	"github.com/heraldpush/herald/db/dbtest"
)

// BenchmarkClaimQuota claims a provider quota's tokens over and over, as the
// chunks sending under it do a few times each, and reports PostgreSQL's
// CPU (every process of the cluster's) and the wall time a claim. On a
// cluster whose WAL is on a disk, a claim that waited for it spent both on
// the flush.
func BenchmarkClaimQuota(b *testing.B) {
	ctx := context.Background()
	tdb := dbtest.New(b)
	cpu := clusterCPU(b, tdb.Pool)
	claim := db.QuotaClaim{Key: "bench", Rate: 1e9, Capacity: 1e9, Want: 10}
	_, _, err := db.ClaimQuota(ctx, tdb.Pool, claim)
	require.NoError(b, err)
	b.ResetTimer()
	t0, w0 := cpu(), time.Now()
	for range b.N {
		n, _, err := db.ClaimQuota(ctx, tdb.Pool, claim)
		require.NoError(b, err)
		require.Equal(b, claim.Want, n)
	}
	b.ReportMetric(float64((cpu()-t0).Microseconds())/float64(b.N), "pg_us/claim")
	b.ReportMetric(float64(time.Since(w0).Microseconds())/float64(b.N), "wall_us/claim")
}
