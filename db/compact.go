package db

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The ledger's primary key after a large message is retained. Its rows go
// (the retention deletes them, vacuum gives their heap back), but a B-tree
// file never shrinks: the emptied pages stay, to be filled by the next
// messages' rows. After a message of ten million devices that is some 400 MB
// the database keeps for the moment it next sends as many. Rebuilt, the
// index is the size of the rows it holds, and the database is back to its
// size before the message.

// ledgerKeyEntry is what one ledger row needs of its primary key, in bytes:
// an index tuple of two bigints (24), its line pointer (4), the leaf pages
// filled to 90% as a rebuild fills them, and the pages above the leaves.
const ledgerKeyEntry = 32

// LedgerKeySize is the size of the ledger's primary key and the size its
// rows need.
type LedgerKeySize struct {
	Bytes, Needed int64
}

// Slack says whether the key is above bytes and more than four times the
// size its rows need: mostly emptied pages, which only a rebuild gives back.
// A ledger in its steady state (messages retained as others are sent)
// refills its emptied pages and never comes near.
func (s LedgerKeySize) Slack(above int64) bool {
	return s.Bytes > above && s.Bytes > 4*s.Needed
}

// ReadLedgerKeySize reads the ledger's primary key's size and the size its
// rows need, from the larger of two estimates of the rows: the table's
// statistics (pg_class.reltuples, set by the last VACUUM or ANALYZE) and the
// live rows the cumulative statistics count. Each can lag: the first until
// autovacuum has been through a mass delete, the second by the seconds its
// backends take to report. The larger of them is the one that never makes a
// full index look empty.
func ReadLedgerKeySize(ctx context.Context, q DBTX) (LedgerKeySize, error) {
	var s LedgerKeySize
	err := q.QueryRow(ctx, `
		SELECT pg_relation_size(i.indexrelid),
		       (greatest(c.reltuples, 0, coalesce(st.n_live_tup, 0)) * $1::bigint)::bigint
		FROM pg_index i
		JOIN pg_class c ON c.oid = i.indrelid
		LEFT JOIN pg_stat_user_tables st ON st.relid = c.oid
		WHERE i.indrelid = 'deliveries'::regclass AND i.indisprimary`, ledgerKeyEntry).Scan(&s.Bytes, &s.Needed)
	if err != nil {
		return s, fmt.Errorf("read the ledger's primary key size: %w", err)
	}
	return s, nil
}

// Compacted is what CompactLedgerKey did: the key's size before and after,
// and whether it rebuilt it.
type Compacted struct {
	Before, After LedgerKeySize
	Rebuilt       bool
	// Dropped are the unfinished rebuilds left behind that it dropped.
	Dropped int
}

// compactLock is the session advisory lock one compaction at a time holds
// (pg_try_advisory_lock): a second process finds it taken and does nothing.
const compactLock = "herald:compact-ledger"

// CompactLedgerKey rebuilds the ledger's primary key when it is mostly
// emptied pages (LedgerKeySize.Slack above the given bytes), with REINDEX
// CONCURRENTLY: the ledger is written and read throughout, the build reads
// only the rows still there, and the new index replaces the old once it is
// whole. One process at a time does it, under a session advisory lock; the
// others skip. A rebuild that was cut short (its process stopped, its
// statement cancelled) leaves an invalid index behind, which the ledger's
// writes would keep up for nothing: the next compaction drops it first.
// It runs on a connection of its own, outside any transaction, as REINDEX
// CONCURRENTLY must.
func CompactLedgerKey(ctx context.Context, pool *pgxpool.Pool, above int64) (Compacted, error) {
	var out Compacted
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return out, fmt.Errorf("compact the ledger's key: %w", err)
	}
	defer conn.Release()
	var locked bool
	if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock(hashtextextended($1, 0))`, compactLock).Scan(&locked); err != nil {
		return out, fmt.Errorf("compact the ledger's key: %w", err)
	}
	if !locked {
		return out, nil
	}
	defer func() {
		// A connection whose unlock failed is broken; the pool drops it,
		// and the lock goes with its session.
		_, _ = conn.Exec(context.WithoutCancel(ctx), `SELECT pg_advisory_unlock(hashtextextended($1, 0))`, compactLock)
	}()
	rows, err := conn.Query(ctx, `
		SELECT format('%I.%I', n.nspname, c.relname)
		FROM pg_index i
		JOIN pg_class c ON c.oid = i.indexrelid
		JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE i.indrelid = 'deliveries'::regclass AND NOT i.indisvalid AND c.relname LIKE 'deliveries\_pkey\_ccnew%'`)
	if err != nil {
		return out, fmt.Errorf("find unfinished rebuilds of the ledger's key: %w", err)
	}
	leftovers, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return out, fmt.Errorf("find unfinished rebuilds of the ledger's key: %w", err)
	}
	for _, name := range leftovers {
		if _, err := conn.Exec(ctx, `DROP INDEX CONCURRENTLY IF EXISTS `+name); err != nil {
			return out, fmt.Errorf("drop the unfinished rebuild %s: %w", name, err)
		}
		out.Dropped++
	}
	if out.Before, err = ReadLedgerKeySize(ctx, conn); err != nil {
		return out, err
	}
	out.After = out.Before
	if !out.Before.Slack(above) {
		return out, nil
	}
	if _, err := conn.Exec(ctx, `REINDEX INDEX CONCURRENTLY deliveries_pkey`); err != nil {
		return out, fmt.Errorf("rebuild the ledger's key: %w", err)
	}
	out.Rebuilt = true
	if out.After, err = ReadLedgerKeySize(ctx, conn); err != nil {
		return out, err
	}
	return out, nil
}
