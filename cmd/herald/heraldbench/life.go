package heraldbench

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/heraldpush/herald/api/client"
	"github.com/heraldpush/herald/db"
	"github.com/heraldpush/herald/jobs"
	"github.com/heraldpush/herald/jobs/push/fake"
)

// A message's life, as the bench counts PostgreSQL's CPU for it, runs from
// its POST until it has settled and the cleanup it leaves behind is done.
// Between the two, a caller reads its status every Config.StatusEvery
// (250 ms by default) through the API, as a sender's dashboard or script would. Those reads go to a Herald
// process of their own (serve --role api) whose connections name
// themselves statusApplication, so that their PostgreSQL backends, and the
// CPU they use, can be told apart from the fan-out's running at the same
// time (cpuSpans.statusCPU). The reads' cost depends on the message's
// state (a dispatching message's skew is computed from the ledger), so
// measuring one read apart and multiplying would not be honest.

// statusApplication is the application_name of the status process's
// database connections.
const statusApplication = "herald-bench-status"

// withApplicationName is the connection string dbURL whose connections
// name themselves name in pg_stat_activity.
func withApplicationName(dbURL, name string) (string, error) {
	if strings.HasPrefix(dbURL, "postgres://") || strings.HasPrefix(dbURL, "postgresql://") {
		u, err := url.Parse(dbURL)
		if err != nil {
			return "", err
		}
		q := u.Query()
		q.Set("application_name", name)
		u.RawQuery = q.Encode()
		return u.String(), nil
	}
	return dbURL + " application_name=" + name, nil
}

// startStatusReader starts the Herald process (API only) the status reads
// go through.
func (b *Benchmark) startStatusReader(ctx context.Context, env []string) error {
	var dbURL string
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "DATABASE_URL="); ok {
			dbURL = v
		}
	}
	named, err := withApplicationName(dbURL, statusApplication)
	if err != nil {
		return err
	}
	env = append(slices.Clip(env), "DATABASE_URL="+named)
	p, err := b.startServe(ctx, env, "serve", "--role", "api", "--addr", "127.0.0.1:0")
	if err != nil {
		return err
	}
	if b.status, err = client.NewClientWithResponses(p.base, client.WithAPIKey(b.apiKey)); err != nil {
		return err
	}
	b.Progress("herald status reader at %s (pid %d)", p.base, p.cmd.Process.Pid)
	return nil
}

// readStatus reads each message's status through the API every
// Config.StatusEvery, as its caller would, until it has settled; it stops reading
// a message once it has. The channel answers once every message has
// settled, or with the first error (deadline passed, or a failed read).
// reads counts the reads made.
func (b *Benchmark) readStatus(ctx context.Context, ids []string, deadline time.Time, reads *atomic.Int64) <-chan error {
	done := make(chan error, 1)
	go func() {
		pending := slices.Clone(ids)
		tick := time.NewTicker(b.Config.statusEvery())
		defer tick.Stop()
		for {
			for i := 0; i < len(pending); {
				st, err := b.status.GetMessageWithResponse(ctx, pending[i])
				reads.Add(1)
				if err == nil && st.StatusCode() == http.StatusServiceUnavailable && time.Now().Before(deadline) {
					// The database was away (--cold restarts it, and a
					// connection finds out on its next use): a caller
					// reads again after Retry-After, and so does the next
					// tick.
					i++
					continue
				}
				if err := answered("read message "+pending[i], http.StatusOK, st, err); err != nil {
					done <- err
					return
				}
				if s := string(st.JSON200.State); s != jobs.StateScheduled && s != jobs.StateDispatching {
					pending = slices.Delete(pending, i, i+1)
					continue
				}
				if time.Now().After(deadline) {
					done <- fmt.Errorf("message %s did not settle: %+v", pending[i], st.JSON200.Deliveries)
					return
				}
				i++
			}
			if len(pending) == 0 {
				done <- nil
				return
			}
			select {
			case <-ctx.Done():
				done <- ctx.Err()
				return
			case <-tick.C:
			}
		}
	}()
	return done
}

// settleDeadline is how long after a message's instant the bench waits for
// it to settle: two minutes, and 0.5 ms more per device (a loaded
// machine of two cores fanned out 250,000 devices in a minute).
func settleDeadline(dispatchAt time.Time, devices int) time.Time {
	return dispatchAt.Add(2*time.Minute + time.Duration(devices)*500*time.Microsecond)
}

// cleanUp does what a settled message leaves to the database: the vacuum
// and analyze of the tables it wrote, which autovacuum would do within
// a minute or so (the ledger's dead versions are far above its threshold),
// and a checkpoint that writes the pages it dirtied. Doing them at once
// bounds the message's life; whatever autovacuum did before is counted
// too, since every PostgreSQL process is.
func cleanUp(ctx context.Context, pool db.DBTX) error {
	if err := db.On(pool).VacuumMessageTables(ctx); err != nil {
		return fmt.Errorf("vacuum the message's tables: %w", err)
	}
	if err := db.On(pool).Checkpoint(ctx); err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	return nil
}

// sendBefore sends Config.Before rounds of the bulk messages through
// Herald, due at once, and waits for each round to settle (reading their
// status as for the measured ones) and be cleaned up, so that the measured
// messages meet a ledger in the state earlier messages leave it in.
//
// The earlier rounds are messages sent now: each round's first message
// gives the figures of a send-now (Result.Now), from its request's start
// to its answer and to its first push at fakepush, by the same host's
// clock.
func (b *Benchmark) sendBefore(ctx context.Context, pool db.DBTX, devices int, res *Result) error {
	for round := range b.Config.Before {
		start := time.Now()
		var ids []string
		for i := range b.Config.messages() {
			m, err := b.postBulk(ctx, i, nil)
			if err != nil {
				return fmt.Errorf("earlier message: %w", err)
			}
			if i == 0 {
				res.Now.AnsweredMs = append(res.Now.AnsweredMs, ms(time.Since(start)))
			}
			ids = append(ids, m.MessageID)
		}
		var reads atomic.Int64
		if err := <-b.readStatus(ctx, ids, settleDeadline(time.Now(), devices), &reads); err != nil {
			return fmt.Errorf("earlier message: %w", err)
		}
		var first time.Time
		err := b.eachReceipt(ctx, ids[0], func(r *fake.Receipt) {
			if first.IsZero() || r.ReceivedAt.Before(first) {
				first = r.ReceivedAt
			}
		})
		if err != nil {
			return err
		}
		if !first.IsZero() {
			res.Now.FirstPushMs = append(res.Now.FirstPushMs, ms(first.Sub(start)))
		}
		if err := cleanUp(ctx, pool); err != nil {
			return err
		}
		b.Progress("earlier round %d of %d: %d message(s) sent, settled and cleaned up in %.1f s",
			round+1, b.Config.Before, len(ids), time.Since(start).Seconds())
	}
	return nil
}

// retain deletes the settled messages as the retention does once it has
// passed (a jobs.Retainer whose retention is a nanosecond, run until it
// finds nothing), then vacuums the message tables as autovacuum would,
// runs the retention once more, as its next run would find the ledger,
// and gives the database's size at each step against sizeBefore.
func (b *Benchmark) retain(ctx context.Context, pool *pgxpool.Pool, sizeBefore int64) (*Retained, error) {
	mb := func(n int64) float64 { return math.Round(float64(n)/(1<<20)*10) / 10 }
	settled, err := db.On(pool).DatabaseSize(ctx)
	if err != nil {
		return nil, fmt.Errorf("database size: %w", err)
	}
	r, err := jobs.NewRetainer(&jobs.RetainerConfig{Pool: pool, Logger: slog.New(slog.DiscardHandler), Retention: time.Nanosecond})
	if err != nil {
		return nil, err
	}
	out := &Retained{BeforeMB: mb(sizeBefore), SettledMB: mb(settled)}
	start := time.Now()
	for {
		removed, err := r.Run(ctx)
		if err != nil {
			return nil, fmt.Errorf("retention: %w", err)
		}
		out.Messages += removed.Messages
		out.Rows += removed.Deliveries
		if removed.Messages == 0 && removed.Deliveries == 0 {
			break
		}
	}
	if err := cleanUp(ctx, pool); err != nil {
		return nil, err
	}
	next, err := r.Run(ctx)
	if err != nil {
		return nil, fmt.Errorf("retention: %w", err)
	}
	out.KeyFreedMB = mb(next.LedgerKeyFreed)
	out.Ms = ms(time.Since(start))
	after, err := db.On(pool).DatabaseSize(ctx)
	if err != nil {
		return nil, fmt.Errorf("database size: %w", err)
	}
	out.AfterMB = mb(after)
	b.Progress("retention: %d messages and %d ledger rows deleted in %.1f s; database %.1f MB before the POSTs, %.1f MB settled, %.1f MB after (%.1f MB of it the ledger's key rebuilt)",
		out.Messages, out.Rows, out.Ms/1000, out.BeforeMB, out.SettledMB, out.AfterMB, out.KeyFreedMB)
	return out, nil
}
