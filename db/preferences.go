package db

import (
	"context"
	"fmt"
	"slices"
)

// claimFrequencyCaps claims a place under a category's cap for a message,
// for each user given (sorted and distinct, so that concurrent claims lock
// rows in one order and cannot deadlock), and answers each user with
// whether the message may be sent to them. The claim is the row's upsert:
// ON CONFLICT locks the user's row and computes its new history
// (frequency_cap_claim, migration 0024) from the row's latest committed
// version, so two claims for one user, from any processes, are decided one
// after the other, exactly. A message already counted for the user (by
// another of the user's devices, in this chunk or another, or by an
// earlier attempt) is allowed again without counting twice. It is written
// here rather than in queries/ because sqlc cannot rewrite the parameters
// of its multi-column SET.
const claimFrequencyCaps = `
INSERT INTO frequency_caps AS f (user_id, category, message_ids, sent_at, last_at)
SELECT u.user_id, $1::text, ARRAY[$2::bigint], ARRAY[now()], now()
FROM unnest($5::text[]) AS u(user_id)
ORDER BY u.user_id
ON CONFLICT (user_id, category) DO UPDATE
SET (message_ids, sent_at) = (
        SELECT c.new_ids, c.new_ats
        FROM frequency_cap_claim(f.message_ids, f.sent_at, $2::bigint, now(),
                                 $4::integer * interval '1 second', $3::integer) c),
    last_at = now()
RETURNING f.user_id, ($2::bigint = ANY (f.message_ids))::boolean`

// CategoryCap is a category's cap: at most Count messages to a user in
// any PeriodS seconds.
type CategoryCap struct {
	Category string
	Count    int32
	PeriodS  int32
}

// ClaimFrequencyCaps claims the message's place under cap for each of
// users (in any order, repeated or not) and returns those it may not be
// sent to: the cap was reached by other messages within the period.
func ClaimFrequencyCaps(ctx context.Context, q DBTX, cap CategoryCap, messageID int64, users []string) (capped map[string]bool, err error) {
	users = slices.Clone(users)
	slices.Sort(users)
	users = slices.Compact(users)
	rows, err := q.Query(ctx, claimFrequencyCaps, cap.Category, messageID, cap.Count, cap.PeriodS, users)
	if err != nil {
		return nil, fmt.Errorf("claim frequency caps: %w", err)
	}
	defer rows.Close()
	capped = map[string]bool{}
	for rows.Next() {
		var (
			user    string
			allowed bool
		)
		if err := rows.Scan(&user, &allowed); err != nil {
			return nil, fmt.Errorf("claim frequency caps: %w", err)
		}
		if !allowed {
			capped[user] = true
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("claim frequency caps: %w", err)
	}
	return capped, nil
}
