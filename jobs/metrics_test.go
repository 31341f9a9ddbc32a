package jobs

import (
	"os"
	"regexp"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
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
	RegisterProcessMetrics(reg, NewBreakers(BreakerConfig{}, ChannelAPNs), NewClock(tdb.Pool, discard))
	RegisterMessageMetrics(reg, tdb.Pool)
	// Make every vector show at least one series.
	m.count(PriorityBulk, []settledDelivery{{channel: "apns", status: "accepted", skew: time.Millisecond}})
	m.chunkStarted(PriorityBulk)()
	m.latency.WithLabelValues("apns", "accepted").Observe(0.02)
	m.reconciledDeliveries("apns", 1)
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
