package main

import (
	"sort"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/heraldpush/herald/db/dbtest"
	"github.com/heraldpush/herald/jobs/quota"
)

// TestE2EQuotaSharedByWorkers runs three worker processes, each with both
// lanes, against one Firebase project whose quota is 3,000 sends a second
// (HERALD_RATE_FCM, counted over a second: HERALD_RATE_WINDOW=1s). Each
// process used to keep to the whole quota per lane, six times it together.
// Now fakepush sees no second, however it falls, with more than 3,000 FCM
// sends, and the fan-out goes at close to the quota; the ratio is logged
// (docs/performance.md). It runs alone, before the tier's parallel tests:
// what fakepush sees of a second depends on how promptly a loaded machine
// carries requests, which the quota leaves 150 ms for (quota.Jitter).
func TestE2EQuotaSharedByWorkers(t *testing.T) {
	const devices, rate = 24_000, 3000
	s := newFanOutSetupOn(t, devices, dbtest.New(t), 20*time.Millisecond)
	s.vars["HERALD_RATE_FCM"] = "3000"
	s.vars["HERALD_RATE_WINDOW"] = "1s"
	for range 3 {
		startWorker(t, s.vars).base(t)
	}
	id := s.schedule()
	// Every device once in the ledger; a push sent twice is one that went
	// unanswered on a loaded machine, which the quota has nothing to do
	// with (the crash tests hold that bound).
	dups := s.checkOnceEach(id, devices)

	var at []time.Time
	for _, r := range s.fake.Receipts(id) {
		if r.Channel == "fcm" {
			at = append(at, r.ReceivedAt)
		}
	}
	require.GreaterOrEqual(t, len(at), devices/2)
	sort.Slice(at, func(i, j int) bool { return at[i].Before(at[j]) })
	most := quota.Busiest(at, time.Second)
	span := at[len(at)-1].Sub(at[0]).Seconds()
	t.Logf("%d FCM sends in %.2f s by three workers: %.0f a second, %.2f of the quota of %d; the busiest second carried %d; %d pushes sent twice",
		len(at), span, float64(len(at))/span, float64(len(at))/span/rate, rate, most, dups)
	require.LessOrEqual(t, most, rate, "a second carried more FCM sends than the project's quota")
}
