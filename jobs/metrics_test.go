package jobs

import (
	"context"
	"os"
	"os/exec"
	"regexp"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/riverqueue/river"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/heraldpush/herald/db/dbtest"
)

// TestAlertRulesUseRealMetrics parses jobs/alerts.yml and checks that every
// metric its expressions name is one Herald exports.
func TestAlertRulesUseRealMetrics(t *testing.T) {
	t.Parallel()
	tdb := dbtest.New(t)
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	RegisterProcessMetrics(reg, NewBreakers(BreakerConfig{}, ChannelAPNs), NewClock(tdb.Pool, discard), nil)
	gauges := NewDatabaseGauges(reg, tdb.Pool, discard)
	gauges.refresh(context.Background(), time.Second)
	NewPoolMetrics(reg).Add("main", tdb.Pool)
	// Make every vector show at least one series.
	m.count(PriorityBulk, []settledDelivery{{channel: "apns", status: "accepted", skew: time.Millisecond}})
	m.chunkStarted(PriorityBulk)()
	m.latency.WithLabelValues("default", "apns", "accepted").Observe(0.02)
	m.refused("default", "apns")
	m.reconciledDeliveries("apns", 1)
	skew := 3000.0
	m.settled(PriorityBulk, &skew)
	families, err := reg.Gather()
	require.NoError(t, err)
	exported := map[string]bool{}
	for _, f := range families {
		exported[f.GetName()] = true
		if f.GetType().String() == "HISTOGRAM" {
			for _, suffix := range []string{"_bucket", "_count", "_sum"} {
				exported[f.GetName()+suffix] = true
			}
		}
	}

	raw, err := os.ReadFile("alerts.yml")
	require.NoError(t, err)
	var rules struct {
		Groups []struct {
			Rules []struct {
				Alert string `yaml:"alert"`
				Expr  string `yaml:"expr"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	require.NoError(t, yaml.Unmarshal(raw, &rules))
	name := regexp.MustCompile(`herald_[a-z_]+`)
	alerts := 0
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			alerts++
			require.NotEmpty(t, r.Alert)
			used := name.FindAllString(r.Expr, -1)
			require.NotEmpty(t, used, "alert %s uses no Herald metric", r.Alert)
			for _, n := range used {
				require.True(t, exported[n], "alert %s uses %s, which Herald does not export", r.Alert, n)
			}
		}
	}
	require.GreaterOrEqual(t, alerts, 3)
}

// TestAlertRulesPassPromtool checks jobs/alerts.yml with Prometheus's own
// tool and runs its unit tests, jobs/alerts_test.yml, where each rule of the
// SLO is shown firing and not firing. Debian's prometheus package has
// promtool; make test installs it as root when it is missing.
func TestAlertRulesPassPromtool(t *testing.T) {
	t.Parallel()
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Skip("!!! promtool is missing (apt-get install prometheus): the alert rules in jobs/alerts.yml are NOT TESTED")
	}
	for _, args := range [][]string{{"check", "rules", "alerts.yml"}, {"test", "rules", "alerts_test.yml"}} {
		out, err := exec.Command(promtool, args...).CombinedOutput()
		require.NoError(t, err, "promtool %v:\n%s", args, out)
	}
}

// sloGrades is what herald_message_skew_max_seconds holds for a priority:
// how many messages were graded, how many within the SLO (the le="1"
// bucket), and the sum of their maximum skews.
type sloGrades struct {
	count, withinSLO uint64
}

func gradesOf(t *testing.T, m *Metrics, priority string) sloGrades {
	t.Helper()
	var out dto.Metric
	require.NoError(t, m.messageSkew.WithLabelValues(priority).(prometheus.Histogram).Write(&out))
	g := sloGrades{count: out.GetHistogram().GetSampleCount()}
	for _, b := range out.GetHistogram().GetBucket() {
		if b.GetUpperBound() == SLOSkew.Seconds() {
			g.withinSLO = b.GetCumulativeCount()
		}
	}
	return g
}

// TestFanOutGradesEachMessageBySkewMax works real chunks through the worker
// and reads the SLO's metrics: a message is graded once, when it settles,
// by its slowest device, so one whose last device was 3 s late misses the
// SLO though most of its devices were on time; one that expired unsent
// misses it too; a chunk parked behind an open breaker grades nothing yet
// but counts its due deliveries as tried.
func TestFanOutGradesEachMessageBySkewMax(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		// due is how long ago the message was due; lifetime, how long it
		// lives.
		due, lifetime time.Duration
		breakerOpen   bool
		event         river.EventKind
		want          sloGrades
		over, tries   float64
	}{
		{"on time", 0, time.Hour, false, river.EventKindJobCompleted, sloGrades{count: 1, withinSLO: 1}, 0, 2},
		{"its devices 3 s late", 3 * time.Second, time.Hour, false, river.EventKindJobCompleted, sloGrades{count: 1}, 1, 2},
		{"expired unsent", 2 * time.Hour, time.Hour, false, river.EventKindJobCompleted, sloGrades{count: 1}, 1, 0},
		{"parked behind an open breaker", 0, time.Hour, true, river.EventKindJobSnoozed, sloGrades{}, 0, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setupFanOut(t)
			m := NewMetrics(prometheus.NewRegistry())
			breakers := openBreakers(time.Hour)
			if tc.breakerOpen {
				breakers.For(ChannelAPNs, "").Failure("503 from APNs")
			}
			c := b.message(b.devices("apns-1", "apns-2"), b.clock.Now().Add(-tc.due), tc.lifetime)
			w := b.worker(map[string]Sender{ChannelAPNs: &recordingSender{}}, FanOutConfig{Metrics: m, Breakers: breakers})

			res := b.work(w, c)
			require.Equal(t, tc.event, res.EventKind)
			require.Equal(t, tc.want, gradesOf(t, m, PriorityBulk))
			require.Equal(t, tc.over, counterValue(t, m.overSLO.WithLabelValues(PriorityBulk)))
			require.Equal(t, tc.tries, counterValue(t, m.tries.WithLabelValues(ChannelAPNs)))
			require.Equal(t, sloGrades{}, gradesOf(t, m, PriorityUrgent))

			// Its chunk run again (retried from River UI) finds the message
			// settled and grades nothing twice.
			if tc.event == river.EventKindJobCompleted {
				_, err := b.tx.Exec(context.Background(), `UPDATE river_job SET state = 'available', finalized_at = NULL WHERE id = $1`, c.job.ID)
				require.NoError(t, err)
				require.Equal(t, river.EventKindJobCompleted, b.work(w, c).EventKind)
				require.Equal(t, tc.want, gradesOf(t, m, PriorityBulk))
				require.Equal(t, tc.over, counterValue(t, m.overSLO.WithLabelValues(PriorityBulk)))
			}
		})
	}
}
