package jobs

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/heraldpush/herald/db"
)

// Liveness is a worker process's claim to be alive, kept where PostgreSQL
// itself keeps it: a session advisory lock (db.LivenessLockSpace, Key) on
// a connection of its own. PostgreSQL drops the lock when the session ends,
// at once when the process dies, so the other workers can take its running
// chunks within seconds (Takeover) instead of after River's RescueAfter.
// The process's River clients are named after the key (ClientID), which is
// how a running job's attempted_by leads back to the lock.
//
// A worker that loses the lock (its connection failed; the database
// restarted) must not go on sending chunks that another worker may take.
// The lock can only have been lost after the last ping that succeeded, and
// Takeover takes a chunk only once its worker's lock has been seen free
// for DefaultTakeoverGrace; so Held turns false FenceAfter (half that
// grace) after the last good ping, and the chunk worker asks it before
// every request (FanOutConfig.Lease). A worker thus stops sending before
// another may start, yet rides out a database blip shorter than a second
// without pausing. The lock is taken again as soon as the database
// answers, under the same key.
type Liveness struct {
	cfg  LivenessConfig
	key  int32
	held atomic.Bool
	// epoch and lastOK (nanoseconds since epoch, on the monotonic clock)
	// are when the last good ping was sent.
	epoch  time.Time
	lastOK atomic.Int64
	// sessions counts the sessions that took the lock (Session).
	sessions atomic.Uint64
}

// LivenessConfig configures a Liveness.
type LivenessConfig struct {
	// ConnConfig is how to reach the database: the process pool's, so the
	// lock is in the same database and schema as the jobs.
	ConnConfig *pgx.ConnConfig
	Logger     *slog.Logger
	// Ping is how often the lock's connection is checked
	// (DefaultLivenessPing); FenceAfter how long after the last good ping
	// Held turns false (DefaultLivenessFence), which must be shorter than
	// Takeover's grace and longer than two pings.
	Ping, FenceAfter time.Duration
}

// withDefaults fills the settings left zero with their defaults.
func (c *LivenessConfig) withDefaults() {
	c.Ping = cmp.Or(c.Ping, DefaultLivenessPing)
	c.FenceAfter = cmp.Or(c.FenceAfter, DefaultLivenessFence)
}

// validate names the first setting a Liveness cannot work with.
func (c *LivenessConfig) validate() error {
	switch {
	case c.ConnConfig == nil:
		return errRequired("LivenessConfig.ConnConfig")
	case c.Logger == nil:
		return errRequired("LivenessConfig.Logger")
	case c.Ping < 0:
		return errNegative("LivenessConfig.Ping", c.Ping)
	case c.FenceAfter <= 2*c.Ping:
		return fmt.Errorf("jobs: LivenessConfig.FenceAfter (%s) must exceed two pings (%s)", c.FenceAfter, 2*c.Ping)
	}
	return nil
}

// NewLiveness draws the process's key; Run takes the lock.
func NewLiveness(cfg *LivenessConfig) (*Liveness, error) {
	c, err := configure(cfg)
	if err != nil {
		return nil, err
	}
	var b [4]byte
	if _, err := rand.Read(b[:]); err != nil {
		return nil, fmt.Errorf("draw a liveness key: %w", err)
	}
	// Positive, so that it reads the same as PostgreSQL's oid in pg_locks.
	key := int32(binary.BigEndian.Uint32(b[:])&0x7fffffff) | 1
	return &Liveness{cfg: c, key: key, epoch: time.Now()}, nil
}

// ClientID names the process's River client that works name (a queue, or
// "main"), for attempted_by to lead back to this process's lock.
func (l *Liveness) ClientID(name string) string { return fmt.Sprintf("herald-%d-%s", l.key, name) }

// Held says whether this process may still claim its chunks: the lock was
// taken, and a ping succeeded within FenceAfter.
func (l *Liveness) Held() bool {
	return l.held.Load() && time.Duration(l.sinceEpoch()-l.lastOK.Load()) < l.cfg.FenceAfter
}

func (l *Liveness) sinceEpoch() int64 { return int64(time.Since(l.epoch)) }

// Acquire takes the lock once; Run keeps it.
func (l *Liveness) Acquire(ctx context.Context) (*pgx.Conn, error) {
	conn, err := pgx.ConnectConfig(ctx, l.cfg.ConnConfig)
	if err != nil {
		return nil, fmt.Errorf("liveness connection: %w", err)
	}
	// The lock is held from the statement that takes it: that is as good
	// as a ping sent at the same moment.
	at := l.sinceEpoch()
	ok, err := db.TryLivenessLock(ctx, conn, l.key)
	if err == nil && !ok {
		err = fmt.Errorf("liveness lock %d is held by another session", l.key)
	}
	if err != nil {
		_ = conn.Close(context.Background())
		return nil, err
	}
	l.lastOK.Store(at)
	l.sessions.Add(1)
	l.held.Store(true)
	return conn, nil
}

// Session names the session that holds the lock, or last held it: it
// changes each time the lock is taken again after it was lost, which is
// when another worker may have taken this process's chunks (Takeover), so
// a chunk that began under one session does not send under the next
// (FanOutConfig.Lease).
func (l *Liveness) Session() uint64 { return l.sessions.Load() }

// Run keeps the lock held until ctx ends, on conn (from Acquire): it pings
// the connection every Ping, and when a ping fails it lets go of the claim
// and takes the lock again on a new connection as soon as it can.
func (l *Liveness) Run(ctx context.Context, conn *pgx.Conn) {
	defer func() {
		l.held.Store(false)
		if conn != nil {
			_ = conn.Close(context.Background())
		}
	}()
	tick := time.NewTicker(l.cfg.Ping)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		if conn != nil {
			at := l.sinceEpoch()
			pingCtx, cancel := context.WithTimeout(ctx, 2*l.cfg.Ping)
			err := conn.Ping(pingCtx)
			cancel()
			if err == nil {
				l.lastOK.Store(at)
				continue
			}
			if ctx.Err() != nil {
				return
			}
			l.cfg.Logger.Warn("lost the liveness lock: sending stops if it is not taken again within a second", "error", err)
			_ = conn.Close(context.Background())
			conn = nil
		}
		var err error
		if conn, err = l.Acquire(ctx); err != nil {
			conn = nil
			continue
		}
		l.cfg.Logger.Info("liveness lock taken again")
	}
}
