package main

import (
	"context"
	"log/slog"
	"maps"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/heraldpush/herald/jobs"
	"github.com/heraldpush/herald/jobs/push"
	"github.com/heraldpush/herald/jobs/push/apns"
	"github.com/heraldpush/herald/jobs/push/fcm"
	"github.com/heraldpush/herald/jobs/push/pushtest"
	"github.com/heraldpush/herald/jobs/push/webpush"
)

// TestPacingMetricsPerPushService builds a lane's provider clients from
// fakepush's variables as serve does, sends one Web Push, and reads the
// pacing metrics: APNs and FCM show one series each, with no host; Web
// Push one per push service sent to, with HERALD_RATE_WEBPUSH_HOST.
func TestPacingMetricsPerPushService(t *testing.T) {
	t.Parallel()
	fp := pushtest.Start(t)
	vars := maps.Clone(fp.Env)
	vars["HERALD_LANES"] = "bulk"
	vars["HERALD_RATE_WEBPUSH_HOST"] = "50"
	cfg, err := loadConfig(env(vars))
	require.NoError(t, err)
	l, _, err := buildLanes(context.Background(), cfg, slog.New(slog.DiscardHandler), nil)
	require.NoError(t, err)
	t.Cleanup(l.close)
	reg := prometheus.NewRegistry()
	registerPacingMetrics(reg, l.lanes)

	gauges := func() map[string]float64 {
		families, err := reg.Gather()
		require.NoError(t, err)
		out := map[string]float64{}
		for _, f := range families {
			for _, m := range f.GetMetric() {
				labels := map[string]string{}
				for _, lp := range m.GetLabel() {
					labels[lp.GetName()] = lp.GetValue()
				}
				require.Equal(t, "bulk", labels["lane"])
				out[f.GetName()+" "+labels["channel"]+" "+labels["host"]] = m.GetGauge().GetValue()
			}
		}
		return out
	}
	require.Equal(t, map[string]float64{
		"herald_provider_in_flight_limit apns ": apns.DefaultMaxInFlight,
		"herald_provider_in_flight_limit fcm ":  fcm.DefaultMaxInFlight,
		"herald_provider_rate_limit fcm ":       fcm.DefaultRate,
	}, gauges(), "no Web Push series before a push service is sent to")

	sub := fp.Subscribe(t, 1, false)
	results := make([]push.Result, 1)
	l.lanes[0].Providers[jobs.ChannelWebPush].Send(context.Background(), pushtest.Message(t, "msg_1", false), sub, results, pushtest.AllowAll, nil)
	require.True(t, results[0].Accepted, "%+v", results[0])
	host := strings.TrimPrefix(fp.URL, "https://")
	require.Equal(t, map[string]float64{
		"herald_provider_in_flight_limit apns ":           apns.DefaultMaxInFlight,
		"herald_provider_in_flight_limit fcm ":            fcm.DefaultMaxInFlight,
		"herald_provider_rate_limit fcm ":                 fcm.DefaultRate,
		"herald_provider_in_flight_limit webpush " + host: webpush.DefaultMaxInFlight,
		"herald_provider_rate_limit webpush " + host:      50,
	}, gauges())
}

// TestWebPushHostRateConfig: HERALD_RATE_WEBPUSH_HOST is a whole number of
// sends a second, -1 for no bound.
func TestWebPushHostRateConfig(t *testing.T) {
	t.Parallel()
	c, err := loadConfig(env(map[string]string{"HERALD_RATE_WEBPUSH_HOST": "-1"}))
	require.NoError(t, err)
	require.Equal(t, -1, c.WebPushHostRate)
	for _, v := range []string{"-2", "fast", "1.5"} {
		_, err := loadConfig(env(map[string]string{"HERALD_RATE_WEBPUSH_HOST": v}))
		require.ErrorContains(t, err, "HERALD_RATE_WEBPUSH_HOST", v)
	}
}
