package fake

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestRecorderDuplicates(t *testing.T) {
	t.Parallel()
	r := newRecorder("https://fake/webpush/", 0)
	tests := []struct {
		ch          Channel
		token, msg  string
		wantDup     bool
		description string
	}{
		{APNs, "t1", "m1", false, "first push"},
		{APNs, "t1", "m1", true, "same channel, token and message"},
		{FCM, "t1", "m1", false, "same token string on another channel"},
		{APNs, "t1", "m2", false, "another message"},
		{APNs, "t2", "m1", false, "another token"},
		{APNs, "t3", "", false, "no message id"},
		{APNs, "t3", "", false, "no message id, again: nothing to be a duplicate of"},
		{WebPush, "id1", "m1", false, "web push"},
		{WebPush, "id1", "m1", true, "web push again"},
	}
	for i, tt := range tests {
		require.Equal(t, tt.wantDup, r.add(tt.ch, tt.token, tt.msg, "c-"+tt.msg, int64(i), nil), tt.description)
	}
	got := r.receipts("m1", false)
	require.Len(t, got, 6)
	require.Equal(t, Receipt{Channel: "apns", Environment: "production", Token: "t1", CollapseKey: "c-m1", ReceivedAt: time.Unix(0, 0).UTC()}, got[0])
	require.Equal(t, "https://fake/webpush/id1", got[4].Token)
	require.Len(t, r.receipts("", false), 2)
	require.Empty(t, r.receipts("never", false))

	r.reset()
	require.Empty(t, r.receipts("m1", false))
	require.False(t, r.add(APNs, "t1", "m1", "", 0, nil))
}

// TestRecorderMemoryIsBounded records a million pushes, a bench-sized run many
// times over, and checks they fit in a few tens of bytes each.
func TestRecorderMemoryIsBounded(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("records a million pushes")
	}
	const pushes, devices, messages = 1_000_000, 50_000, 20
	tokens := make([]string, devices)
	for i := range tokens {
		tokens[i] = fmt.Sprintf("%064x", i)
	}
	ids := make([]string, messages)
	for i := range ids {
		ids[i] = fmt.Sprintf("msg_%026d", i)
	}

	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	r := newRecorder("", 0)
	dups := 0
	for i := range pushes {
		// Every device gets every message once, then the pattern repeats.
		if r.add(Channel(i%3), tokens[i%devices], ids[(i/devices)%messages], ids[(i/devices)%messages], int64(i), nil) {
			dups++
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	runtime.KeepAlive(r)

	require.Zero(t, dups, "each (token, message) pair occurs once")
	require.Len(t, r.receipts(ids[3], false), devices)
	grown := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	t.Logf("heap grew by %.1f MB for %d pushes (%.0f bytes per push)", float64(grown)/1e6, pushes, float64(grown)/pushes)
	require.Less(t, grown, int64(64<<20))
}

func BenchmarkRecorderAdd(b *testing.B) {
	r := newRecorder("", 0)
	tokens := make([]string, 10_000)
	for i := range tokens {
		tokens[i] = fmt.Sprintf("%064x", i)
	}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		r.add(APNs, tokens[i%len(tokens)], "msg_1", "msg_1", int64(i), nil)
	}
}

// TestRecorderDetailsBounded: only the most recent pushes keep their
// details, however many are recorded, and a reset forgets them.
func TestRecorderDetailsBounded(t *testing.T) {
	t.Parallel()
	r := newRecorder("", 3)
	for i := range 5 {
		h := http.Header{"Apns-Priority": {"10"}, "Authorization": {"bearer secret"}}
		r.add(APNs, fmt.Sprintf("t%d", i), "m1", "m1", int64(i), newDetail(h, []byte(`{"aps":{}}`)))
	}
	got := r.receipts("m1", true)
	require.Len(t, got, 5)
	for i, rc := range got {
		if i < 2 {
			require.Nil(t, rc.Headers, "push %d is older than the last 3", i)
			require.Nil(t, rc.Body)
			continue
		}
		require.Equal(t, map[string]string{"apns-priority": "10", "authorization": "bearer (redacted)"}, rc.Headers)
		require.JSONEq(t, `{"aps":{}}`, string(rc.Body))
	}
	require.Nil(t, r.receipts("m1", false)[4].Headers, "details only when asked for")
	r.reset()
	r.add(APNs, "t9", "m1", "m1", 9, nil)
	require.Nil(t, r.receipts("m1", true)[0].Headers)
}

// largestWrite is an io.Writer that keeps what it is given and the size of
// its largest write.
type largestWrite struct {
	bytes.Buffer
	largest int
}

func (w *largestWrite) Write(p []byte) (int, error) {
	w.largest = max(w.largest, len(p))
	return w.Buffer.Write(p)
}

// TestReceiptListingIsWrittenAsItIsMade lists 100,000 pushes of a message
// as GET /_receipts does: the JSON, some 13 MB, comes out in writes of a
// buffer's size, not held whole (a ten-million-device run's listing made
// fakepush hold 20 GB and the kernel killed it), and decodes to the
// receipts themselves. It does not run in parallel: its garbage would count
// in TestRecorderMemoryIsBounded's heap.
func TestReceiptListingIsWrittenAsItIsMade(t *testing.T) {
	const pushes = 100_000
	r := newRecorder("https://fake/webpush/", 0)
	for i := range pushes {
		r.add(Channel(i%3), fmt.Sprintf("token-%07d", i), "m1", "m1", int64(i), nil)
	}
	r.add(APNs, "other", "m2", "m2", 0, nil)
	var w largestWrite
	require.NoError(t, r.listing("m1", false).writeJSON(&w))
	t.Logf("%d receipts, %.1f MB of JSON, largest write %d bytes", pushes, float64(w.Len())/1e6, w.largest)
	require.LessOrEqual(t, w.largest, 64<<10)
	var got []Receipt
	require.NoError(t, json.Unmarshal(w.Bytes(), &got))
	require.Equal(t, r.receipts("m1", false), got)

	w = largestWrite{}
	require.NoError(t, r.listing("never", false).writeJSON(&w))
	require.JSONEq(t, "[]", w.String())
}
