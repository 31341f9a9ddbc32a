package heraldbench

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/url"
	"slices"
	"time"

	"github.com/heraldpush/herald/db"
	"github.com/heraldpush/herald/jobs/push/fake"
)

// Result is the JSON line `herald bench` ends with.
type Result struct {
	Machine string `json:"machine"`
	Users   int    `json:"users"`
	Devices int    `json:"devices"`
	// Apps is how many apps the devices were spread over (--apps).
	Apps       int     `json:"apps"`
	LatencyMs  float64 `json:"latency_ms"`
	Accepted   int     `json:"accepted"`
	Duplicates int64   `json:"duplicates"`
	// Unanswered counts the provider requests of every Herald process that
	// got no answer in time: each was sent again, and may be a duplicate.
	Unanswered int64 `json:"unanswered"`
	// ScheduleMs is how long the bulk messages' POSTs took, one after
	// the other; ChunkCount their chunks.
	ScheduleMs float64 `json:"schedule_ms"`
	// ScheduleBytesPerDevice is how much the database grew by, a device,
	// from before the POSTs to after them: what is written before the
	// instant.
	ScheduleBytesPerDevice float64 `json:"schedule_bytes_per_device"`
	ChunkCount             int     `json:"chunk_count"`
	// Retained is what --retain found: the database's size before the
	// POSTs, once the messages had settled, and after their retention and
	// a VACUUM; nil without it.
	Retained      *Retained `json:"retained,omitempty"`
	SkewMs        summary   `json:"skew_ms"`
	ReceiptSkewMs summary   `json:"receipt_skew_ms"`
	UrgentSkewMs  float64   `json:"urgent_skew_ms"`
	// Cold says what --cold did to the caches before the instant; empty
	// without it.
	Cold string `json:"cold,omitempty"`
	// Connections is what fakepush counted of the provider connections
	// around the instant, with --drop-connections; null without it.
	Connections *Connections `json:"connections"`
	// FirstPushMs is, per channel, when the bulk messages' first push
	// reached fakepush after the instant (its receipt's time, the host's
	// clock): with the first chunk's first acceptance (first_skew_ms), what
	// an instant's first push pays before its request is on the wire, a TLS
	// handshake when its connection had to be opened.
	FirstPushMs map[string]float64 `json:"first_push_ms"`
	// UrgentPickupMs is when the urgent chunk started after its due time:
	// the rest of urgent_skew_ms is its reads, the send and the answer.
	UrgentPickupMs float64 `json:"urgent_pickup_ms"`
	// UrgentReceiptMs is when the urgent push reached fakepush after its
	// due time: what is left of urgent_skew_ms after it is the provider's
	// answer (its latency, and its CPU, shared here with the bulk fan-out).
	UrgentReceiptMs float64 `json:"urgent_receipt_ms"`
	// Probe is the floor under urgent_skew_ms on this machine: round trips
	// the bench makes from its own, otherwise idle, process while the bulk
	// message is in flight (probe). An urgent push waits for its lane's
	// fetch, a database round trip to begin and a provider round trip, and
	// none of them is quicker than these while the cores are saturated.
	Probe struct {
		ProviderMs summary `json:"provider_ms"`
		DatabaseMs summary `json:"database_ms"`
	} `json:"probe"`
	FanoutMs       float64 `json:"fanout_ms"`
	BlastMs        float64 `json:"blast_ms"`
	CPUPerSend     float64 `json:"cpu_us_per_send"`
	IdleCPUPercent float64 `json:"idle_cpu_percent"`
	// PostgresCPUPerSend is the database's CPU over the same spans as
	// cpu_us_per_send, per send: the ledger's share of the dispatch second,
	// which the blast does not pay. Null when the database is not a process
	// of this host.
	PostgresCPUPerSend *float64 `json:"postgres_cpu_us_per_send"`
	// WALBytesPerSend is the WAL the cluster wrote over the same spans as
	// postgres_cpu_us_per_send (scheduling and the fan-out), a send: what a
	// standby and the archive receive.
	WALBytesPerSend *float64 `json:"wal_bytes_per_send"`
	// Workers is --workers: the fan-out's worker processes beside an API
	// process; 0 for one process that does both.
	Workers        int     `json:"workers,omitempty"`
	BlastCPUPerSnd float64 `json:"blast_cpu_us_per_send"`
	PeakRSSMb      float64 `json:"peak_rss_mb"`
	Breakdown      struct {
		PickupMs      pair `json:"pickup_ms"`
		FirstAcceptMs pair `json:"first_accept_ms"`
		LastAcceptMs  pair `json:"last_accept_ms"`
		LedgerWriteMs pair `json:"ledger_write_ms"`
	} `json:"breakdown"`
	Tuning map[string]string `json:"tuning,omitempty"`
	// Throttled is the healthy devices' figures, and with --throttled the
	// throttled ones' (throttle.go).
	Throttled *Throttled `json:"throttled"`
	// UrgentWorker says the urgent lane ran in a process of its own
	// (--urgent-worker); cpu_us_per_send and peak_rss_mb then cover both
	// processes (the sum of their CPU, the larger peak).
	UrgentWorker bool `json:"urgent_worker,omitempty"`
	// HistoryRows are the settled ledger rows the database held before the
	// measured messages (--history).
	HistoryRows int `json:"history_rows"`
	// Payload is the bulk message's payload, plain or rich (--payload).
	Payload string `json:"payload"`
	// Messages is how many bulk messages were due at the instant
	// (--messages), each to users users of its own. devices, accepted,
	// skew_ms, receipt_skew_ms, fanout_ms, breakdown, the blast and the CPU
	// figures cover them all (and devices and accepted the urgent one).
	Messages int `json:"messages"`
	// FirstSkewMs is, for each bulk message in the order they were
	// scheduled, when its first device was accepted after the instant
	// (ledger, database clock); FirstSkewMaxMs the latest of them: how long
	// the message that began last waited for the others.
	FirstSkewMs    []float64 `json:"first_skew_ms"`
	FirstSkewMaxMs float64   `json:"first_skew_max_ms"`
	// LastSkewMs is, for each bulk message, when its last device was
	// accepted after the instant; LastSkewMaxMs the latest of them.
	LastSkewMs    []float64 `json:"last_skew_ms"`
	LastSkewMaxMs float64   `json:"last_skew_max_ms"`
	// SkewMaxAllMs is the largest skew of any device of any message, the
	// urgent one's included.
	SkewMaxAllMs float64 `json:"skew_max_all_ms"`
	// PopulationMs is how long building the population through the API
	// took (Web Push subscriptions minted, devices registered, segments
	// filled): not a figure of Herald's dispatch, but what a run costs.
	PopulationMs float64 `json:"population_ms"`
	// Before is how many earlier rounds of the bulk messages were sent,
	// settled and cleaned up before the measured ones (--before).
	Before int `json:"before"`
	// StatusReads is how many times the measured messages' status was read
	// through the API (GET /v1/messages/{id}, each every status_every_ms
	// from its POST until it settled).
	StatusReads   int64   `json:"status_reads"`
	StatusEveryMs float64 `json:"status_every_ms"`
	// PostgresShare is PostgreSQL's CPU over the measured messages' whole
	// life, per device sent to, by part. Null when the database is not a
	// process of this host.
	PostgresShare *postgresShare `json:"postgres_cpu_us_per_device"`
	// Receipts is what the devices fakepush played sent back, with
	// --receipts; null without.
	Receipts *Receipts `json:"receipts"`
	// Preferences is what the users' preferences withheld, with
	// --preferences; null without.
	Preferences *Withheld `json:"preferences"`
	// Now is a message sent now, from each earlier round (--before): how
	// long after its request started the answer came (answered_ms) and its
	// first push reached fakepush (first_push_ms).
	Now struct {
		AnsweredMs  []float64 `json:"answered_ms"`
		FirstPushMs []float64 `json:"first_push_ms"`
	} `json:"now"`
}

// postgresShare is the CPU of every process of the PostgreSQL cluster
// (backends, autovacuum, checkpointer, WAL writer, ...) from the messages'
// POST until they settled and the cleanup they left was done, in µs per
// device sent to, by part. The parts add up to the total, to the
// rounding.
type postgresShare struct {
	// Schedule is the POSTs: the audiences expanded, ledger rows and chunk
	// jobs written.
	Schedule float64 `json:"schedule"`
	// Wait is from the POSTs' answers to the instant: the ledger's
	// statistics brought up to date (an ANALYZE, as autovacuum would after
	// that many new rows), and the queues' polling.
	Wait float64 `json:"wait"`
	// Fanout is from the instant until every message settled: the chunks'
	// reads, the ledger's results, the jobs completed and the messages
	// settled.
	Fanout float64 `json:"fanout"`
	// StatusReads is the status reads' own backends over the whole life
	// (they read from the POSTs until settled), told apart from the rest
	// (which excludes them) by their connections' application_name.
	StatusReads float64 `json:"status_reads"`
	// Cleanup is the vacuum and analyze of the tables the messages wrote
	// and a checkpoint, done once they settled (what autovacuum and the
	// checkpointer do later otherwise).
	Cleanup float64 `json:"cleanup"`
	// Total is the whole life, from the POSTs to the cleanup's end.
	Total float64 `json:"total"`
}

type summary struct {
	P50 float64 `json:"p50"`
	P95 float64 `json:"p95"`
	P99 float64 `json:"p99"`
	Max float64 `json:"max"`
}

type pair struct {
	P50 float64 `json:"p50"`
	Max float64 `json:"max"`
}

func summarize(sorted []float64) summary {
	if len(sorted) == 0 {
		return summary{}
	}
	q := func(p float64) float64 { return round1(sorted[int(math.Ceil(p*float64(len(sorted))))-1]) }
	return summary{P50: q(0.5), P95: q(0.95), P99: q(0.99), Max: round1(sorted[len(sorted)-1])}
}

func pairOf(v []float64) pair {
	if len(v) == 0 {
		return pair{}
	}
	s := slices.Clone(v)
	slices.Sort(s)
	return pair{P50: round1(s[(len(s)-1)/2]), Max: round1(s[len(s)-1])}
}

func ms(d time.Duration) float64 { return round1(float64(d.Microseconds()) / 1000) }

func round1(f float64) float64 { return math.Round(f*10) / 10 }

// eachReceipt reads fakepush's list of the pushes it took for messageID
// (GET /_receipts) and gives them to fn one at a time, as they are
// decoded: ten million of them held whole are gigabytes.
func (b *Benchmark) eachReceipt(ctx context.Context, messageID string, fn func(*fake.Receipt)) error {
	path := "/_receipts?message_id=" + url.QueryEscape(messageID)
	resp, err := b.fakeGet(ctx, path)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	dec := json.NewDecoder(resp.Body)
	if _, err := dec.Token(); err != nil {
		return fmt.Errorf("fakepush %s: %w", path, err)
	}
	for dec.More() {
		var r fake.Receipt
		if err := dec.Decode(&r); err != nil {
			return fmt.Errorf("fakepush %s: %w", path, err)
		}
		fn(&r)
	}
	if _, err := dec.Token(); err != nil {
		return fmt.Errorf("fakepush %s: %w", path, err)
	}
	return nil
}

// ledgerView fills in what the ledger says of the run: the skews, the
// fan-out's span and the chunks' breakdown. It returns how many pushes
// were accepted, the sends the CPU is divided among.
func (b *Benchmark) ledgerView(ctx context.Context, pool db.DBTX, s scheduled, res *Result) (int, error) {
	q := db.On(pool)
	var skews []float64
	var first, last time.Time
	var pickup, firstAccept, lastAccept, write []float64
	for _, n := range s.bulkNs {
		sk, err := q.AcceptedSkews(ctx, n)
		if err != nil {
			return 0, err
		}
		skews = append(skews, sk...)
		span, err := q.SkewSpan(ctx, n)
		if err != nil {
			return 0, err
		}
		res.FirstSkewMs, res.LastSkewMs = append(res.FirstSkewMs, round1(span.FirstMs)), append(res.LastSkewMs, round1(span.LastMs))
		acc, err := q.AcceptanceSpan(ctx, n)
		if err != nil {
			return 0, err
		}
		if first.IsZero() || acc.First.Before(first) {
			first = acc.First
		}
		if acc.Last.After(last) {
			last = acc.Last
		}
		chunks, err := q.ChunkTimings(ctx, n)
		if err != nil {
			return 0, err
		}
		for _, c := range chunks {
			pickup, firstAccept = append(pickup, c.PickupMs), append(firstAccept, c.FirstAcceptMs)
			lastAccept, write = append(lastAccept, c.LastAcceptMs), append(write, c.WriteMs)
		}
	}
	slices.Sort(skews)
	res.Accepted = len(skews)
	res.SkewMs = summarize(skews)
	res.FirstSkewMaxMs, res.LastSkewMaxMs = slices.Max(res.FirstSkewMs), slices.Max(res.LastSkewMs)
	res.FanoutMs = ms(last.Sub(first))
	res.Breakdown.PickupMs, res.Breakdown.FirstAcceptMs = pairOf(pickup), pairOf(firstAccept)
	res.Breakdown.LastAcceptMs, res.Breakdown.LedgerWriteMs = pairOf(lastAccept), pairOf(write)

	urgentSkews, err := q.AcceptedSkews(ctx, s.urgentN)
	if err != nil {
		return 0, err
	}
	if len(urgentSkews) == 1 {
		res.UrgentSkewMs = round1(urgentSkews[0])
	}
	res.SkewMaxAllMs = max(res.SkewMs.Max, res.UrgentSkewMs)
	urgentChunks, err := q.ChunkTimings(ctx, s.urgentN)
	if err != nil {
		return 0, err
	}
	if len(urgentChunks) == 1 {
		res.UrgentPickupMs = round1(urgentChunks[0].PickupMs)
	}
	return res.Accepted + len(urgentSkews), nil
}

// fakepushView fills in what fakepush says of the run: when each push
// arrived, by the same host's clock, and how many arrived twice.
func (b *Benchmark) fakepushView(ctx context.Context, s scheduled, res *Result) error {
	var rskews []float64
	for _, id := range s.bulkIDs {
		err := b.eachReceipt(ctx, id, func(r *fake.Receipt) {
			skew := float64(r.ReceivedAt.Sub(s.dispatchAt).Microseconds()) / 1000
			rskews = append(rskews, skew)
			if first, ok := res.FirstPushMs[r.Channel]; !ok || skew < first {
				if res.FirstPushMs == nil {
					res.FirstPushMs = map[string]float64{}
				}
				res.FirstPushMs[r.Channel] = round1(skew)
			}
		})
		if err != nil {
			return err
		}
	}
	slices.Sort(rskews)
	res.ReceiptSkewMs = summarize(rskews)
	var stats fake.Stats
	if err := b.getFake(ctx, "/_stats", &stats); err != nil {
		return err
	}
	res.Duplicates = stats.APNs.Duplicates + stats.FCM.Duplicates + stats.WebPush.Duplicates
	var urgent []time.Time
	if err := b.eachReceipt(ctx, s.urgentID, func(r *fake.Receipt) { urgent = append(urgent, r.ReceivedAt) }); err != nil {
		return err
	}
	if len(urgent) == 1 {
		res.UrgentReceiptMs = round1(float64(urgent[0].Sub(s.dispatchAt).Microseconds()) / 1000)
	}
	return nil
}

// Retained is the database's size (pg_database_size) before the POSTs, once
// the measured messages had settled and been vacuumed, and after their
// retention (jobs.Retainer, as if it had passed), a VACUUM of the message
// tables and the retention's next run, which rebuilds the ledger's primary
// key if they left it mostly empty (KeyFreedMB, what that gave back); and
// how long it all took.
type Retained struct {
	BeforeMB   float64 `json:"before_mb"`
	SettledMB  float64 `json:"settled_mb"`
	AfterMB    float64 `json:"after_mb"`
	KeyFreedMB float64 `json:"key_freed_mb"`
	Messages   int64   `json:"messages"`
	Rows       int64   `json:"rows"`
	Ms         float64 `json:"ms"`
}
