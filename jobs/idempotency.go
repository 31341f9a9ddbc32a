package jobs

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/heraldpush/herald/db"
)

// ErrIdempotencyKeyReused is returned when an idempotency key comes again
// with a different request: another message, or another schedule.
var ErrIdempotencyKeyReused = errors.New("this idempotency key was used with a different request")

// ClaimIdempotencyKey claims key within scope (a key space: one caller's,
// for one kind of request) for request, in the transaction q works in. A
// new key is claimed, and the answer is nil: the caller makes what was
// asked and records it with db's CompleteIdempotencyKey in the same
// transaction. A key claimed before for the same request answers what was
// recorded then, for the caller to replay; for another request,
// ErrIdempotencyKeyReused. A request is the same when its canonical JSON
// encoding is: the caller passes a value whose encoding holds what it asks
// for, defaults filled in and instants in UTC.
//
// Retries racing each other end with one claim: the first claim holds the
// key until its transaction ends, and the others wait for it here, then
// replay its answer (or, if it rolled back, one of them claims the key).
func ClaimIdempotencyKey(ctx context.Context, q *db.Queries, scope, key string, request any) (json.RawMessage, error) {
	canonical, err := json.Marshal(request)
	if err != nil {
		return nil, fmt.Errorf("encode request: %w", err)
	}
	hash := sha256.Sum256(canonical)
	_, err = q.ClaimIdempotencyKey(ctx, db.ClaimIdempotencyKeyParams{Scope: scope, Key: key, RequestHash: hash[:]})
	if err == nil {
		return nil, nil
	}
	if !errors.Is(err, db.ErrNotFound) {
		return nil, fmt.Errorf("claim idempotency key: %w", err)
	}
	// Taken, by a request that has committed: replay or refuse.
	prior, err := q.GetIdempotencyKey(ctx, db.GetIdempotencyKeyParams{Scope: scope, Key: key})
	if err != nil {
		return nil, fmt.Errorf("read idempotency key: %w", err)
	}
	if string(prior.RequestHash) != string(hash[:]) {
		return nil, ErrIdempotencyKeyReused
	}
	return prior.Response, nil
}
