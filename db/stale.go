package db

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// staleConns keeps a pool from handing out connections the server closed
// while they sat idle. pgxpool pings before use only a connection idle for
// over a second; after PostgreSQL restarted (or failed over, or its
// backends were ended), every connection used in the second before was
// closed at the server's end, and the next query on each of them failed:
// as many 503s as the pool had such connections, and as many failed River
// fetches. Once one connection comes back to the pool closed, each
// connection made before that moment is pinged the next time it is handed
// out; it is replaced if the ping fails and trusted again if it answers.
// The pings cost one round trip a connection, once, after a connection
// broke; a connection that breaks costs a new backend, far more than the
// pool's pings, and Herald keeps its connections for an hour (see Open).
type staleConns struct {
	// brokenAt is when a connection last came back closed, in Unix
	// nanoseconds; zero when none has.
	brokenAt atomic.Int64
}

// checkedAtKey is the connection's custom data for when it was last known
// open: made, or pinged because of a breakage (Unix nanoseconds).
const checkedAtKey = "herald.checked_at"

// install hooks s into the pool's configuration; afterConnect is the
// session's set-up, which it runs first.
func (s *staleConns) install(pc *pgxpool.Config, afterConnect func(context.Context, *pgconn.PgConn) error) {
	pc.ConnConfig.AfterConnect = func(ctx context.Context, conn *pgconn.PgConn) error {
		if err := afterConnect(ctx, conn); err != nil {
			return err
		}
		conn.CustomData()[checkedAtKey] = time.Now().UnixNano()
		return nil
	}
	pc.ConnConfig.Tracer = s
	pc.ShouldPing = s.shouldPing
}

// shouldPing pings what pgxpool pings (idle over a second) and a
// connection not checked since a connection broke.
func (s *staleConns) shouldPing(_ context.Context, p pgxpool.ShouldPingParams) bool {
	if p.IdleDuration > time.Second {
		return true
	}
	broken := s.brokenAt.Load()
	if broken == 0 {
		return false
	}
	data := p.Conn.PgConn().CustomData()
	if checked, _ := data[checkedAtKey].(int64); checked > broken {
		return false
	}
	data[checkedAtKey] = time.Now().UnixNano()
	return true
}

// TraceRelease notes a connection that comes back to the pool closed.
func (s *staleConns) TraceRelease(_ *pgxpool.Pool, d pgxpool.TraceReleaseData) {
	if d.Conn.IsClosed() {
		s.brokenAt.Store(time.Now().UnixNano())
	}
}

// TraceQueryStart and TraceQueryEnd make staleConns a tracer, which the
// pool asks for TraceRelease; they do nothing.
func (s *staleConns) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}

func (s *staleConns) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
