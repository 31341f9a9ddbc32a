package pushtest

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/heraldpush/herald/jobs/push"
	"github.com/heraldpush/herald/jobs/push/fake"
	"github.com/heraldpush/herald/jobs/receipt"
)

// NewSigner is a receipt signer under a fixed key, for tests.
func NewSigner(t testing.TB) *receipt.Signer {
	t.Helper()
	s, err := receipt.NewSigner([]byte(strings.Repeat("k", receipt.KeySize)))
	require.NoError(t, err)
	return s
}

// AppKeys are the keys of a push as the app reads them, from its body as
// fakepush decoded it: the top level of the APNs payload and of the Web
// Push plaintext, the data of the FCM message.
func AppKeys(ch fake.Channel, body map[string]any) map[string]any {
	if ch == fake.FCM {
		data, _ := body["data"].(map[string]any)
		return data
	}
	return body
}

// SendReceipts checks that each push carries the receipt token of its own
// delivery, which verifies to that message and device, and that a target
// without one is sent a push without the key.
func (h *Harness[C, P]) SendReceipts(t *testing.T) {
	b := h.Setup(t)
	signer := NewSigner(t)
	const messageID = 4242
	m := NewContentMessage(t, push.FormatMessageID(messageID), push.Content{Title: "Standup", Data: map[string]string{"room": "blue"}}, time.Hour)
	ts := b.Targets(t, 3)
	expires := time.Now().Add(2 * time.Hour).Truncate(time.Second)
	for i := range ts[:2] {
		ts[i].Receipt = signer.Sign(receipt.Delivery{MessageID: messageID, DeviceID: ts[i].DeviceID}, expires)
	}
	b.SendAccepted(t, m, ts)

	byToken := map[string]push.Target{}
	for _, tg := range ts {
		byToken[tg.Token] = tg
	}
	rs := b.DetailedReceipts(t, m.ID)
	require.Len(t, rs, len(ts))
	for _, rc := range rs {
		tg := byToken[rc.Token]
		keys := AppKeys(h.Channel, JSON(t, string(rc.Body)))
		got, ok := keys[push.ReceiptKey].(string)
		if tg.Receipt == "" {
			require.False(t, ok, "a target without a token is sent none: %s", rc.Body)
			continue
		}
		require.Equal(t, tg.Receipt, got, "body %s", rc.Body)
		d, err := signer.Verify(got, time.Now())
		require.NoError(t, err)
		require.Equal(t, receipt.Delivery{MessageID: messageID, DeviceID: tg.DeviceID}, d)
		require.Equal(t, m.ID, keys[push.MessageIDKey], "the token sits beside the message id, which stays: %s", rc.Body)
	}
}

// LimitContent is a payload at the size limit, as the API would still
// accept it (push.CheckSize): its data's one value grown until a byte more
// is refused. For APNs the fields only APNs carries make its encoding the
// one at the limit; otherwise the Web Push plaintext is (FCM's encoding is
// the smallest of the three, so it is never the one at the limit).
func LimitContent(t testing.TB, ch fake.Channel) push.Content {
	t.Helper()
	c := push.Content{Title: "Standup", Body: "In five minutes", Data: map[string]string{}}
	if ch == fake.APNs {
		long := strings.Repeat("x", 256)
		c.ThreadID, c.Category, c.APNs = long, long, &push.APNsOptions{TargetContentID: long}
	}
	fits := func(n int) error {
		c.Data["pad"] = strings.Repeat("p", n)
		return push.CheckSize(c)
	}
	lo, hi := 0, push.MaxPayloadBytes
	for lo+1 < hi {
		if mid := (lo + hi) / 2; fits(mid) == nil {
			lo = mid
		} else {
			hi = mid
		}
	}
	var size *push.SizeError
	require.ErrorAs(t, fits(hi), &size)
	want := map[fake.Channel]string{fake.APNs: "apns", fake.FCM: "webpush", fake.WebPush: "webpush"}[ch]
	require.Equal(t, want, size.Channel, "the encoding at the limit")
	require.NoError(t, fits(lo))
	return c
}

// SendAtTheSizeLimit sends a payload at the size limit with the longest
// message id and receipt tokens of the longest device ids, and requires
// every push accepted: the room the size check keeps for the token is
// enough, so that no payload the API accepted is refused for its token.
func (h *Harness[C, P]) SendAtTheSizeLimit(t *testing.T) {
	b := h.Setup(t)
	signer := NewSigner(t)
	const messageID = 1<<63 - 1
	m := NewContentMessage(t, push.FormatMessageID(messageID), LimitContent(t, h.Channel), time.Hour)
	require.Len(t, m.ID, push.MaxMessageIDLen)
	ts := b.Targets(t, 2)
	for i := range ts {
		ts[i].DeviceID = 1<<63 - 1 - int64(i)
		ts[i].Receipt = signer.Sign(receipt.Delivery{MessageID: messageID, DeviceID: ts[i].DeviceID}, time.Now().Add(time.Hour))
	}
	b.SendAccepted(t, m, ts)
}

// receiptsReceiver is a stand-in for Herald's POST /v1/receipts: it
// verifies every token it is sent and counts the deliveries confirmed, by
// event.
type receiptsReceiver struct {
	signer *receipt.Signer
	mu     sync.Mutex
	events map[string]map[receipt.Delivery]int
	bad    []string
}

func (r *receiptsReceiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	var body struct {
		Receipts []struct {
			Token      string `json:"token"`
			Event      string `json:"event"`
			DeviceTime string `json:"device_time"`
		} `json:"receipts"`
	}
	if req.Method != http.MethodPost || req.URL.Path != "/v1/receipts" || json.NewDecoder(req.Body).Decode(&body) != nil {
		http.Error(w, "not a receipts request", http.StatusBadRequest)
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, rc := range body.Receipts {
		d, err := r.signer.Verify(rc.Token, time.Now())
		if _, terr := time.Parse(time.RFC3339Nano, rc.DeviceTime); err != nil || terr != nil || (rc.Event != "delivered" && rc.Event != "opened") {
			r.bad = append(r.bad, fmt.Sprintf("%+v: %v %v", rc, err, terr))
			continue
		}
		if r.events[rc.Event] == nil {
			r.events[rc.Event] = map[receipt.Delivery]int{}
		}
		r.events[rc.Event][d]++
	}
	w.WriteHeader(http.StatusAccepted)
}

// SendDevicesAnswer has fakepush play the devices, half of them sending a
// delivered receipt and a fifth an opened one too, to a receiver that
// verifies every token: about those shares of the pushes come back, each
// once, naming a delivery that was sent. Web Push bodies are decrypted for
// the devices that answer even when fakepush samples the others out.
func (h *Harness[C, P]) SendDevicesAnswer(t *testing.T) {
	signer := NewSigner(t)
	rcv := &receiptsReceiver{signer: signer, events: map[string]map[receipt.Delivery]int{}}
	herald := httptest.NewServer(rcv)
	t.Cleanup(herald.Close)
	fp := Start(t, func(c *fake.Config) {
		c.DecryptOneIn = 1000
		c.Devices = fake.Devices{ReceiptsURL: herald.URL, Delivered: 0.5, Opened: 0.2, DelayMS: [2]int{0, 50}, OpenAfterMS: [2]int{0, 50}}
	})
	_, p := h.NewProvider(t, fp, Limits{})
	b := &Bundle[C, P]{Fakepush: fp, P: p, h: h}

	const n, messageID = 200, 77
	m := NewContentMessage(t, push.FormatMessageID(messageID), push.Content{Title: "Standup"}, time.Hour)
	ts := b.Targets(t, n)
	sent := map[receipt.Delivery]bool{}
	for i := range ts {
		ts[i].DeviceID = int64(1000 + i)
		d := receipt.Delivery{MessageID: messageID, DeviceID: ts[i].DeviceID}
		ts[i].Receipt = signer.Sign(d, time.Now().Add(time.Hour))
		sent[d] = true
	}
	for _, r := range b.Send(m, ts) {
		require.True(t, r.Accepted, "%+v", r)
	}

	require.Eventually(t, func() bool {
		st := fp.Stats(t).Devices
		return st.Scheduled > 0 && st.Waiting == 0 && st.Posted+st.Dropped+st.Failed+st.Refused == st.Scheduled
	}, 15*time.Second, 20*time.Millisecond, "the devices' receipts are all posted")
	st := fp.Stats(t).Devices
	require.Equal(t, st.Scheduled, st.Posted, "every receipt posted: %+v", st)

	rcv.mu.Lock()
	defer rcv.mu.Unlock()
	require.Empty(t, rcv.bad, "every token verifies, every device time is RFC 3339")
	delivered, opened := rcv.events["delivered"], rcv.events["opened"]
	require.InDelta(t, n*0.5, len(delivered), n*0.5*0.35, "about half the devices confirm delivery")
	require.InDelta(t, n*0.2, len(opened), n*0.2*0.6, "about a fifth open the push")
	for d, k := range delivered {
		require.True(t, sent[d], "a delivery that was sent: %+v", d)
		require.Equal(t, 1, k, "each device confirms once")
	}
	for d := range opened {
		require.Contains(t, delivered, d, "an opened push was delivered first")
	}
	require.Equal(t, int64(len(delivered)+len(opened)), st.Posted)
}
