package jobs

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
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
