package db_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/heraldpush/herald/db"
	"github.com/heraldpush/herald/db/dbtest"
)

// TestFrequencyCapClaimsAreExact: many messages claim a cap of two for the
// same users at once, each on its own connection, their users in
// different orders: exactly two are allowed for each user, none deadlocks,
// and a message that claims again is answered as it was the first time.
func TestFrequencyCapClaimsAreExact(t *testing.T) {
	t.Parallel()
	tdb := dbtest.New(t)
	ctx := context.Background()
	q := db.On(tdb.Pool)
	users := []string{"u1", "u2", "u3", "u4", "u5"}
	require.NoError(t, q.EnsureUsers(ctx, users))
	capped := db.CategoryCap{Category: "promo", Count: 2, PeriodS: 3600}

	// The first claims insert the users' rows, racing; a second race,
	// over a category whose rows exist (with an entry older than the
	// period), updates them.
	over := claimRace(t, tdb, capped, users, 0)
	aged := db.CategoryCap{Category: "aged", Count: 2, PeriodS: 3600}
	_, err := db.ClaimFrequencyCaps(ctx, tdb.Pool, aged, 1000, users)
	require.NoError(t, err)
	_, err = tdb.Pool.Exec(ctx, `UPDATE frequency_caps SET sent_at = ARRAY[now() - interval '2 hours'] WHERE category = 'aged'`)
	require.NoError(t, err)
	claimRace(t, tdb, aged, users, 1000)

	// Claimed again, every message gets the answer it got.
	for m := range over {
		again, err := db.ClaimFrequencyCaps(ctx, tdb.Pool, capped, int64(m+1), users)
		require.NoError(t, err)
		require.Equal(t, fmt.Sprint(over[m]), fmt.Sprint(again), "message %d", m+1)
	}
	// Another category has a history of its own.
	other, err := db.ClaimFrequencyCaps(ctx, tdb.Pool, db.CategoryCap{Category: "news", Count: 1, PeriodS: 3600}, 99, users)
	require.NoError(t, err)
	require.Empty(t, other)
}

// TestFrequencyCapClaimedAgainIsOnlyRead: a message's chunks claim a user
// whose devices fall in several of them; once the user's history holds
// the message, a claim of it only reads the row (its version is the one
// the first claim wrote), as does a claim the full history refuses; and
// chunks claiming the same new users at once all send, the message
// counted once.
func TestFrequencyCapClaimedAgainIsOnlyRead(t *testing.T) {
	t.Parallel()
	tdb := dbtest.New(t)
	ctx := context.Background()
	users := []string{"u1", "u2", "u3", "u4"}
	require.NoError(t, db.On(tdb.Pool).EnsureUsers(ctx, users))
	capped := db.CategoryCap{Category: "promo", Count: 1, PeriodS: 3600}
	// Each row's version: a write makes a new one.
	versions := func() (out map[string]string) {
		require.NoError(t, tdb.Pool.QueryRow(ctx,
			`SELECT jsonb_object_agg(user_id, xmin::text || ctid::text) FROM frequency_caps`).Scan(&out))
		return out
	}

	over, err := db.ClaimFrequencyCaps(ctx, tdb.Pool, capped, 1, []string{"u1", "u2"})
	require.NoError(t, err)
	require.Empty(t, over)
	first := versions()
	over, err = db.ClaimFrequencyCaps(ctx, tdb.Pool, capped, 1, []string{"u2", "u1", "u3"})
	require.NoError(t, err)
	require.Empty(t, over)
	again := versions()
	require.Equal(t, first["u1"], again["u1"], "u1's row was written again")
	require.Equal(t, first["u2"], again["u2"], "u2's row was written again")
	require.Contains(t, again, "u3")
	over, err = db.ClaimFrequencyCaps(ctx, tdb.Pool, capped, 2, []string{"u1", "u3"})
	require.NoError(t, err)
	require.Equal(t, map[string]bool{"u1": true, "u3": true}, over)
	// Refused, the full histories are not written either.
	refused := versions()
	require.Equal(t, again["u1"], refused["u1"], "u1's full history was written again")
	require.Equal(t, again["u3"], refused["u3"], "u3's full history was written again")

	// Eight chunks of message 3 claim u4 (and u1, capped by message 1) at once.
	var wg sync.WaitGroup
	answers := make([]map[string]bool, 8)
	for i := range answers {
		wg.Go(func() {
			var err error
			answers[i], err = db.ClaimFrequencyCaps(ctx, tdb.Pool, capped, 3, []string{"u4", "u1"})
			require.NoError(t, err)
		})
	}
	wg.Wait()
	for _, a := range answers {
		require.Equal(t, map[string]bool{"u1": true}, a)
	}
	var ids []int64
	require.NoError(t, tdb.Pool.QueryRow(ctx, `SELECT message_ids FROM frequency_caps WHERE user_id = 'u4'`).Scan(&ids))
	require.Equal(t, []int64{3}, ids)
}

// claimRace claims a place under capped for sixteen messages (after
// firstID) to users at once, and checks that each user was allowed
// exactly the cap's count of them. It returns what each message was
// answered.
func claimRace(t *testing.T, tdb *dbtest.DB, capped db.CategoryCap, users []string, firstID int64) []map[string]bool {
	t.Helper()
	ctx := context.Background()
	const messages = 16
	over := make([]map[string]bool, messages)
	var wg sync.WaitGroup
	for m := range messages {
		wg.Go(func() {
			mine := append([]string(nil), users...)
			if m%2 == 1 {
				// Reversed, with a repeat: the claim sorts and dedupes.
				for i, j := 0, len(mine)-1; i < j; i, j = i+1, j-1 {
					mine[i], mine[j] = mine[j], mine[i]
				}
				mine = append(mine, mine[0])
			}
			var err error
			over[m], err = db.ClaimFrequencyCaps(ctx, tdb.Pool, capped, firstID+int64(m+1), mine)
			require.NoError(t, err)
		})
	}
	wg.Wait()
	for _, u := range users {
		allowed := 0
		for m := range messages {
			if !over[m][u] {
				allowed++
			}
		}
		require.Equal(t, int(capped.Count), allowed, "messages of %s allowed to %s", capped.Category, u)
	}
	return over
}

// TestFrequencyCapPeriodRolls: a message counts against the cap for its
// period only; the history a claim keeps drops what has aged out, and
// retention deletes the histories that count for nothing.
func TestFrequencyCapPeriodRolls(t *testing.T) {
	t.Parallel()
	tdb := dbtest.New(t)
	ctx := context.Background()
	q := db.On(tdb.Pool)
	require.NoError(t, q.EnsureUsers(ctx, []string{"u", "gone"}))
	_, err := q.PutCategory(ctx, db.PutCategoryParams{Name: "promo", CapCount: new(int32(1)), CapPeriodS: new(int32(3600))})
	require.NoError(t, err)
	capped := db.CategoryCap{Category: "promo", Count: 1, PeriodS: 3600}
	over, err := db.ClaimFrequencyCaps(ctx, tdb.Pool, capped, 1, []string{"u", "gone"})
	require.NoError(t, err)
	require.Empty(t, over)
	over, err = db.ClaimFrequencyCaps(ctx, tdb.Pool, capped, 2, []string{"u"})
	require.NoError(t, err)
	require.True(t, over["u"])
	// An hour and a minute later (moved back in the history), there is
	// room again, and message 1 is no longer in it.
	_, err = tdb.Pool.Exec(ctx, `UPDATE frequency_caps SET sent_at = ARRAY[now() - interval '61 minutes'], last_at = now() - interval '61 minutes'`)
	require.NoError(t, err)
	over, err = db.ClaimFrequencyCaps(ctx, tdb.Pool, capped, 2, []string{"u"})
	require.NoError(t, err)
	require.Empty(t, over)
	var ids []int64
	require.NoError(t, tdb.Pool.QueryRow(ctx, `SELECT message_ids FROM frequency_caps WHERE user_id = 'u'`).Scan(&ids))
	require.Equal(t, []int64{2}, ids)

	// Retention: "gone"'s history is older than the period; u's is not.
	blocks, err := q.FrequencyCapBlocks(ctx)
	require.NoError(t, err)
	sweep := db.DeleteStaleFrequencyCapsParams{FromBlock: 0, ToBlock: blocks}
	n, err := q.DeleteStaleFrequencyCaps(ctx, sweep)
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	// A category whose cap was removed keeps no history.
	_, err = q.PutCategory(ctx, db.PutCategoryParams{Name: "promo"})
	require.NoError(t, err)
	n, err = q.DeleteStaleFrequencyCaps(ctx, sweep)
	require.NoError(t, err)
	require.EqualValues(t, 1, n)

	// Erasing a user deletes the user's preferences and cap history.
	require.NoError(t, q.PutUserPreferences(ctx, db.PutUserPreferencesParams{UserID: "u", OptOuts: []string{"promo"}}))
	_, err = db.ClaimFrequencyCaps(ctx, tdb.Pool, capped, 3, []string{"u"})
	require.NoError(t, err)
	_, err = q.DeleteUser(ctx, "u")
	require.NoError(t, err)
	var left int
	require.NoError(t, tdb.Pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM user_preferences) + (SELECT count(*) FROM frequency_caps)`).Scan(&left))
	require.Zero(t, left)
}
