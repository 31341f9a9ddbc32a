package fake

import (
	"bytes"
	"container/heap"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// receiptKey is the key under which Herald's pushes carry their receipt
// token: a top-level key of the APNs payload and of the Web Push plaintext,
// a data key of the FCM message.
const receiptKey = "herald_receipt"

// Devices is how fakepush plays the devices its pushes reach, set at start
// (Config.Devices) and at run time (POST /_devices): a share of the
// accepted pushes that carry a receipt token confirm their delivery to
// Herald after a device's delay, and a smaller share are opened later, as
// an app sends its receipts back (POST /v1/receipts).
type Devices struct {
	// ReceiptsURL is the base URL of the Herald the devices answer
	// (receipts go to ReceiptsURL + "/v1/receipts"); empty plays no device.
	ReceiptsURL string `json:"receipts_url"`
	// Delivered is the share (0 to 1) of pushes with a token whose device
	// sends a delivered receipt; Opened the share (at most Delivered)
	// whose device then sends an opened one too.
	Delivered float64 `json:"delivered"`
	Opened    float64 `json:"opened"`
	// DelayMS is the range, in milliseconds, of a delivered receipt's
	// delay after the push was accepted: the push's way to the device and
	// the app's request back, drawn uniformly. Zero takes 50 to 2,000.
	DelayMS [2]int `json:"delay_ms"`
	// OpenAfterMS is the range of an opened receipt's delay after the
	// delivered one: the user's while. Zero takes 1,000 to 5,000.
	OpenAfterMS [2]int `json:"open_after_ms"`
}

// The delays a Devices takes when its ranges are zero.
var (
	defaultReceiptDelay = [2]int{50, 2000}
	defaultOpenAfter    = [2]int{1000, 5000}
)

// withDefaults fills the ranges left zero.
func (d Devices) withDefaults() Devices {
	if d.DelayMS == [2]int{} {
		d.DelayMS = defaultReceiptDelay
	}
	if d.OpenAfterMS == [2]int{} {
		d.OpenAfterMS = defaultOpenAfter
	}
	return d
}

// validate names the first setting that means nothing.
func (d Devices) validate() error {
	switch {
	case d.ReceiptsURL != "" && !strings.HasPrefix(d.ReceiptsURL, "http://") && !strings.HasPrefix(d.ReceiptsURL, "https://"):
		return fmt.Errorf("receipts_url must be an http or https URL, got %q", d.ReceiptsURL)
	case d.Delivered < 0 || d.Delivered > 1:
		return fmt.Errorf("delivered must be a share from 0 to 1, got %v", d.Delivered)
	case d.Opened < 0 || d.Opened > d.Delivered:
		return fmt.Errorf("opened must be a share from 0 to delivered (%v), got %v", d.Delivered, d.Opened)
	case d.DelayMS[0] < 0 || d.DelayMS[1] < d.DelayMS[0]:
		return fmt.Errorf("delay_ms must be [min, max] with 0 <= min <= max, got %v", d.DelayMS)
	case d.OpenAfterMS[0] < 0 || d.OpenAfterMS[1] < d.OpenAfterMS[0]:
		return fmt.Errorf("open_after_ms must be [min, max] with 0 <= min <= max, got %v", d.OpenAfterMS)
	}
	return nil
}

// DeviceStats counts the receipts fakepush's devices sent, as GET /_stats
// reports them. Scheduled counts the receipts drawn (delivered and opened);
// each then ends Posted (Herald answered 2xx), Refused (any other answer),
// Failed (no answer) or Dropped (the queue was full), or is still Waiting
// for its time.
type DeviceStats struct {
	Scheduled int64 `json:"scheduled"`
	Posted    int64 `json:"posted"`
	Refused   int64 `json:"refused"`
	Failed    int64 `json:"failed"`
	Dropped   int64 `json:"dropped"`
	Waiting   int64 `json:"waiting"`
}

// Bounds of the devices' machinery, so that fakepush never becomes a
// benchmark's bottleneck nor grows without bound: receipts waiting for
// their time (past it they are dropped and counted), receipts a request
// carries, and requests in flight to Herald.
const (
	maxWaitingReceipts = 200_000
	receiptBatch       = 100
	receiptPosters     = 8
)

// deviceReceipt is one receipt a device will send.
type deviceReceipt struct {
	due   time.Time
	token string
	event string
}

// receiptQueue is a min-heap of receipts by their time.
type receiptQueue []deviceReceipt

func (q receiptQueue) Len() int           { return len(q) }
func (q receiptQueue) Less(i, j int) bool { return q[i].due.Before(q[j].due) }
func (q receiptQueue) Swap(i, j int)      { q[i], q[j] = q[j], q[i] }
func (q *receiptQueue) Push(x any)        { *q = append(*q, x.(deviceReceipt)) }
func (q *receiptQueue) Pop() any {
	old := *q
	r := old[len(old)-1]
	*q = old[:len(old)-1]
	return r
}

// devices plays the devices: it draws which pushes are confirmed, keeps
// their receipts until their time, and posts them in batches from a few
// goroutines.
type devices struct {
	settings atomic.Pointer[Devices]
	now      func() time.Time
	client   *http.Client

	mu      sync.Mutex
	waiting receiptQueue
	// limit bounds waiting (maxWaitingReceipts).
	limit int
	// wake is signalled when a receipt may be due sooner than the
	// scheduler's timer says.
	wake    chan struct{}
	batches chan []deviceReceipt

	scheduled, posted, refused, failed, dropped atomic.Int64
	// sending counts the receipts taken from waiting and not yet posted.
	sending atomic.Int64

	stop context.CancelFunc
	done sync.WaitGroup
}

func newDevices(d Devices, now func() time.Time) *devices {
	ds := &devices{
		now:     now,
		limit:   maxWaitingReceipts,
		wake:    make(chan struct{}, 1),
		batches: make(chan []deviceReceipt, receiptPosters),
		client: &http.Client{
			Timeout:   10 * time.Second,
			Transport: &http.Transport{MaxIdleConnsPerHost: receiptPosters, IdleConnTimeout: 30 * time.Second},
		},
	}
	d = d.withDefaults()
	ds.settings.Store(&d)
	return ds
}

// set replaces the devices' settings; receipts already drawn are sent
// under the settings they were drawn with.
func (ds *devices) set(d Devices) error {
	d = d.withDefaults()
	if err := d.validate(); err != nil {
		return err
	}
	ds.settings.Store(&d)
	return nil
}

// start runs the scheduler and the posters until close.
func (ds *devices) start() {
	ctx, cancel := context.WithCancel(context.Background())
	ds.stop = cancel
	ds.done.Go(func() { ds.schedule(ctx) })
	for range receiptPosters {
		ds.done.Go(func() { ds.post(ctx) })
	}
}

// close stops the devices; receipts not yet posted are forgotten.
func (ds *devices) close() {
	if ds.stop != nil {
		ds.stop()
		ds.done.Wait()
	}
	ds.client.CloseIdleConnections()
}

// outcome is what a device makes of one push.
type outcome struct {
	delivered, opened bool
	settings          *Devices
}

// draw decides what the device of a push accepted now will send back.
func (ds *devices) draw() outcome {
	d := ds.settings.Load()
	if d.ReceiptsURL == "" || d.Delivered <= 0 {
		return outcome{}
	}
	x := rand.Float64()
	return outcome{delivered: x < d.Delivered, opened: x < d.Opened, settings: d}
}

// play schedules the receipts of o for the push with token accepted at at
// (Unix nanoseconds).
func (ds *devices) play(o outcome, token string, at int64) {
	if !o.delivered || token == "" {
		return
	}
	token = strings.Clone(token) // it may point into a request's buffer
	d := o.settings
	due := time.Unix(0, at).Add(between(d.DelayMS))
	ds.add(deviceReceipt{due: due, token: token, event: "delivered"})
	if o.opened {
		ds.add(deviceReceipt{due: due.Add(between(d.OpenAfterMS)), token: token, event: "opened"})
	}
}

// between is a duration drawn uniformly from the range r, in milliseconds.
func between(r [2]int) time.Duration {
	ms := r[0]
	if r[1] > r[0] {
		ms += rand.IntN(r[1] - r[0] + 1)
	}
	return time.Duration(ms) * time.Millisecond
}

// add queues r, or drops it when too many wait already.
func (ds *devices) add(r deviceReceipt) {
	ds.scheduled.Add(1)
	ds.mu.Lock()
	if len(ds.waiting) >= ds.limit {
		ds.mu.Unlock()
		ds.dropped.Add(1)
		return
	}
	first := len(ds.waiting) == 0 || r.due.Before(ds.waiting[0].due)
	heap.Push(&ds.waiting, r)
	ds.mu.Unlock()
	if first {
		select {
		case ds.wake <- struct{}{}:
		default:
		}
	}
}

// schedule hands the receipts that are due to the posters, in batches, and
// sleeps until the next is.
func (ds *devices) schedule(ctx context.Context) {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		batch, next := ds.due()
		if len(batch) > 0 {
			select {
			case ds.batches <- batch:
			case <-ctx.Done():
				return
			}
			continue
		}
		timer.Reset(next)
		select {
		case <-ctx.Done():
			return
		case <-ds.wake:
		case <-timer.C:
		}
	}
}

// due takes up to a batch of the receipts whose time has come; when none
// has, next is how long until the first will.
func (ds *devices) due() (batch []deviceReceipt, next time.Duration) {
	now := ds.now()
	ds.mu.Lock()
	defer ds.mu.Unlock()
	for len(ds.waiting) > 0 && len(batch) < receiptBatch && !ds.waiting[0].due.After(now) {
		batch = append(batch, heap.Pop(&ds.waiting).(deviceReceipt))
	}
	ds.sending.Add(int64(len(batch)))
	if len(ds.waiting) == 0 {
		return batch, time.Hour
	}
	return batch, ds.waiting[0].due.Sub(now)
}

// receiptsBody is the body of POST /v1/receipts.
type receiptsBody struct {
	Receipts []receiptItem `json:"receipts"`
}

type receiptItem struct {
	Token      string `json:"token"`
	Event      string `json:"event"`
	DeviceTime string `json:"device_time"`
}

// post sends the batches the scheduler hands over.
func (ds *devices) post(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case batch := <-ds.batches:
			ds.send(ctx, batch)
		}
	}
}

// send posts one batch and counts how it went.
func (ds *devices) send(ctx context.Context, batch []deviceReceipt) {
	body := receiptsBody{Receipts: make([]receiptItem, len(batch))}
	for i, r := range batch {
		body.Receipts[i] = receiptItem{Token: r.token, Event: r.event, DeviceTime: r.due.UTC().Format(time.RFC3339Nano)}
	}
	data, _ := json.Marshal(body)
	n := int64(len(batch))
	defer ds.sending.Add(-n)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimSuffix(ds.settings.Load().ReceiptsURL, "/")+"/v1/receipts", bytes.NewReader(data))
	if err != nil {
		ds.failed.Add(n)
		return
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := ds.client.Do(req)
	if err != nil {
		ds.failed.Add(n)
		return
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		ds.posted.Add(n)
		return
	}
	ds.refused.Add(n)
}

// stats reads the counters.
func (ds *devices) stats() DeviceStats {
	ds.mu.Lock()
	waiting := int64(len(ds.waiting)) + ds.sending.Load()
	ds.mu.Unlock()
	return DeviceStats{
		Scheduled: ds.scheduled.Load(), Posted: ds.posted.Load(), Refused: ds.refused.Load(),
		Failed: ds.failed.Load(), Dropped: ds.dropped.Load(), Waiting: waiting,
	}
}

// reset forgets the receipts waiting and zeroes the counters.
func (ds *devices) reset() {
	ds.mu.Lock()
	ds.waiting = ds.waiting[:0]
	ds.mu.Unlock()
	for _, c := range []*atomic.Int64{&ds.scheduled, &ds.posted, &ds.refused, &ds.failed, &ds.dropped} {
		c.Store(0)
	}
}
