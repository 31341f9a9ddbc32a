package dbtest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/heraldpush/herald/db"
)

// Pair is a primary and a streaming standby of a test's own, as a managed
// PostgreSQL with high availability runs them, for a test that fails the
// primary over to the standby under a running Herald.
type Pair struct {
	Primary, Standby *Cluster
	// URL names both servers, the primary first, with
	// target_session_attrs=read-write: a connection goes to whichever of
	// them takes writes, so it follows a promotion.
	URL string
}

// NewPair starts a primary with an empty database herald and a standby
// streaming from it (pg_basebackup -R, over the primary's Unix socket; each
// server has a socket directory of its own). When synchronous, a commit on
// the primary returns only once the standby has written it to its WAL
// (synchronous_standby_names; synchronous_commit stays on): the standby
// has every transaction a client saw commit. Otherwise the standby may be
// behind by what the primary committed last. Both are stopped and deleted
// when the test ends.
func NewPair(tb testing.TB, synchronous bool) *Pair {
	tb.Helper()
	// wal_level=replica and max_wal_senders=10 are PostgreSQL's defaults,
	// and initdb's pg_hba.conf trusts replication on the local socket;
	// they are given anyway so that the pair does not hang on them.
	opts := "-c wal_level=replica -c max_wal_senders=4 -c hot_standby=on"
	primary := newCluster(tb, opts)
	standby := primary.basebackup("application_name=standby", "-R")
	standby.Start()
	p := &Pair{Primary: primary, Standby: standby,
		URL: fmt.Sprintf("postgres://postgres@/herald?host=%s,%s&sslmode=disable&target_session_attrs=read-write", primary.dir, standby.dir)}
	// The primary sees its standby streaming (and, when synchronous, as
	// its synchronous one) before the test goes on.
	pool := primary.Pool()
	want := "async"
	if synchronous {
		// Set on the primary once the standby is copied from it: the
		// standby, promoted, has no standby of its own to wait for.
		for _, q := range []string{"ALTER SYSTEM SET synchronous_standby_names = '*'", "SELECT pg_reload_conf()"} {
			if _, err := pool.Exec(context.Background(), q); err != nil {
				tb.Fatalf("dbtest: %s: %v", q, err)
			}
		}
		want = "sync"
	}
	deadline := time.Now().Add(time.Minute)
	for {
		var state string
		err := pool.QueryRow(context.Background(),
			"SELECT sync_state FROM pg_stat_replication WHERE state = 'streaming'").Scan(&state)
		if err == nil && state == want {
			break
		}
		if time.Now().After(deadline) {
			tb.Fatalf("dbtest: the standby is not streaming (%s) after a minute: %v %q", want, err, state)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return p
}

// Promote makes the standby a primary (pg_ctl promote), waiting until it
// takes writes.
func (p *Pair) Promote() {
	p.Standby.tb.Helper()
	if err := p.Standby.pgctl("promote", "-w", "-t", "60"); err != nil {
		p.Standby.tb.Fatalf("dbtest: promote the standby: %v", err)
	}
}

// Pool opens a pool on whichever of the pair takes writes, closed when the
// test ends.
func (p *Pair) Pool() *pgxpool.Pool {
	p.Primary.tb.Helper()
	pool, err := db.Open(context.Background(), p.URL, db.PoolConfig{MaxConns: 4})
	if err != nil {
		p.Primary.tb.Fatalf("dbtest: %v", err)
	}
	p.Primary.tb.Cleanup(pool.Close)
	return pool
}

// Detach stops the standby's streaming, as an asynchronous standby that
// fell behind does: it has replayed whatever the primary committed before
// the call, and whatever the primary commits from then on never reaches
// it. It waits until the standby's WAL receiver has stopped and the primary
// no longer lists it.
func (p *Pair) Detach() {
	p.Standby.tb.Helper()
	ctx := context.Background()
	standby, primary := p.Standby.Pool(), p.Primary.Pool()
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(time.Millisecond) {
		var caughtUp bool
		err := primary.QueryRow(ctx, "SELECT bool_and(replay_lsn >= pg_current_wal_lsn()) FROM pg_stat_replication").Scan(&caughtUp)
		if err == nil && caughtUp {
			break
		}
		if time.Now().After(deadline) {
			p.Standby.tb.Fatalf("dbtest: the standby did not catch up within a minute: %v", err)
		}
	}
	for _, q := range []string{"ALTER SYSTEM SET primary_conninfo = ''", "SELECT pg_reload_conf()"} {
		if _, err := standby.Exec(ctx, q); err != nil {
			p.Standby.tb.Fatalf("dbtest: detach the standby: %s: %v", q, err)
		}
	}
	deadline := time.Now().Add(time.Minute)
	for {
		var receiving, streaming int
		err := standby.QueryRow(ctx, "SELECT count(*) FROM pg_stat_wal_receiver").Scan(&receiving)
		if err == nil {
			err = primary.QueryRow(ctx, "SELECT count(*) FROM pg_stat_replication").Scan(&streaming)
		}
		if err == nil && receiving == 0 && streaming == 0 {
			return
		}
		if time.Now().After(deadline) {
			p.Standby.tb.Fatalf("dbtest: the standby still streams a minute after it was detached: %v (receivers %d, senders %d)", err, receiving, streaming)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
