package jobs

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivertest"
	"github.com/stretchr/testify/require"
)

// TestDatabaseGaugesReportTheLastReading: the database's gauges are read
// by Run, not by a scrape. A scrape reports the last reading (a message
// scheduled since is not in it, and no scrape queries the database); the
// next reading has it, with its chunk in its queue's depth.
func TestDatabaseGaugesReportTheLastReading(t *testing.T) {
	t.Parallel()
	b := setupFanOut(t)
	ctx := context.Background()
	reg := prometheus.NewRegistry()
	g := NewDatabaseGauges(reg, b.db.Pool, discard)
	n, err := testutil.GatherAndCount(reg)
	require.NoError(t, err)
	require.Zero(t, n, "nothing is reported before the first reading")

	g.refresh(ctx, time.Second)
	require.EqualValues(t, 0, testutil.ToFloat64(metricOf(t, reg, "herald_messages", "state", StateScheduled)))

	users := b.devices("apns-1", "fcm-1")
	b.message(users, b.clock.Now().Add(time.Hour), time.Hour)
	require.EqualValues(t, 0, testutil.ToFloat64(metricOf(t, reg, "herald_messages", "state", StateScheduled)),
		"a scrape reports the last reading; it does not query")

	g.refresh(ctx, time.Second)
	require.EqualValues(t, 1, testutil.ToFloat64(metricOf(t, reg, "herald_messages", "state", StateScheduled)))
	require.EqualValues(t, 0, testutil.ToFloat64(metricOf(t, reg, "herald_messages", "state", StateDispatching)))
	require.EqualValues(t, 1, testutil.ToFloat64(metricOf(t, reg, "herald_river_jobs", "queue", QueueBulk, "state", "scheduled")),
		"the message's one chunk waits in the bulk queue")
	require.EqualValues(t, 0, testutil.ToFloat64(metricOf(t, reg, "herald_river_jobs", "queue", QueueUrgent, "state", "available")))
}

// metricOf is the one series of name with the given label values, from a
// gather of reg, as a collector testutil can read.
func metricOf(t *testing.T, reg *prometheus.Registry, name string, labels ...string) prometheus.Collector {
	t.Helper()
	families, err := reg.Gather()
	require.NoError(t, err)
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
	series:
		for _, m := range f.GetMetric() {
			got := map[string]string{}
			for _, l := range m.GetLabel() {
				got[l.GetName()] = l.GetValue()
			}
			for i := 0; i < len(labels); i += 2 {
				if got[labels[i]] != labels[i+1] {
					continue series
				}
			}
			return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "x", Help: "x"}, func() float64 { return m.GetGauge().GetValue() })
		}
	}
	t.Fatalf("no %s%v in the gather", name, labels)
	return nil
}

// TestDatabaseGaugesCountChunksFailingEveryAttempt: a chunk whose every
// attempt fails (its args cannot be decoded: River's executor fails it
// before the worker runs) counts in herald_failing_chunks, by its lane,
// from its third failed attempt on; a chunk parked behind an open breaker
// attempt after attempt (it snoozes, which River does not count as an
// attempt) never does. Each attempt is worked by River's executor and
// committed, as River's producer would, so that the gauges' own read sees
// it.
func TestDatabaseGaugesCountChunksFailingEveryAttempt(t *testing.T) {
	t.Parallel()
	b := setupFanOut(t)
	ctx := context.Background()
	reg := prometheus.NewRegistry()
	g := NewDatabaseGauges(reg, b.db.Pool, discard)
	users := b.devices("apns-1", "apns-2")
	poison := b.message(users[:1], b.clock.Now(), time.Hour)
	_, err := b.db.Pool.Exec(ctx, `UPDATE river_job SET args = '{"message_id": "not a number"}' WHERE id = $1`, poison.job.ID)
	require.NoError(t, err)
	parked := b.message(users[1:], b.clock.Now(), time.Hour)
	breakers := openBreakers(time.Hour)
	breakers.For(ChannelAPNs, "").Failure("503 from APNs")
	w := b.worker(map[string]Sender{ChannelAPNs: &recordingSender{}}, FanOutConfig{Breakers: breakers})

	failing := func() (bulk, urgent float64) {
		t.Helper()
		g.refresh(ctx, time.Second)
		return testutil.ToFloat64(metricOf(t, reg, "herald_failing_chunks", "lane", QueueBulk)),
			testutil.ToFloat64(metricOf(t, reg, "herald_failing_chunks", "lane", QueueUrgent))
	}
	for attempt, want := range []float64{0, 0, 1, 1} {
		require.Equal(t, river.EventKindJobFailed, b.workCommitted(w, poison.job.ID).EventKind)
		require.Equal(t, river.EventKindJobSnoozed, b.workCommitted(w, parked.job.ID).EventKind)
		bulk, urgent := failing()
		require.Equal(t, want, bulk, "after attempt %d", attempt+1)
		require.Zero(t, urgent, "no urgent chunk fails")
	}
}

// workCommitted runs one attempt of the chunk job id through River's
// executor in a transaction of its own, committed, and returns what River
// recorded: unlike work, whose transaction is never committed, it leaves
// the job as every other connection then reads it.
func (b *fanOutBundle) workCommitted(w *FanOutWorker, id int64) *rivertest.WorkResult {
	b.t.Helper()
	ctx := context.Background()
	tx, err := b.db.Pool.Begin(ctx)
	require.NoError(b.t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	job, err := b.client.JobGetTx(ctx, tx, id)
	require.NoError(b.t, err)
	// The error River recorded for a failed attempt is in its result.
	var res *rivertest.WorkResult
	if job.Kind != FanOutKind {
		res, _ = workOfKind(ctx, b.t, tx, w, job)
	} else {
		tw := rivertest.NewWorker(b.t, riverpgxv5.New(nil), &river.Config{Logger: discard}, river.Worker[FanOutArgs](w))
		res, _ = tw.WorkJob(ctx, b.t, tx, job)
	}
	require.NotNil(b.t, res)
	require.NoError(b.t, tx.Commit(ctx))
	return res
}
