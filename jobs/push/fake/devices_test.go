package fake

import (
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestDevicesControl sets how fakepush plays the devices at run time: a
// setting that means nothing is refused naming it, a good one is read back
// with its defaults, and a reset goes back to the configured one.
func TestDevicesControl(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *Config) { c.Devices = Devices{ReceiptsURL: "http://127.0.0.1:1", Delivered: 0.9, Opened: 0.1} })
	var d Devices
	b.getJSON(t, "/_devices", &d)
	require.Equal(t, Devices{ReceiptsURL: "http://127.0.0.1:1", Delivered: 0.9, Opened: 0.1, DelayMS: defaultReceiptDelay, OpenAfterMS: defaultOpenAfter}, d)

	for body, want := range map[string]string{
		`{"delivered":1.5}`:                        "delivered",
		`{"delivered":0.5,"opened":0.6}`:           "opened",
		`{"receipts_url":"ftp://x"}`:               "receipts_url",
		`{"delivered":0.5,"delay_ms":[100,10]}`:    "delay_ms",
		`{"delivered":0.5,"open_after_ms":[-1,0]}`: "open_after_ms",
		`{"shares":1}`:                             "unknown field",
	} {
		status, msg := b.postJSON(t, "/_devices", body)
		require.Equal(t, http.StatusBadRequest, status, body)
		require.Contains(t, msg, want, body)
	}
	status, _ := b.postJSON(t, "/_devices", `{"receipts_url":"http://127.0.0.1:2","delivered":0.5,"delay_ms":[5,10]}`)
	require.Equal(t, http.StatusOK, status)
	b.getJSON(t, "/_devices", &d)
	require.Equal(t, Devices{ReceiptsURL: "http://127.0.0.1:2", Delivered: 0.5, DelayMS: [2]int{5, 10}, OpenAfterMS: defaultOpenAfter}, d)

	b.srv.Reset()
	require.Equal(t, 0.9, b.srv.Devices().Delivered)
}

// TestDevicesDropWhenFull keeps the receipts waiting bounded: past the
// limit a receipt is dropped and counted, never queued; those kept are
// posted in batches once due.
func TestDevicesDropWhenFull(t *testing.T) {
	t.Parallel()
	var posts, got atomic.Int64
	herald := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body receiptsBody
		require.NoError(t, jsonDecode(r.Body, &body))
		posts.Add(1)
		got.Add(int64(len(body.Receipts)))
		w.WriteHeader(http.StatusAccepted)
	}))
	t.Cleanup(herald.Close)
	ds := newDevices(Devices{ReceiptsURL: herald.URL, Delivered: 1, DelayMS: [2]int{1, 1}}, time.Now)
	ds.limit = 250
	ds.start()
	t.Cleanup(ds.close)
	// All at once, due a while after: the first 250 wait, the rest are
	// dropped.
	at := time.Now().Add(200 * time.Millisecond).UnixNano()
	for range 300 {
		ds.play(ds.draw(), "token", at)
	}
	st := ds.stats()
	require.Equal(t, int64(300), st.Scheduled)
	require.Equal(t, int64(50), st.Dropped)
	require.Eventually(t, func() bool { return ds.stats().Posted == 250 }, 10*time.Second, 10*time.Millisecond)
	require.Equal(t, int64(250), got.Load())
	require.LessOrEqual(t, posts.Load(), int64(250/receiptBatch+receiptPosters), "posted in batches, not one by one")
	require.Zero(t, ds.stats().Waiting)
}
