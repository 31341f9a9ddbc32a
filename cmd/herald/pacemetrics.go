package main

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/heraldpush/herald/jobs"
	"github.com/heraldpush/herald/jobs/apps"
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
	// credential is "env" for the environment's clients (the default
	// app's), else the stored credential's version.
	labels := []string{"channel", "lane", "host", "app", "credential"}
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
	for _, l := range m.lanes {
		for channel, s := range l.Providers {
			m.collect(ch, s, channel, l.Queue, apps.DefaultName, "env")
		}
		if l.Apps == nil {
			continue
		}
		for _, c := range l.Apps.Clients(l.Queue) {
			m.collect(ch, c.Sender, c.Channel, l.Queue, c.App, strconv.Itoa(int(c.Version)))
		}
	}
}

// collect reports one client's pacing.
func (m *pacingMetrics) collect(ch chan<- prometheus.Metric, s apps.Sender, channel, lane, app, credential string) {
	gauge := func(d *prometheus.Desc, v float64, host string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, channel, lane, host, app, credential)
	}
	if p, ok := s.(hostPacer); ok {
		for _, h := range p.Pacing() {
			gauge(m.inFlight, float64(h.InFlightLimit), h.Host)
			gauge(m.rate, h.Rate, h.Host)
		}
		return
	}
	if p, ok := s.(inFlightLimiter); ok {
		gauge(m.inFlight, float64(p.InFlightLimit()), "")
	}
	if p, ok := s.(rateLimiter); ok {
		gauge(m.rate, p.Rate(), "")
	}
}
