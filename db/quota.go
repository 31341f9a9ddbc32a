package db

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// QuotaClaim is what ClaimQuota asks of a quota's bucket: up to Want tokens,
// leaving Reserve in it, refilled at Rate a second up to Capacity.
type QuotaClaim struct {
	Key      string
	Rate     float64
	Capacity float64
	Want     int
	Reserve  float64
}

// ClaimQuota takes tokens from a provider quota's bucket (migration 0023):
// it refills the bucket by the time since its last claim, on the
// database's clock, and grants as many whole tokens as it holds above the
// reserve, at most Want. It returns the grant, possibly zero, and the
// tokens left, from which the caller tells how long to wait for more. The
// row is made, full, on the first claim: nothing was sent under a quota
// that had none. Concurrent claims take turns on
// the row's lock, each refilling from the last one's state.
//
// A claim commits without waiting for the disk (CommitWithoutWaitingForDisk),
// as a ledger write does: it is seen by every other claim at once, and a
// crash of the database can only lose the claims of its last moments,
// whose tokens the bucket then holds again; a restart takes longer than
// they would have refilled in. Waiting for the disk made every claim, a
// few each chunk, a flush of the WAL that the chunk's sends waited on.
func ClaimQuota(ctx context.Context, pool *pgxpool.Pool, c QuotaClaim) (granted int, left float64, err error) {
	// The first claim of a quota makes its row, which the same statement
	// cannot see yet: it answers no row, and the second claim finds it.
	for range 2 {
		granted, left, err = claimQuota(ctx, pool, c)
		if !errors.Is(err, pgx.ErrNoRows) {
			break
		}
	}
	if err != nil {
		return 0, 0, fmt.Errorf("claim quota %s: %w", c.Key, err)
	}
	return granted, left, nil
}

func claimQuota(ctx context.Context, pool *pgxpool.Pool, c QuotaClaim) (granted int, left float64, err error) {
	err = inBatch(ctx, pool, func(b *pgx.Batch) {
		granted, left = 0, 0
		b.Queue(commitWithoutWaitingForDisk)
		b.Queue(claimQuotaSQL, c.Key, c.Rate, c.Capacity, c.Want, c.Reserve).QueryRow(func(row pgx.Row) error {
			return row.Scan(&granted, &left)
		})
	})
	return granted, left, err
}

// claimQuotaSQL is ClaimQuota's statement.
const claimQuotaSQL = `
		WITH made AS (
			INSERT INTO provider_quotas (key, tokens, refilled_at)
			VALUES ($1, $3::float8, clock_timestamp())
			ON CONFLICT (key) DO NOTHING
		), cur AS (
			SELECT key, clock_timestamp() AS at,
			       LEAST($3::float8, tokens + $2::float8 * EXTRACT(EPOCH FROM clock_timestamp() - refilled_at)) AS level
			FROM provider_quotas WHERE key = $1
			FOR UPDATE
		), grant_ AS (
			SELECT key, at, level, LEAST($4::int, GREATEST(0, floor(level - $5::float8)))::int AS n FROM cur
		)
		UPDATE provider_quotas q SET tokens = g.level - g.n, refilled_at = g.at
		FROM grant_ g WHERE q.key = g.key
		RETURNING g.n, g.level - g.n`
