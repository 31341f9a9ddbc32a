package heraldbench

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"time"

	"github.com/heraldpush/herald/db"
	"github.com/heraldpush/herald/jobs/push"
	"github.com/heraldpush/herald/jobs/push/fake"
	"github.com/heraldpush/herald/jobs/receipt"
)

// The devices fakepush plays with --receipts: nine in ten confirm their
// push, one in ten opens it too, after fakepush's default delays (a
// delivered receipt 50 ms to 2 s after the push, an opened one 1 to 5 s
// after that).
const (
	benchDelivered = 0.9
	benchOpened    = 0.1
)

// receiptsWait bounds the wait for the devices' receipts once the messages
// have settled: the last is due some 7 s after its push.
const receiptsWait = 60 * time.Second

// Receipts is what the devices fakepush played sent back (--receipts):
// how many receipts went out and how Herald answered them, and what the
// measured messages' rows count of them. ConfirmedSkewMs is each confirmed
// delivery's skew (when Herald had its delivered receipt, after the
// instant): accepted skew, the device's drawn delay and the receipt's way.
type Receipts struct {
	// PostgresCPUPerReceipt is PostgreSQL's CPU while the run waited for
	// the receipts still to come after the messages settled, per receipt
	// posted meanwhile: what recording a receipt costs the database, with
	// nothing else running. Null when none came then or the cluster was
	// not read.
	PostgresCPUPerReceipt *float64 `json:"postgres_cpu_us_per_receipt"`

	Delivered       float64          `json:"delivered_share"`
	Opened          float64          `json:"opened_share"`
	Devices         fake.DeviceStats `json:"devices"`
	WaitMs          float64          `json:"wait_ms"`
	ConfirmedCount  int64            `json:"confirmed_count"`
	OpenedCount     int64            `json:"opened_count"`
	ConfirmedSkewMs summary          `json:"confirmed_skew_ms"`
}

// playDevices has fakepush play the devices, posting their receipts to
// the Herald under test, when the run asks for receipts.
func (b *Benchmark) playDevices(ctx context.Context) error {
	if !b.Config.Receipts {
		return nil
	}
	body, _ := json.Marshal(fake.Devices{ReceiptsURL: b.base, Delivered: benchDelivered, Opened: benchOpened}) // plain values: cannot fail
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, b.fakeURL+"/_devices", bytes.NewReader(body))
	if err != nil {
		return err
	}
	resp, err := b.fakeHTTP.Do(req)
	if err != nil {
		return fmt.Errorf("play the devices: %w", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("play the devices: fakepush answered %s", resp.Status)
	}
	b.Progress("fakepush plays the devices: %.0f%% confirm their push to Herald, %.0f%% open it", 100*benchDelivered, 100*benchOpened)
	return nil
}

// waitReceipts waits, at most receiptsWait, until every receipt the
// devices drew has been posted (or dropped), and returns fakepush's
// counts at the start and at the end, and how long it waited.
func (b *Benchmark) waitReceipts(ctx context.Context) (first, last fake.DeviceStats, waited time.Duration, err error) {
	start := time.Now()
	for i := 0; ; i++ {
		var st fake.Stats
		resp, err := b.fakeHTTP.Get(b.fakeURL + "/_stats")
		if err != nil {
			return first, last, 0, err
		}
		err = json.NewDecoder(resp.Body).Decode(&st)
		resp.Body.Close()
		if err != nil {
			return first, last, 0, err
		}
		last = st.Devices
		if i == 0 {
			first = last
		}
		if last.Waiting == 0 && last.Posted+last.Refused+last.Failed+last.Dropped == last.Scheduled {
			return first, last, time.Since(start), nil
		}
		if time.Since(start) > receiptsWait {
			b.Progress("receipts: %d still waiting after %s; reading what arrived", last.Waiting, receiptsWait)
			return first, last, time.Since(start), nil
		}
		select {
		case <-ctx.Done():
			return first, last, time.Since(start), ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// receiptsView waits for the devices' receipts and reads what the measured
// bulk messages counted of them; nil without --receipts. cluster reads
// PostgreSQL's CPU, nil when it cannot be read.
func (b *Benchmark) receiptsView(ctx context.Context, pool db.DBTX, cluster func() (time.Duration, error), s scheduled) (*Receipts, error) {
	if !b.Config.Receipts {
		return nil, nil
	}
	var cpu0 time.Duration
	if cluster != nil {
		var err error
		if cpu0, err = cluster(); err != nil {
			return nil, err
		}
	}
	first, st, waited, err := b.waitReceipts(ctx)
	if err != nil {
		return nil, err
	}
	var perReceipt *float64
	if tail := int(st.Posted - first.Posted); cluster != nil && tail > 0 {
		cpu1, err := cluster()
		if err != nil {
			return nil, err
		}
		perReceipt = new(perDevice(cpu1-cpu0, tail))
	}
	// The measured round's receipts: the counters run from fakepush's
	// start, so the earlier rounds' are taken off.
	was := b.receiptsBefore
	st.Scheduled, st.Posted, st.Refused = st.Scheduled-was.Scheduled, st.Posted-was.Posted, st.Refused-was.Refused
	st.Failed, st.Dropped = st.Failed-was.Failed, st.Dropped-was.Dropped
	r := &Receipts{Delivered: benchDelivered, Opened: benchOpened, Devices: st, WaitMs: ms(waited), PostgresCPUPerReceipt: perReceipt}
	q := db.On(pool)
	var skews []float64
	for _, id := range s.bulkIDs {
		n, _ := push.ParseMessageID(id)
		row, err := q.BenchConfirmed(ctx, n)
		if err != nil {
			return nil, fmt.Errorf("read the confirmed counts: %w", err)
		}
		r.ConfirmedCount += int64(row.ConfirmedCount)
		r.OpenedCount += int64(row.OpenedCount)
		sk, err := q.ConfirmedSkews(ctx, n)
		if err != nil {
			return nil, fmt.Errorf("read the confirmed skews: %w", err)
		}
		skews = append(skews, sk...)
	}
	slices.Sort(skews)
	r.ConfirmedSkewMs = summarize(skews)
	b.Progress("receipts: %d posted (%d refused, %d failed, %d dropped) in %.1f s after the messages settled; %d deliveries confirmed, %d opened; confirmed skew p50 %.0f ms, p99 %.0f ms",
		st.Posted, st.Refused, st.Failed, st.Dropped, waited.Seconds(), r.ConfirmedCount, r.OpenedCount, r.ConfirmedSkewMs.P50, r.ConfirmedSkewMs.P99)
	return r, nil
}

// blastSigner is the signer the blast's pushes carry their receipt tokens
// from, under a key of its own, as Herald's worker would sign them; nil
// when the run's Herald sends none (HERALD_RECEIPTS=off).
func (b *Benchmark) blastSigner() (*receipt.Signer, error) {
	if b.Getenv("HERALD_RECEIPTS") == "off" {
		return nil, nil
	}
	key := make([]byte, receipt.KeySize)
	_, _ = rand.Read(key)
	return receipt.NewSigner(key)
}
