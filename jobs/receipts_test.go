package jobs

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/riverqueue/river"
	"github.com/stretchr/testify/require"

	"github.com/heraldpush/herald/jobs/push"
	"github.com/heraldpush/herald/jobs/receipt"
)

// targetSender accepts every push and keeps the targets it was given.
type targetSender struct {
	mu      sync.Mutex
	targets []push.Target
}

func (s *targetSender) Send(_ context.Context, _ *push.Message, targets []push.Target, results []push.Result, allow func() bool, answered func(i int)) {
	for i, t := range targets {
		if !allow() {
			return
		}
		s.mu.Lock()
		s.targets = append(s.targets, t)
		s.mu.Unlock()
		results[i] = push.Result{Accepted: true, At: time.Now()}
		answered(i)
	}
}

// TestFanOutSignsReceipts works a chunk with a signer and without one: with
// it every push carries the token of its own delivery, good until the
// receipt window after the chunk's expiry and not a second longer; without
// it (HERALD_RECEIPTS=off) none carries one.
func TestFanOutSignsReceipts(t *testing.T) {
	t.Parallel()
	signer, err := receipt.NewSigner([]byte(strings.Repeat("r", receipt.KeySize)))
	require.NoError(t, err)
	for _, on := range []bool{true, false} {
		b := setupFanOut(t)
		c := b.dueNow(b.devices("apns-1", "fcm-1", "https://push.example/w/1"))
		sender := &targetSender{}
		cfg := FanOutConfig{ReceiptWindow: 2 * time.Hour}
		if on {
			cfg.Receipts = signer
		}
		w := b.worker(map[string]Sender{ChannelAPNs: sender, ChannelFCM: sender, ChannelWebPush: sender}, cfg)
		require.Equal(t, river.EventKindJobCompleted, b.work(w, c).EventKind)

		require.Len(t, sender.targets, 3)
		expires := c.args.ExpiresAt.Add(2 * time.Hour)
		for _, tg := range sender.targets {
			if !on {
				require.Empty(t, tg.Receipt, "receipts off: no token")
				continue
			}
			require.LessOrEqual(t, len(tg.Receipt), receipt.MaxLen)
			d, err := signer.Verify(tg.Receipt, expires.Add(-time.Second))
			require.NoError(t, err)
			require.Equal(t, receipt.Delivery{MessageID: c.msg.ID, DeviceID: tg.DeviceID}, d)
			_, err = signer.Verify(tg.Receipt, expires.Add(time.Second))
			require.ErrorIs(t, err, receipt.ErrExpired)
		}
	}
}

// TestSignReceiptsDefaultWindow checks the worker's default window: a
// token made with no window configured is good for a week after the
// chunk's expiry.
func TestSignReceiptsDefaultWindow(t *testing.T) {
	t.Parallel()
	signer, err := receipt.NewSigner([]byte(strings.Repeat("r", receipt.KeySize)))
	require.NoError(t, err)
	w := NewFanOutWorker(FanOutConfig{Receipts: signer})
	require.Equal(t, DefaultReceiptWindow, w.cfg.ReceiptWindow)
	require.Equal(t, 7*24*time.Hour, DefaultReceiptWindow)

	expiresAt := time.Now().Add(time.Hour)
	ts := []push.Target{{DeviceID: 1}, {DeviceID: 1 << 40}, {DeviceID: 3}}
	push.SignReceipts(signer, 9, expiresAt.Add(w.cfg.ReceiptWindow), ts)
	for _, tg := range ts {
		d, err := signer.Verify(tg.Receipt, expiresAt.Add(DefaultReceiptWindow-time.Second))
		require.NoError(t, err)
		require.Equal(t, receipt.Delivery{MessageID: 9, DeviceID: tg.DeviceID}, d)
	}
}
