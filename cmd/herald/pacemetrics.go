package main

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/heraldpush/herald/jobs"
	"github.com/heraldpush/herald/jobs/push/webpush"
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

// hostPacer is a provider client paced per service host: Web Push's, one
// push.Limiter per push service.
type hostPacer interface {
	Pacing() []webpush.HostPacing
}

// pacingMetrics reports each lane's provider clients' current bound on
// requests in flight, and the sustained rate of those that keep to one: for
// Web Push one series per push service sent to lately (its client forgets
// the idle ones, so the hosts shown stay few), for the others one with an
// empty host.
type pacingMetrics struct {
	lanes          []jobs.Lane
	inFlight, rate *prometheus.Desc
}

func registerPacingMetrics(reg prometheus.Registerer, lanes []jobs.Lane) {
	labels := []string{"channel", "lane", "host"}
	reg.MustRegister(&pacingMetrics{
		lanes: lanes,
		inFlight: prometheus.NewDesc("herald_provider_in_flight_limit",
			"The bound on a provider client's requests in flight now (for Web Push, to one push service): its MaxInFlight, or less while the provider throttles Herald or does not answer in time.",
			labels, nil),
		rate: prometheus.NewDesc("herald_provider_rate_limit",
			"The sends a second a provider client keeps to (for Web Push, to one push service); 0 for none.",
			labels, nil),
	})
}

func (m *pacingMetrics) Describe(ch chan<- *prometheus.Desc) {
	ch <- m.inFlight
	ch <- m.rate
}

func (m *pacingMetrics) Collect(ch chan<- prometheus.Metric) {
	gauge := func(d *prometheus.Desc, v float64, channel, lane, host string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, channel, lane, host)
	}
	for _, l := range m.lanes {
		for channel, s := range l.Providers {
			if p, ok := s.(hostPacer); ok {
				for _, h := range p.Pacing() {
					gauge(m.inFlight, float64(h.InFlightLimit), channel, l.Queue, h.Host)
					gauge(m.rate, h.Rate, channel, l.Queue, h.Host)
				}
				continue
			}
			if p, ok := s.(inFlightLimiter); ok {
				gauge(m.inFlight, float64(p.InFlightLimit()), channel, l.Queue, "")
			}
			if p, ok := s.(rateLimiter); ok {
				gauge(m.rate, p.Rate(), channel, l.Queue, "")
			}
		}
	}
}
