package pushtest

import (
	"strings"
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
