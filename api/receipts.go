package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/heraldpush/herald/db"
	"github.com/heraldpush/herald/jobs"
	"github.com/heraldpush/herald/jobs/receipt"
)

// Receipts: what the phone saw. Every push carries a receipt token naming
// its delivery (package receipt); the app posts it back from the device,
// without an API key (the token is the credential), when the push arrived
// (delivered) and when the user tapped it (opened). A forged or expired
// token is refused before the database is read; the others are handed to
// the process's receipt writer, which commits the receipts of every
// request in flight together, and each request is answered once its
// receipts are on disk.

// The receipt events an app may post.
const (
	EventDelivered = "delivered"
	EventOpened    = "opened"
)

// The outcome of one receipt, as the answer names it and the metrics count
// it; rate_limited counts a request refused before its body was read.
const (
	outcomeRecorded    = "recorded"
	outcomeReplayed    = "replayed"
	outcomeForged      = "forged"
	outcomeExpired     = "expired"
	outcomeErased      = "erased"
	outcomeRateLimited = "rate_limited"
)

// maxReceiptsPerRequest bounds a request's receipts: a device has a few to
// send at a time, a relay of many devices batches them.
const maxReceiptsPerRequest = 100

// receiptBodyLimit fits maxReceiptsPerRequest receipts of the longest token
// and a device time each, with room to spare.
const receiptBodyLimit = 32 << 10

// receiptEvery is how often the receipt writer commits: a request waits for
// at most about this and one write, and a process makes at most forty
// writes a second however many phones answer at once. It is the ledger
// writer's beat: receipts come while their message is being sent, and each
// write locks the message rows the ledger writer locks too. At 2 ms, 25,000
// receipts coming back during a 25,000-device fan-out cost PostgreSQL
// about three times the CPU a receipt, and the fan-out a tenth more time
// (two runs each of herald bench --receipts: 255 against 88 µs a receipt,
// fan-out/blast 1.67 against 1.53; 1.33 with no receipts at all).
const receiptEvery = 25 * time.Millisecond

// maxReceiptBatch bounds one write's receipts; more wait for the next.
const maxReceiptBatch = 5000

// fullReceiptBatch is a batch worth writing without waiting out
// receiptEvery: when phones answer by the thousand a second, the writer
// keeps up with them rather than with its beat.
const fullReceiptBatch = 500

// receiptWriteTimeout bounds one write of the receipt writer.
const receiptWriteTimeout = 10 * time.Second

type receiptsRequest struct {
	Receipts []receiptRequest `json:"receipts"`
}

type receiptRequest struct {
	Token      string  `json:"token"`
	Event      string  `json:"event"`
	DeviceTime *string `json:"device_time"`

	deviceAt time.Time
}

func (r *receiptsRequest) validate() error {
	if len(r.Receipts) == 0 || len(r.Receipts) > maxReceiptsPerRequest {
		return invalid("receipts", "receipts must hold 1 to %d receipts, not %d", maxReceiptsPerRequest, len(r.Receipts))
	}
	for i := range r.Receipts {
		it := &r.Receipts[i]
		field := fmt.Sprintf("receipts[%d]", i)
		if it.Event != EventDelivered && it.Event != EventOpened {
			return invalid(field+".event", "event %q is not one of delivered, opened", it.Event)
		}
		if it.Token == "" {
			return invalid(field+".token", "token is required: the value of herald_receipt in the push")
		}
		if it.DeviceTime != nil {
			at, err := parseBoundedInstant(field+".device_time", *it.DeviceTime)
			if err != nil {
				return err
			}
			it.deviceAt = at
		}
	}
	return nil
}

// receiptResult is one receipt's outcome in the answer.
type receiptResult struct {
	Result string `json:"result"`
}

type receiptsAnswer struct {
	Results []receiptResult `json:"results"`
}

// postReceipts records what devices said of their pushes. The answer is 200
// with one result per receipt, in order, when at least one was taken
// (recorded, or replayed: already recorded, which changes nothing); when
// none was (every token forged, expired or naming a delivery Herald no
// longer has), 401 invalid_receipt with the same results, so that an app
// posting one receipt needs to read only the status.
func (s *Server) postReceipts(c echo.Context) error {
	signer := s.receiptSigner.Load()
	if signer == nil {
		return &Error{Status: http.StatusServiceUnavailable, Code: "unavailable", RetryAfter: unavailableRetryAfter,
			Message: "receipts cannot be checked yet: the database has not answered; try again after Retry-After seconds"}
	}
	var req receiptsRequest
	if err := decode(c, receiptBodyLimit, &req); err != nil {
		return err
	}
	now := time.Now()
	results := make([]receiptResult, len(req.Receipts))
	var (
		writes []db.ReceiptWrite
		at     []int
	)
	for i, it := range req.Receipts {
		d, err := signer.Verify(it.Token, now)
		switch {
		case errors.Is(err, receipt.ErrExpired):
			results[i].Result = outcomeExpired
			continue
		case err != nil:
			results[i].Result = outcomeForged
			continue
		}
		w := db.ReceiptWrite{MessageID: d.MessageID, DeviceID: d.DeviceID, Event: it.Event}
		if !it.deviceAt.IsZero() {
			w.DeviceAtUs = it.deviceAt.UnixMicro()
		}
		writes = append(writes, w)
		at = append(at, i)
	}
	if len(writes) > 0 {
		outcomes, err := s.receipts.write(c.Request().Context(), writes)
		if err != nil {
			return fmt.Errorf("record receipts: %w", err)
		}
		for j, o := range outcomes {
			results[at[j]].Result = o
		}
	}
	taken := false
	for i, r := range results {
		s.receiptMetrics.count(req.Receipts[i].Event, r.Result)
		taken = taken || r.Result == outcomeRecorded || r.Result == outcomeReplayed
	}
	if !taken {
		return &Error{Status: http.StatusUnauthorized, Code: "invalid_receipt",
			Message: "no receipt was taken: each token is forged, expired, or names a delivery Herald no longer has (its device erased, or its message past the retention)",
			Extra:   map[string]any{"results": results}}
	}
	return c.JSON(http.StatusOK, receiptsAnswer{Results: results})
}

// anyOrigin lets a page of any origin read the answer: a service worker
// posts receipts from its site's origin, not Herald's. It is safe because
// the call carries no cookie or key, only the tokens, which are worth the
// same from anywhere.
func anyOrigin(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		c.Response().Header().Set(echo.HeaderAccessControlAllowOrigin, "*")
		return next(c)
	}
}

// receiptsPreflight answers a browser's CORS preflight of POST
// /v1/receipts, which its JSON body makes it send first, and lets the
// browser keep the answer for a day.
func receiptsPreflight(c echo.Context) error {
	h := c.Response().Header()
	h.Set(echo.HeaderAccessControlAllowOrigin, "*")
	h.Set(echo.HeaderAccessControlAllowMethods, http.MethodPost)
	h.Set(echo.HeaderAccessControlAllowHeaders, echo.HeaderContentType)
	h.Set(echo.HeaderAccessControlMaxAge, "86400")
	return c.NoContent(http.StatusNoContent)
}

// receiptAddress is the bucket of the receipts' rate limit a request
// counts against: its client's address (the one a trusted proxy names),
// an IPv6 client's /64.
func receiptAddress(c echo.Context) string { return throttleKey(c.RealIP()) }

// loadReceiptKey reads the key receipt tokens are signed with, which every
// process shares, once.
func (s *Server) loadReceiptKey(ctx context.Context) error {
	if s.receiptSigner.Load() != nil {
		return nil
	}
	signer, err := receipt.Shared(ctx, s.pool)
	if err != nil {
		return err
	}
	s.receiptSigner.Store(signer)
	return nil
}

// receiptWriter is a process's group commit of receipts: requests hand it
// their receipts and wait; it writes everything handed over since its last
// write in one transaction (db.WriteReceipts) every receiptEvery, and
// answers each request once that has committed. When phones answer a
// message by the thousand, a write carries hundreds of receipts, and their
// message's row is updated once for them all instead of once each, which
// is what would otherwise serialize them. Its goroutine runs while it holds
// something to write, through one connection it holds meanwhile, so that
// its statement is planned on that one (as the ledger writer's are).
type receiptWriter struct {
	pool    *pgxpool.Pool
	metrics *receiptMetrics
	every   time.Duration

	// full tells the writer that the next batch is worth writing now
	// (fullReceiptBatch).
	full chan struct{}

	mu      sync.Mutex
	queue   []*receiptBatch // the last one takes new receipts
	running bool
}

// receiptBatch is one write's receipts, each (message, device, event) once,
// and what became of them.
type receiptBatch struct {
	writes []db.ReceiptWrite
	index  map[db.ReceiptWrite]int
	done   chan struct{}
	out    []db.ReceiptWritten
	err    error
}

func newReceiptWriter(pool *pgxpool.Pool, metrics *receiptMetrics) *receiptWriter {
	return &receiptWriter{pool: pool, metrics: metrics, every: receiptEvery, full: make(chan struct{}, 1)}
}

// place is where one of a request's receipts is in a batch; dup says an
// earlier receipt of the batch (this request's or another's) is the same.
type place struct {
	b   *receiptBatch
	i   int
	dup bool
}

// write hands rs to the next write and waits for it, returning each
// receipt's outcome: recorded, replayed or erased. A receipt the same
// write already holds is a replay, unless the first was not found.
func (w *receiptWriter) write(ctx context.Context, rs []db.ReceiptWrite) ([]string, error) {
	places := make([]place, len(rs))
	w.mu.Lock()
	for i, r := range rs {
		var b *receiptBatch
		if n := len(w.queue); n > 0 && len(w.queue[n-1].writes) < maxReceiptBatch {
			b = w.queue[n-1]
		} else {
			b = &receiptBatch{index: map[db.ReceiptWrite]int{}, done: make(chan struct{})}
			w.queue = append(w.queue, b)
		}
		key := db.ReceiptWrite{MessageID: r.MessageID, DeviceID: r.DeviceID, Event: r.Event}
		if j, ok := b.index[key]; ok {
			places[i] = place{b: b, i: j, dup: true}
			continue
		}
		b.index[key] = len(b.writes)
		places[i] = place{b: b, i: len(b.writes)}
		b.writes = append(b.writes, r)
	}
	if !w.running {
		w.running = true
		go w.run()
	}
	if len(w.queue[0].writes) >= fullReceiptBatch {
		select {
		case w.full <- struct{}{}:
		default:
		}
	}
	w.mu.Unlock()

	out := make([]string, len(rs))
	for i, p := range places {
		select {
		case <-p.b.done:
		case <-ctx.Done():
			// The write may still commit; the app sends again, and the
			// receipt is then a replay.
			return nil, ctx.Err()
		}
		if p.b.err != nil {
			return nil, p.b.err
		}
		switch o := p.b.out[p.i]; {
		case !o.Found:
			out[i] = outcomeErased
		case o.Inserted && !p.dup:
			out[i] = outcomeRecorded
		default:
			out[i] = outcomeReplayed
		}
	}
	return out, nil
}

// run writes the batches handed over, one write every w.every at most
// unless the next is full, until none is left.
func (w *receiptWriter) run() {
	held := db.Hold(w.pool)
	defer held.Release()
	for last := time.Now(); ; {
		// A write that took longer than every is followed by the next at
		// once; the first waits for the receipts that come with it.
		if wait := w.every - time.Since(last); wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-t.C:
			case <-w.full:
			}
			t.Stop()
		}
		last = time.Now()
		w.mu.Lock()
		if len(w.queue) == 0 {
			w.running = false
			w.mu.Unlock()
			return
		}
		b := w.queue[0]
		w.queue = w.queue[1:]
		w.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), receiptWriteTimeout)
		b.err = held.Write(ctx, func(conn db.Batcher) (err error) {
			b.out, err = db.WriteReceipts(ctx, conn, b.writes)
			return err
		})
		cancel()
		for i, o := range b.out {
			if o.Inserted && b.writes[i].Event == EventDelivered {
				w.metrics.skew.Observe(o.SkewMs / 1000)
			}
		}
		close(b.done)
	}
}

// receiptMetrics count receipts by event and outcome, and time the
// confirmed deliveries' skew: when Herald heard from the device less the
// delivery's due instant.
type receiptMetrics struct {
	receipts *prometheus.CounterVec
	skew     prometheus.Histogram
}

// receiptSkewBuckets are the delivery skew's, and a tail for the phones
// that were off or out of reach for minutes to an hour.
var receiptSkewBuckets = append(jobs.SkewBuckets(), 120, 300, 900, 3600)

// newReceiptMetrics registers the receipt metrics on reg; with nil reg
// they are kept but not exported.
func newReceiptMetrics(reg prometheus.Registerer) *receiptMetrics {
	m := &receiptMetrics{
		receipts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "herald_receipts_total",
			Help: "Receipts devices posted, by event (delivered, opened; unknown for a request refused by the rate limit) and outcome (recorded, replayed, forged, expired, erased, rate_limited).",
		}, []string{"event", "outcome"}),
		skew: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "herald_receipt_skew_seconds",
			Help:    "Confirmed skew: when a delivery's delivered receipt reached Herald less the delivery's due instant, for each receipt recorded.",
			Buckets: receiptSkewBuckets,
		}),
	}
	// Every series from zero, so that a rate over the first receipts is
	// right and a dashboard finds each before anything happened.
	for _, event := range []string{EventDelivered, EventOpened} {
		for _, outcome := range []string{outcomeRecorded, outcomeReplayed, outcomeForged, outcomeExpired, outcomeErased} {
			m.receipts.WithLabelValues(event, outcome)
		}
	}
	m.receipts.WithLabelValues("unknown", outcomeRateLimited)
	if reg != nil {
		reg.MustRegister(m.receipts, m.skew)
	}
	return m
}

func (m *receiptMetrics) count(event, outcome string) {
	m.receipts.WithLabelValues(event, outcome).Inc()
}

func (m *receiptMetrics) rateLimited() { m.count("unknown", outcomeRateLimited) }
