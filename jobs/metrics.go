package jobs

import (
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/heraldpush/herald/jobs/apps"
	"github.com/heraldpush/herald/jobs/push"
)

// Metrics are the dispatch path's Prometheus metrics. Skew is a histogram,
// not percentiles, so that it can be summed across processes and over time.
type Metrics struct {
	deliveries     *prometheus.CounterVec
	skew           *prometheus.HistogramVec
	latency        *prometheus.HistogramVec
	chunksInFlight *prometheus.GaugeVec
	wakes          *prometheus.CounterVec
	// reconciled counts what the reconciler settled: messages no chunk
	// would settle, and their deliveries it expired, by channel; and the
	// chunks completed without their close that it ran again.
	reconciledMessages prometheus.Counter
	reconciledChunks   prometheus.Counter
	reconciledExpired  *prometheus.CounterVec
	// messageSkew and overSLO grade the SLO as it is promised, per
	// message: each settled message's maximum skew (SettleMessage's
	// slo_skew_ms), observed once, by the process whose write settled it.
	messageSkew *prometheus.HistogramVec
	overSLO     *prometheus.CounterVec
	// tries counts the due deliveries each chunk pass sets out to send, so
	// that an outage (deliveries due, none accepted) shows even while the
	// breakers park everything and nothing settles.
	tries *prometheus.CounterVec
	// takenOver counts the chunks Takeover made available again.
	takenOver prometheus.Counter
	// silentEnded counts the liveness sessions of silent workers Takeover
	// ended.
	silentEnded prometheus.Counter
	// webhookCalls counts webhook batches' attempts by outcome.
	webhookCalls *prometheus.CounterVec
	// credentialsRefused counts the pushes a provider refused for their
	// app's credentials, by app and channel.
	credentialsRefused *prometheus.CounterVec
}

// SLOSkew is Herald's promise: every device of a message reached within a
// second of its time.
const SLOSkew = time.Second

// skewBuckets are fine below a second, where the SLO lives, and coarse
// beyond it, where a delivery is late whatever its exact figure.
var skewBuckets = []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1, 1.25, 1.5, 2, 3, 5, 10, 30, 60}

// SkewBuckets returns the skew histograms' buckets, for another histogram
// of skew (the API's confirmed skew) to be read beside these.
func SkewBuckets() []float64 { return slices.Clone(skewBuckets) }

// NewMetrics registers the dispatch metrics on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		deliveries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "herald_deliveries_total",
			Help: "Deliveries settled by chunk workers, by channel, status (accepted, failed, expired) and failure reason.",
		}, []string{"channel", "status", "reason"}),
		skew: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "herald_delivery_skew_seconds",
			Help:    "Provider acceptance minus the delivery's due time (database clock), per accepted delivery, by priority.",
			Buckets: skewBuckets,
		}, []string{"priority"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "herald_provider_request_seconds",
			Help:    "Duration of provider requests, by app, channel and outcome.",
			Buckets: prometheus.ExponentialBuckets(0.005, 2, 12),
		}, []string{"app", "channel", "outcome"}),
		chunksInFlight: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "herald_chunks_in_flight",
			Help: "Chunk jobs being worked in this process, by lane.",
		}, []string{"lane"}),
		wakes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "herald_lane_wakes_total",
			Help: "Times this process woke a lane's fetch at the instant its chunks fell due, by lane.",
		}, []string{"lane"}),
		reconciledMessages: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "herald_reconciled_messages_total",
			Help: "Messages the reconciler settled because no chunk would: their chunk jobs were discarded, cancelled or deleted, or a settle was lost.",
		}),
		reconciledChunks: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "herald_reconciled_chunks_total",
			Help: "Chunks River had completed without their close written (a failover to a standby that had not received it), run again by the reconciler to send and write what was pending.",
		}),
		reconciledExpired: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "herald_reconciled_deliveries_total",
			Help: "Pending deliveries the reconciler expired, past their expiry with no chunk left to send them, by channel.",
		}, []string{"channel"}),
		messageSkew: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "herald_message_skew_max_seconds",
			Help:    "Each settled message's maximum skew, as the one-second SLO grades it: the latest any due delivery was answered after its due time, a delivery that expired unsent always past 1 s; by priority (lane).",
			Buckets: skewBuckets,
		}, []string{"priority"}),
		overSLO: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "herald_messages_over_slo_total",
			Help: "Settled messages whose maximum skew passed 1 s (some device reached late, or not at all), by priority (lane).",
		}, []string{"priority"}),
		tries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "herald_delivery_tries_total",
			Help: "Due deliveries chunk passes set out to send, by channel; one parked behind an open breaker counts again each time its chunk wakes.",
		}, []string{"channel"}),
		takenOver: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "herald_chunks_taken_over_total",
			Help: "Running chunks this process made available again because the worker process running them was gone (its liveness lock free).",
		}),
		silentEnded: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "herald_liveness_sessions_ended_total",
			Help: "Liveness sessions of worker processes gone silent (frozen, or cut off from the database) that this process ended, so that their chunks could be taken over.",
		}),
		webhookCalls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "herald_webhook_calls_total",
			Help: "Webhook batch calls by outcome: delivered (2xx), retried (any other answer, or none), given_up (a day after the first attempt), dropped (the webhook was deleted).",
		}, []string{"outcome"}),
		credentialsRefused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "herald_credentials_refused_total",
			Help: "Pushes a provider refused for their app's credentials (APNs InvalidProviderToken or TopicDisallowed, FCM UNAUTHENTICATED or PERMISSION_DENIED, a Web Push 401), by app and channel.",
		}, []string{"app", "channel"}),
	}
	reg.MustRegister(m.deliveries, m.skew, m.latency, m.chunksInFlight, m.wakes, m.reconciledMessages, m.reconciledChunks, m.reconciledExpired,
		m.messageSkew, m.overSLO, m.tries, m.takenOver, m.silentEnded, m.webhookCalls, m.credentialsRefused)
	for _, outcome := range []string{"delivered", "retried", "given_up", "dropped"} {
		m.webhookCalls.WithLabelValues(outcome)
	}
	// The series the alerts count increases of start at zero, so that the
	// first message over the SLO, or the first delivery to expire, is an
	// increase Prometheus sees rather than a series that appears at 1.
	for _, priority := range []string{PriorityUrgent, PriorityBulk} {
		m.overSLO.WithLabelValues(priority)
		m.messageSkew.WithLabelValues(priority)
	}
	for _, lane := range LaneQueues {
		m.wakes.WithLabelValues(lane)
	}
	for _, channel := range Channels {
		m.tries.WithLabelValues(channel)
		m.deliveries.WithLabelValues(channel, "expired", "")
		m.reconciledExpired.WithLabelValues(channel)
	}
	return m
}

// settled grades a message its process settled: its maximum skew as
// SettleMessage computed it (slo_skew_ms), nil when nothing of it was due.
// Only the transaction whose guard settled the message returns it, so each
// message is observed once across every process.
func (m *Metrics) settled(priority string, sloSkewMs *float64) {
	if m == nil || sloSkewMs == nil {
		return
	}
	skew := time.Duration(*sloSkewMs * float64(time.Millisecond))
	m.messageSkew.WithLabelValues(priority).Observe(skew.Seconds())
	if skew > SLOSkew {
		m.overSLO.WithLabelValues(priority).Inc()
	}
}

// webhookCall counts one webhook batch's attempt.
func (m *Metrics) webhookCall(outcome string) {
	if m != nil {
		m.webhookCalls.WithLabelValues(outcome).Inc()
	}
}

// tried counts the deliveries a chunk pass sets out to send, by channel.
func (m *Metrics) tried(n map[string]int) {
	if m == nil {
		return
	}
	for channel, k := range n {
		m.tries.WithLabelValues(channel).Add(float64(k))
	}
}

// silentLivenessEnded counts the liveness sessions of silent workers
// Takeover ended.
func (m *Metrics) silentLivenessEnded(n int) {
	if m != nil {
		m.silentEnded.Add(float64(n))
	}
}

// chunkTakenOver counts a chunk Takeover made available again.
func (m *Metrics) chunkTakenOver() {
	if m != nil {
		m.takenOver.Inc()
	}
}

// reconciledMessage counts a message the reconciler settled.
func (m *Metrics) reconciledMessage() {
	if m != nil {
		m.reconciledMessages.Inc()
	}
}

// reconciledChunk counts a chunk the reconciler ran again.
func (m *Metrics) reconciledChunk() {
	if m != nil {
		m.reconciledChunks.Inc()
	}
}

// reconciledDeliveries counts deliveries of a channel the reconciler
// expired.
func (m *Metrics) reconciledDeliveries(channel string, n int) {
	if m != nil {
		m.reconciledExpired.WithLabelValues(channel).Add(float64(n))
	}
}

// chunkStarted counts a chunk in flight until the returned func is called.
func (m *Metrics) chunkStarted(priority string) func() {
	if m == nil {
		return func() {}
	}
	g := m.chunksInFlight.WithLabelValues(laneQueue(priority))
	g.Inc()
	return g.Dec
}

// woke counts a lane woken at its chunks' due instant.
func (m *Metrics) woke(lane string) {
	if m != nil {
		m.wakes.WithLabelValues(lane).Inc()
	}
}

// settledDelivery is one delivery a chunk wrote, for the metrics.
type settledDelivery struct {
	channel, status string
	reason          push.Reason
	skew            time.Duration
}

// count counts deliveries once their write has committed: a settled one by
// status and reason, and an accepted one's skew. Pending ones (parked
// behind a breaker) are not settled yet.
func (m *Metrics) count(priority string, ds []settledDelivery) {
	if m == nil {
		return
	}
	for _, d := range ds {
		if d.status == "pending" {
			continue
		}
		m.deliveries.WithLabelValues(d.channel, d.status, string(d.reason)).Inc()
		if d.status == "accepted" {
			m.skew.WithLabelValues(priority).Observe(d.skew.Seconds())
		}
	}
}

// requested observes one provider request's duration.
func (m *Metrics) requested(app, channel string, r push.Result) {
	if m == nil || r.Latency == 0 {
		return
	}
	outcome := "accepted"
	switch {
	case r.Unanswered:
		outcome = "no_answer"
	case !r.Accepted:
		outcome = string(r.Reason)
	}
	m.latency.WithLabelValues(app, channel, outcome).Observe(r.Latency.Seconds())
}

// refused counts a push refused for its app's credentials.
func (m *Metrics) refused(app, channel string) {
	if m != nil {
		m.credentialsRefused.WithLabelValues(app, channel).Inc()
	}
}

// RegisterProcessMetrics adds what a worker process reports about itself:
// each app's breakers' state (1 for the current one, by app and channel;
// names gives an app's name, nil for the default app alone) and the
// database clock offset, both read when scraped.
func RegisterProcessMetrics(reg prometheus.Registerer, breakers *Breakers, clock *Clock, names func(int32) string) {
	reg.MustRegister(&breakerStates{breakers: breakers, names: names})
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "herald_database_clock_offset_seconds",
		Help: "The database's clock minus this host's, as last measured; dispatch times are judged by the database's.",
	}, func() float64 { return clock.Offset().Seconds() }))
}

// breakerStateDesc is herald_breaker_state: a series per app, channel and
// state, the apps being those that have sent here (and the default app).
var breakerStateDesc = prometheus.NewDesc("herald_breaker_state",
	"1 when the app's provider circuit breaker is in this state.", []string{"app", "channel", "state"}, nil)

// breakerStates collects herald_breaker_state when scraped.
type breakerStates struct {
	breakers *Breakers
	names    func(int32) string
}

func (b *breakerStates) Describe(ch chan<- *prometheus.Desc) { ch <- breakerStateDesc }

func (b *breakerStates) Collect(ch chan<- prometheus.Metric) {
	states := []string{BreakerClosed, BreakerHalfOpen, BreakerOpen}
	for _, id := range b.breakers.AppIDs() {
		name := apps.DefaultName
		if b.names != nil {
			name = b.names(id)
		}
		if name == "" {
			continue
		}
		set := b.breakers.App(id)
		for _, channel := range Channels {
			st, ok := set.AppStatus(channel)
			if !ok {
				continue
			}
			for _, state := range states {
				v := 0.0
				if st.State == state {
					v = 1
				}
				ch <- prometheus.MustNewConstMetric(breakerStateDesc, prometheus.GaugeValue, v, name, channel, state)
			}
		}
	}
}
