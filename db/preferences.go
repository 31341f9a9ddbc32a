package db

import (
	"context"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// claimFrequencyCaps claims a place under a category's cap for a message,
// for each user given (sorted and distinct, so that concurrent claims lock
// rows in one order), and answers each user with whether the message may
// be sent to them. The claim is an update of the user's row: it locks the
// row and, when another claim changed it meanwhile, computes the new
// history from the latest committed version (READ COMMITTED's re-check),
// so two claims for one user, from any processes, are decided one after
// the other, exactly. A user with no row yet gets one through the insert,
// whose ON CONFLICT does the same for a row another claim inserted first.
// Updating first (and not upserting every user) spares the rows that exist,
// nearly all of them, the upsert's conflict check and row-lock record, and
// keeps the update heap-only (migration 0026).
//
// A claim whose answer cannot change is only read, with no lock and no
// write. A user whose history already holds the message (claimed by
// another of the message's chunks: a user's devices fall in several) is
// allowed: the message stays in the history for its period, since a claim
// pushes out only an entry older than the period. A user whose history is
// full within the period is refused: only time makes room in it, never
// another claim. Read in the statement's snapshot, a row another claim
// changes meanwhile is found by the update's re-check instead, which
// skips it when it now holds the message or has no room; the insert's
// conflict then answers it from the latest version.
//
// A user's history is the last $3 (the cap's count) messages the category
// sent them and when, oldest first: no more is needed, since the message
// may be sent when fewer than the cap were sent within the period ($4
// seconds) before now, that is when the history is not full or its oldest
// entry is older than the period. A message already in it (sent to
// another of the user's devices, in this chunk or another, or by an
// earlier attempt) is allowed again without counting twice. The history
// is computed in the statement with array operators alone: a function
// call a row cost as much again.
const claimFrequencyCaps = `
WITH decided AS (
    SELECT f.user_id, ($2::bigint = ANY (f.message_ids))::boolean AS allowed
    FROM frequency_caps AS f
    WHERE f.user_id = ANY ($5::text[]) AND f.category = $1::text
      AND ($2::bigint = ANY (f.message_ids) OR NOT (` + capRoom + `))
), claimed AS (
    UPDATE frequency_caps AS f
    SET ` + nextCapHistory + `
    FROM unnest($5::text[]) AS u(user_id)
    WHERE f.user_id = u.user_id AND f.category = $1::text
      AND NOT ($2::bigint = ANY (f.message_ids)) AND ` + capRoom + `
    RETURNING f.user_id, ($2::bigint = ANY (f.message_ids))::boolean AS allowed
), first AS (
    INSERT INTO frequency_caps AS f (user_id, category, message_ids, sent_at, last_at)
    SELECT u.user_id, $1::text, ARRAY[$2::bigint], ARRAY[now()], now()
    FROM unnest($5::text[]) AS u(user_id)
    WHERE NOT EXISTS (SELECT 1 FROM (SELECT user_id FROM claimed UNION ALL SELECT user_id FROM decided) AS c
                      WHERE c.user_id = u.user_id)
    ORDER BY u.user_id
    ON CONFLICT (user_id, category) DO UPDATE
    SET ` + nextCapHistory + `
    RETURNING f.user_id, ($2::bigint = ANY (f.message_ids))::boolean AS allowed
)
SELECT user_id, allowed FROM decided
UNION ALL
SELECT user_id, allowed FROM claimed
UNION ALL
SELECT user_id, allowed FROM first`

// capRoom says whether the history of the row f has room for another
// message: fewer than the cap's count ($3) in it, or its oldest of the
// last count older than the period ($4 seconds).
const capRoom = `(cardinality(f.message_ids) < $3::integer
          OR f.sent_at[cardinality(f.sent_at) - $3::integer + 1] <= now() - $4::integer * interval '1 second')`

// nextCapHistory is a claim's new history for the row f (claimFrequencyCaps).
const nextCapHistory = `message_ids = CASE
        WHEN $2::bigint = ANY (f.message_ids) THEN f.message_ids
        WHEN ` + capRoom + `
        THEN (f.message_ids || $2::bigint)[greatest(cardinality(f.message_ids) + 2 - $3::integer, 1):]
        ELSE f.message_ids END,
    sent_at = CASE
        WHEN $2::bigint = ANY (f.message_ids) THEN f.sent_at
        WHEN ` + capRoom + `
        THEN (f.sent_at || now())[greatest(cardinality(f.sent_at) + 2 - $3::integer, 1):]
        ELSE f.sent_at END,
    last_at = now()`

// CategoryCap is a category's cap: at most Count messages to a user in
// any PeriodS seconds.
type CategoryCap struct {
	Category string
	Count    int32
	PeriodS  int32
}

// ClaimFrequencyCaps claims the message's place under cap for each of
// users (in any order, repeated or not) and returns those it may not be
// sent to: the cap was reached by other messages within the period. It is
// one round trip, pipelined as a chunk's writes are: on the statement's
// generic plan (a custom one was planned anew on each of a connection's
// first claims, at the instant), and committed without waiting for the
// disk, as the ledger's writes are: the chunk's job's completion flushes
// it, and a claim lost with the database before that is made again by the
// chunk's retry.
func ClaimFrequencyCaps(ctx context.Context, pool *pgxpool.Pool, cap CategoryCap, messageID int64, users []string) (capped map[string]bool, err error) {
	users = slices.Clone(users)
	slices.Sort(users)
	users = slices.Compact(users)
	err = inBatch(ctx, pool, func(b *pgx.Batch) {
		capped = map[string]bool{}
		b.Queue(commitWithoutWaitingForDisk)
		b.Queue(useLedgerPlans)
		b.Queue(claimFrequencyCaps, cap.Category, messageID, cap.Count, cap.PeriodS, users).Query(func(rows pgx.Rows) error {
			for rows.Next() {
				var (
					user    string
					allowed bool
				)
				if err := rows.Scan(&user, &allowed); err != nil {
					return err
				}
				if !allowed {
					capped[user] = true
				}
			}
			return rows.Err()
		})
	})
	if err != nil {
		return nil, fmt.Errorf("claim frequency caps: %w", err)
	}
	return capped, nil
}
