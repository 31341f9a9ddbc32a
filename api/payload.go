package api

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/heraldpush/herald/db"
)

// payloadsOf reads the stored payloads that ids name, by id: a page of
// messages or schedules reads its payloads in one query.
func payloadsOf(ctx context.Context, q *db.Queries, ids ...int64) (map[int64]json.RawMessage, error) {
	rows, err := q.GetPayloads(ctx, ids)
	if err != nil {
		return nil, fmt.Errorf("read payloads: %w", err)
	}
	out := make(map[int64]json.RawMessage, len(rows))
	for _, r := range rows {
		out[r.ID] = r.Content
	}
	return out, nil
}
