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

// rateLimiter is a provider client that keeps to a sustained rate.
type rateLimiter interface {
	Rate() float64
}

// registerPacingMetrics reports each lane's provider clients' current bound
// on requests in flight, and the sustained rate of those that keep to one.
func registerPacingMetrics(reg prometheus.Registerer, lanes []jobs.Lane) {
	for _, l := range lanes {
		for channel, s := range l.Providers {
			labels := prometheus.Labels{"channel": channel, "lane": l.Queue}
			if p, ok := s.(inFlightLimiter); ok {
				reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
					Name:        "herald_provider_in_flight_limit",
					Help:        "The bound on a provider client's requests in flight now: its MaxInFlight, or less while the provider throttles Herald or does not answer in time.",
					ConstLabels: labels,
				}, func() float64 { return float64(p.InFlightLimit()) }))
			}
			if p, ok := s.(rateLimiter); ok {
				reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
					Name:        "herald_provider_rate_limit",
					Help:        "The sends a second a provider client keeps to; 0 for none.",
					ConstLabels: labels,
				}, func() float64 { return p.Rate() }))
			}
		}
	}
}
