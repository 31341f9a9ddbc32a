package main

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/heraldpush/herald/api/client"
	"github.com/heraldpush/herald/db"
	"github.com/heraldpush/herald/db/dbtest"
)

// TestE2EFailoverSynchronous stops the primary hard (pg_ctl stop -m
// immediate) in the middle of a 20,000-device fan-out and promotes its
// synchronous standby: the standby has every commit Herald saw, so no
// device gets the push twice unless a send went unanswered, and a message
// and a cron schedule's run that fall due in the failover are each sent
// once.
func TestE2EFailoverSynchronous(t *testing.T) {
	t.Parallel()
	testFailover(t, true)
}

// TestE2EFailoverAsynchronous is TestE2EFailoverSynchronous with an
// asynchronous standby left behind before the stop (lostCloses): the
// results the primary committed last never reach it, chunks among them
// closed while River's completion of their jobs waited, and those devices
// are sent the push again (with the same collapse id); no delivery is
// lost and the message settles.
func TestE2EFailoverAsynchronous(t *testing.T) {
	t.Parallel()
	testFailover(t, false)
}

// testFailover runs Herald (the API in-process, a worker in a process of
// its own) on a primary and its standby named together in DATABASE_URL with
// target_session_attrs=read-write, stops the primary hard mid fan-out,
// promotes the standby two seconds later (as a failover manager would,
// once it has seen the primary gone), and checks that Herald finds the new
// primary by itself: the API answers 503 with Retry-After meanwhile and
// never 500, and the fan-out ends with every device reached. With a
// synchronous standby, a message scheduled to fall due during the failover
// is sent, and a cron schedule whose next run falls during it makes each
// run into one message: an asynchronous one may lack them, as it may lack
// any write of the primary's last moments (docs/operations.md, High
// availability).
func testFailover(t *testing.T, synchronous bool) {
	const devices = 20_000
	pair := dbtest.NewPair(t, synchronous)
	s := newFanOutSetupOn(t, devices, &dbtest.DB{Pool: pair.Pool(), URL: pair.URL}, 40*time.Millisecond)
	// As dbFaultSetup: fewer requests in flight than the default, so that
	// a loaded machine leaves none unanswered, and a chunk timeout with
	// room for a slow fan-out plus the failover.
	s.vars["HERALD_MAX_IN_FLIGHT_APNS"] = "50"
	s.vars["HERALD_MAX_IN_FLIGHT_FCM"] = "50"
	s.vars["HERALD_CHUNK_TIMEOUT"] = "60s"
	s.vars["HERALD_RESCUE_AFTER"] = "65s"
	s.vars["HERALD_MATERIALIZE_EVERY"] = "200ms"
	s.vars["HERALD_SCHEDULE_LEAD"] = "1s"
	ctx := context.Background()

	var (
		scheduleID                 string
		sid                        int64
		later                      string
		due                        time.Time
		killedAt, promotedAt       time.Time
		onStandby                  int64
		acceptedAtKill, recordedAt int64
		calls                      *failoverCalls
		tail                       *lostCloses
	)
	// A connection to the standby alone, hot before its promotion and the
	// new primary after.
	standby := standbyPool(t, pair.Standby.URL)
	if synchronous {
		// A device of its own for the schedule and the scheduled message,
		// out of the fan-out's segment.
		s.registerDevice(client.DeviceRegistration{UserID: "cron", Channel: client.ChannelFCM, Token: new("cron-token")})
		scheduleID = s.everyMinute("cron")
		var err error
		sid, err = strconv.ParseInt(strings.TrimPrefix(scheduleID, "sch_"), 10, 64)
		require.NoError(t, err)
	}
	w := s.faultMidFanOut(devices, func() {
		if synchronous {
			// The schedule's next run and a message both fall due three
			// seconds from now, in the failover.
			now, err := db.On(s.db.Pool).DatabaseNow(ctx)
			require.NoError(t, err)
			due = now.Add(3 * time.Second)
			require.NoError(t, db.On(s.db.Pool).AdvanceSchedule(ctx, db.AdvanceScheduleParams{ID: sid, NextRunAt: &due}))
			later = s.send(client.NewMessage{Audience: toUsers("cron"), Payload: titled("later"), DispatchAt: &due}).MessageID
		} else {
			tail = s.loseClosesWithTheStandby(pair, standby)
		}
		calls = pollAPI(t, s)
		recordedAt = s.recorded()
		pair.Primary.Kill()
		killedAt = time.Now()
		// Read after the stop, so that every result the primary can
		// have had is among these.
		acceptedAtKill = s.accepted()
		calls.killed(killedAt)
		// The deliveries the standby has, read on it before its
		// promotion: what the primary had written and the standby had
		// not received is not among them.
		require.NoError(t, standby.QueryRow(ctx, "SELECT count(*) FROM ledger WHERE status = 'accepted'").Scan(&onStandby))
		if tail != nil {
			tail.standbyLacks(standby)
		}
		time.Sleep(2 * time.Second)
		pair.Promote()
		promotedAt = time.Now()
	})
	var firstAccepted time.Duration
	require.Eventually(t, func() bool {
		var n int64
		if err := standby.QueryRow(ctx, "SELECT count(*) FROM ledger WHERE status = 'accepted'").Scan(&n); err != nil || n == onStandby {
			return false
		}
		firstAccepted = time.Since(killedAt)
		return true
	}, 3*time.Minute, 20*time.Millisecond, "no delivery was recorded on the new primary:\n%s", w.out.String())

	dups := s.checkOnceEach(s.msgID, devices)
	unanswered := w.unanswered(t)
	lost := devices - len(s.deliveries(s.msgID, client.DeliveryStatusAccepted))
	// The API answers again, and its calls during the failover were 503s
	// with Retry-After or answers, never a 500.
	require.Eventually(t, func() bool { return calls.answeredSinceKill() }, 3*time.Minute, 50*time.Millisecond, "the API never answered again")
	c := calls.stop()
	kind := "asynchronous"
	if synchronous {
		kind = "synchronous"
	}
	article := map[bool]string{true: "a", false: "an"}[synchronous]
	t.Logf("failover to %s %s standby: promoted %s after the stop; first delivery recorded on the new primary %s after the stop, first API write accepted %s after; "+
		"API calls from the stop to the first write taken: %d (the slowest %s), from the stop to the fan-out's end: %d, of which 503s %d (all with Retry-After) and 500s %d; duplicates %d (unanswered sends %d; %d sends accepted by fakepush at the stop, %d recorded on the old primary shortly before, %d on the standby at the stop); lost %d",
		article, kind, promotedAt.Sub(killedAt).Round(time.Millisecond), firstAccepted.Round(time.Millisecond), c.firstWrite.Round(time.Millisecond),
		c.untilWrite, c.slowest.Round(time.Millisecond), c.total, c.unavailable, c.failed, dups, unanswered, acceptedAtKill, recordedAt, onStandby, lost)
	require.Zero(t, c.failed, "the API answered 500 during the failover: %v", c.errors)
	require.Empty(t, c.errors)
	require.Positive(t, c.unavailable, "the API never said it was unavailable; the failover went unseen")
	require.Zero(t, lost)
	if synchronous {
		require.LessOrEqual(t, int64(dups), unanswered, "a device got the push twice though the standby had every result and every send was answered")
	} else {
		// At most the sends whose results the standby had not received:
		// those fakepush had taken by the stop and the new primary did not
		// have, plus any sent again for want of an answer.
		require.LessOrEqual(t, int64(dups), acceptedAtKill-onStandby+unanswered)
	}

	if synchronous {
		requireDueInFailoverSentOnce(t, s, later, scheduleID, due, killedAt)
	} else {
		// How the held chunks came to be sent again: River's completer
		// gave up on them, and they were rescued as running, or wrote
		// them completed on the new primary, and the reconciler ran them
		// again.
		var rerun int
		require.NoError(t, s.db.Pool.QueryRow(ctx, `SELECT count(*) FROM river_job j, unnest(j.errors) e
			WHERE j.id = ANY ($1) AND e->>'error' LIKE '%lacks its close%'`, tail.jobs).Scan(&rerun))
		t.Logf("of the %d held chunks, %d were completed on the new primary and run again by the reconciler", len(tail.jobs), rerun)
	}

	// River's leader is elected on the new primary, where its background
	// services (the materializer above among them) run.
	require.Eventually(t, func() bool {
		var leaders int
		err := standby.QueryRow(ctx, "SELECT count(*) FROM river_leader WHERE expires_at > now()").Scan(&leaders)
		return err == nil && leaders == 1
	}, time.Minute, 100*time.Millisecond, "no River leader on the new primary")
}

// requireDueInFailoverSentOnce checks the message later and the run of
// the schedule scheduleID, both due at due (in the failover that began at
// killedAt): each was sent once.
func requireDueInFailoverSentOnce(t *testing.T, s *fanOutSetup, later, scheduleID string, due, killedAt time.Time) {
	t.Helper()
	// The message that fell due in the failover was sent, once.
	require.Equal(t, client.DeliveryCounts{Total: 1, Accepted: 1}, s.settle(later, 3*time.Minute).Deliveries)
	require.Len(t, s.fake.Receipts(later), 1)
	// The schedule's run in the failover and the next, on the minute after
	// it, are each one message, sent once; so is every run before them.
	var runs []client.MessageStatus
	require.Eventually(t, func() bool {
		runs = s.listMessages(client.ListMessagesParams{ScheduleID: &scheduleID, State: new(client.MessageStateDispatched)})
		return len(runs) > 0 && runs[0].DispatchAt.After(killedAt.Add(3*time.Second))
	}, 3*time.Minute, 200*time.Millisecond, "the schedule's run after the failover was not sent")
	perRun := map[time.Time]int{}
	for _, m := range s.listMessages(client.ListMessagesParams{ScheduleID: &scheduleID}) {
		perRun[m.DispatchAt]++
	}
	inFailover := false
	for _, m := range runs {
		require.Equal(t, 1, perRun[m.DispatchAt], "run %s was made into %d messages", m.DispatchAt, perRun[m.DispatchAt])
		require.Equal(t, client.DeliveryCounts{Total: 1, Accepted: 1}, m.Deliveries, "run %s", m.DispatchAt)
		require.Len(t, s.fake.Receipts(m.MessageID), 1, "run %s", m.DispatchAt)
		inFailover = inFailover || m.DispatchAt.Sub(due).Abs() < time.Millisecond
	}
	require.True(t, inFailover, "no run at %s, in the failover: %v", due, perRun)
	t.Logf("the schedule's run and the message due %s after the stop were each sent once; %d runs in all", due.Sub(killedAt).Round(time.Millisecond), len(runs))
}

// standbyPool opens a pool on the standby alone, closed when the test ends.
func standbyPool(t *testing.T, url string) *pgxpool.Pool {
	t.Helper()
	pool, err := db.Open(context.Background(), url, db.PoolConfig{MaxConns: 2})
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// failoverCalls is a read and a write made on the API over and over
// through a failover, with what came back.
type failoverCalls struct {
	mu                             sync.Mutex
	since                          time.Time
	total, unavailable, failed, ok int
	// untilWrite counts the calls that ended before the first write was
	// taken, and slowest is the longest of them.
	untilWrite int
	slowest    time.Duration
	firstWrite time.Duration
	errors     []string
	done       chan struct{}
	wg         sync.WaitGroup
}

// pollAPI reads the fan-out's message and registers a device, each every
// 50 ms, until stop.
func pollAPI(t *testing.T, s *fanOutSetup) *failoverCalls {
	c := &failoverCalls{done: make(chan struct{})}
	record := func(write bool, took time.Duration, status int, header http.Header, body []byte, err error) {
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.since.IsZero() {
			return
		}
		c.total++
		if c.firstWrite == 0 {
			c.untilWrite++
			c.slowest = max(c.slowest, took)
		}
		switch {
		case err != nil:
			c.errors = append(c.errors, err.Error())
		case status == http.StatusServiceUnavailable:
			c.unavailable++
			if header.Get("Retry-After") == "" {
				c.errors = append(c.errors, fmt.Sprintf("a 503 with no Retry-After: %s", body))
			}
		case status >= 500:
			c.failed++
			c.errors = append(c.errors, fmt.Sprintf("%d: %s", status, body))
		case status < 300:
			c.ok++
			if write && c.firstWrite == 0 {
				c.firstWrite = time.Since(c.since)
			}
		default:
			c.errors = append(c.errors, fmt.Sprintf("%d: %s", status, body))
		}
	}
	loop := func(call func(i int)) {
		c.wg.Add(1)
		go func() {
			defer c.wg.Done()
			for i := 0; ; i++ {
				select {
				case <-c.done:
					return
				case <-time.After(50 * time.Millisecond):
				}
				call(i)
			}
		}()
	}
	ctx := context.Background()
	loop(func(int) {
		start := time.Now()
		res, err := s.api.GetMessageWithResponse(ctx, s.msgID)
		if err != nil {
			record(false, time.Since(start), 0, nil, nil, err)
			return
		}
		record(false, time.Since(start), res.StatusCode(), res.HTTPResponse.Header, res.Body, nil)
	})
	loop(func(i int) {
		start := time.Now()
		res, err := s.api.RegisterDevicesWithResponse(ctx, client.DeviceBatch{Devices: []client.DeviceRegistration{
			{UserID: fmt.Sprintf("probe-%d", i), Channel: client.ChannelFCM, Token: new(fmt.Sprintf("probe-%d", i))},
		}})
		if err != nil {
			record(true, time.Since(start), 0, nil, nil, err)
			return
		}
		record(true, time.Since(start), res.StatusCode(), res.HTTPResponse.Header, res.Body, nil)
	})
	t.Cleanup(func() { c.stop() })
	return c
}

// killed starts the count at the primary's stop.
func (c *failoverCalls) killed(at time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.since = at
}

// answeredSinceKill says whether a write was taken since the stop.
func (c *failoverCalls) answeredSinceKill() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.firstWrite > 0
}

// stop ends the calls and returns their count.
func (c *failoverCalls) stop() *failoverCalls {
	select {
	case <-c.done:
	default:
		close(c.done)
	}
	c.wg.Wait()
	return c
}

// lostCloses are chunks whose close the primary took and its standby never
// received, while River's completion of their jobs waited: the tail of
// writes an asynchronous standby lacks, made to hold a close every time.
type lostCloses struct {
	t    *testing.T
	jobs []int64
	tx   pgx.Tx
	conn *pgxpool.Conn
}

// loseClosesWithTheStandby holds back River's completion of the chunks
// running now (a transaction locks their jobs' rows, as a busy database
// delays a write), leaves the standby behind (Pair.Detach), and waits
// until one of those chunks has written its close on the primary (read
// there, and on the standby through standby). The
// close is then the primary's alone, and the completion waits to be
// written wherever the database is next: River's completer tries again
// for a few seconds, on the promoted standby once it takes writes.
func (s *fanOutSetup) loseClosesWithTheStandby(pair *dbtest.Pair, standby *pgxpool.Pool) *lostCloses {
	t := s.t
	t.Helper()
	ctx := context.Background()
	conn, err := s.db.Pool.Acquire(ctx)
	require.NoError(t, err)
	tx, err := conn.Begin(ctx)
	require.NoError(t, err)
	l := &lostCloses{t: t, tx: tx, conn: conn}
	rows, err := tx.Query(ctx, `SELECT j.id FROM river_job j JOIN message_chunks mc ON mc.job_id = j.id
		WHERE j.state = 'running' AND j.kind LIKE 'fan_out%' AND mc.finished_at IS NULL FOR UPDATE OF j`)
	require.NoError(t, err)
	l.jobs, err = pgx.CollectRows(rows, pgx.RowTo[int64])
	require.NoError(t, err)
	require.NotEmpty(t, l.jobs, "no chunk was running")
	// The standby has them running as it is left behind.
	pair.Detach()
	require.Eventually(t, func() bool {
		closed, err := l.closed(s.db.Pool, true)
		if err != nil || len(closed) == 0 {
			return false
		}
		open, err := l.closed(standby, false)
		return err == nil && slices.ContainsFunc(closed, func(id int64) bool { return slices.Contains(open, id) })
	}, time.Minute, 5*time.Millisecond, "none of the chunks running closed after the standby was left behind")
	return l
}

// closed lists the held chunks' jobs whose close q has (or lacks, when not
// closed).
func (l *lostCloses) closed(q *pgxpool.Pool, closed bool) ([]int64, error) {
	rows, err := q.Query(context.Background(), "SELECT job_id FROM message_chunks WHERE job_id = ANY ($1) AND (finished_at IS NOT NULL) = $2", l.jobs, closed)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[int64])
}

// standbyLacks lets the held completions go with the primary (stopped by
// now) and says, read on the standby before its promotion, how many of
// the held chunks' closes it lacks.
func (l *lostCloses) standbyLacks(standby *pgxpool.Pool) {
	l.t.Helper()
	_ = l.tx.Rollback(context.Background())
	l.conn.Release()
	open, err := l.closed(standby, false)
	require.NoError(l.t, err)
	l.t.Logf("the standby lacks the closes of %d of the %d chunks whose completion River had yet to write", len(open), len(l.jobs))
}
