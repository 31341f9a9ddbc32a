package quota

import (
	"context"
	"io"
	"log/slog"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/heraldpush/herald/db"
	"github.com/heraldpush/herald/db/dbtest"
)

var discard = slog.New(slog.NewTextHandler(io.Discard, nil))

// TestQuotaSharedByProcesses: three processes (three Stores on one
// database), each with an urgent and a bulk lane of several senders, take
// turns under one quota of 1,500 a second counted over a second: no second,
// however it falls, carries more than 1,500 sends, and together they send
// at close to the quota, not at a third of it.
func TestQuotaSharedByProcesses(t *testing.T) {
	t.Parallel()
	tdb := dbtest.New(t)
	const rate, run = 1500.0, 2500 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), run)
	defer cancel()
	var (
		mu sync.Mutex
		at []time.Time
		wg sync.WaitGroup
	)
	for range 3 {
		b := NewStore(discard).Bucket("fcm:shared", rate, time.Second)
		for _, urgent := range []bool{true, false, false} {
			p := b.Pacer(urgent, tdb.Pool)
			for range 4 {
				wg.Go(func() {
					for p.Wait(ctx) == nil {
						mu.Lock()
						at = append(at, time.Now())
						mu.Unlock()
					}
				})
			}
		}
	}
	wg.Wait()
	sort.Slice(at, func(i, j int) bool { return at[i].Before(at[j]) })
	most := Busiest(at, time.Second)
	span := at[len(at)-1].Sub(at[0]).Seconds()
	t.Logf("%d sends in %.2f s (%.0f a second against a quota of %.0f); the busiest second carried %d", len(at), span, float64(len(at))/span, rate, most)
	require.LessOrEqual(t, most, int(rate), "a second carried more than the quota")
	require.Greater(t, float64(len(at)), 0.5*rate*span, "the processes together sent far below the quota, as if each kept to a share")
}

// TestClaimQuotaLeavesTheReserve: a claim refills the bucket by the time
// since the last, up to its capacity, and grants whole tokens above the
// reserve, at most what it asks; the bulk lane's reserve is the urgent
// lane's first claim.
func TestClaimQuotaLeavesTheReserve(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tdb := dbtest.New(t)
	claim := func(want int, reserve float64) (int, float64) {
		t.Helper()
		n, left, err := db.ClaimQuota(ctx, tdb.Pool, db.QuotaClaim{Key: "k", Rate: 20, Capacity: 10, Want: want, Reserve: reserve})
		require.NoError(t, err)
		return n, left
	}
	n, _, err := db.ClaimQuota(ctx, tdb.Pool, db.QuotaClaim{Key: "slow", Rate: 0.01, Capacity: 10, Want: 15})
	require.NoError(t, err)
	require.Equal(t, 10, n, "a new bucket starts full: nothing was sent under it")
	n, _, err = db.ClaimQuota(ctx, tdb.Pool, db.QuotaClaim{Key: "slow", Rate: 0.01, Capacity: 10, Want: 15})
	require.NoError(t, err)
	require.Zero(t, n, "and empties")
	claim(100, 0)                      // makes k's row, and empties it
	time.Sleep(700 * time.Millisecond) // refills past its capacity (20 a second)
	// A token more refills for every 50 ms a loaded machine takes between
	// two claims: hence the ranges.
	n, left := claim(100, 4)
	require.GreaterOrEqual(t, n, 6, "the bulk lane takes what is above its reserve")
	require.LessOrEqual(t, n, 7, "the bulk lane leaves the reserve")
	require.GreaterOrEqual(t, left, 4.0)
	n, _ = claim(100, 0)
	require.GreaterOrEqual(t, n, 4, "the urgent lane takes the reserve")
	require.LessOrEqual(t, n, 6)

	b := newBucket(nil, "k", 3000, time.Second)
	require.InDelta(t, 3000, b.capacity+b.refill*(time.Second+Keep+Jitter).Seconds(), 1, "no second can carry more than the quota")
	b = newBucket(nil, "k", 10_000, time.Minute)
	require.InDelta(t, 30_000, b.capacity, 1, "an instant may send a twentieth of a minute's quota at once")
	require.InDelta(t, 500, b.Pacer(false, nil).reserve, 1,
		"the bulk lane leaves 50 ms worth to the urgent lane, not half a bucket it would wait 1.6 s for when it drained it")
	require.Zero(t, b.Pacer(true, nil).reserve)
}
