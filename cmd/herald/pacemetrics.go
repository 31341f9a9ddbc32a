package main

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/heraldpush/herald/jobs"
)

// inFlightLimiter is a provider client whose bound on requests in flight
// adapts (push.Limiter).
type inFlightLimiter interface {
	InFlightLimit() int
}

// registerPacingMetrics reports each lane's provider clients' current bound
// on requests in flight.
func registerPacingMetrics(reg prometheus.Registerer, lanes []jobs.Lane) {
	for _, l := range lanes {
		for channel, s := range l.Providers {
			p, ok := s.(inFlightLimiter)
			if !ok {
				continue
			}
			reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
				Name:        "herald_provider_in_flight_limit",
				Help:        "The bound on a provider client's requests in flight now: its MaxInFlight, or less while the provider throttles Herald or does not answer in time.",
				ConstLabels: prometheus.Labels{"channel": channel, "lane": l.Queue},
			}, func() float64 { return float64(p.InFlightLimit()) }))
		}
	}
}
