package main

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/heraldpush/herald/api"
)

// registerConnMetrics exports the listener's connections: open now, and
// refused or closed to make room since the process started.
func registerConnMetrics(reg prometheus.Registerer, l *api.LimitedListener) {
	reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "herald_http_connections", Help: "HTTP connections open now.",
		}, func() float64 { open, _, _ := l.Counts(); return float64(open) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "herald_http_connections_refused_total",
			Help: "Connections closed as they came: past a client's limit, or past the total with none idle.",
		}, func() float64 { _, refused, _ := l.Counts(); return float64(refused) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "herald_http_connections_recycled_total",
			Help: "Idle connections closed to make room for new ones, past the total.",
		}, func() float64 { _, _, recycled := l.Counts(); return float64(recycled) }),
	)
}
