package api

import (
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// httpMetrics count the requests a process answered, by route (the route's
// pattern, never a raw path, so that the series stay few), method and
// status, and time them by route.
type httpMetrics struct {
	requests *prometheus.CounterVec
	duration *prometheus.HistogramVec
}

// newHTTPMetrics registers the HTTP metrics on reg; nil reg keeps none.
func newHTTPMetrics(reg prometheus.Registerer) *httpMetrics {
	if reg == nil {
		return nil
	}
	m := &httpMetrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "herald_http_requests_total",
			Help: "HTTP requests answered, by route pattern (unmatched for none), method and status.",
		}, []string{"route", "method", "status"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "herald_http_request_seconds",
			Help:    "Time to answer an HTTP request, by route pattern and method.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2.5, 10),
		}, []string{"route", "method"}),
	}
	reg.MustRegister(m.requests, m.duration)
	return m
}

// observe counts one answered request.
func (m *httpMetrics) observe(route, method string, status int, latency time.Duration) {
	if m == nil {
		return
	}
	if route == "" {
		route = "unmatched"
	}
	m.requests.WithLabelValues(route, method, strconv.Itoa(status)).Inc()
	m.duration.WithLabelValues(route, method).Observe(latency.Seconds())
}
