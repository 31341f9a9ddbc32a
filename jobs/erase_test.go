package jobs

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"
	"github.com/stretchr/testify/require"

	"github.com/heraldpush/herald/db"
	"github.com/heraldpush/herald/jobs/push"
)

// hookedSender runs before as a Send begins, then answers it as inner does.
type hookedSender struct {
	before func()
	inner  *recordingSender
}

func (s *hookedSender) Send(ctx context.Context, m *push.Message, targets []push.Target, results []push.Result, allow func() bool, answered func(int)) {
	if s.before != nil {
		s.before()
		s.before = nil
	}
	s.inner.Send(ctx, m, targets, results, allow, answered)
}

// TestFanOutDeviceErasedMidSend is the bound docs/api.md states for an
// erasure racing a chunk: the attempt that read the device as pending
// before the erasure committed still sends to it (once), but its answer is
// not recorded over the cancellation, the counters stay true, and no later
// attempt sends to it again.
func TestFanOutDeviceErasedMidSend(t *testing.T) {
	t.Parallel()
	b := setupFanOut(t)
	ctx := context.Background()
	c := b.dueNow(b.devices("fcm-1", "fcm-2"))
	erased := c.device(t, "fcm-1")
	fcm := &recordingSender{script: map[string][]push.Result{"fcm-2": {failing(push.ReasonRateLimited)}}}
	sender := &hookedSender{inner: fcm, before: func() {
		require.NoError(t, db.InTx(ctx, b.db.Pool, func(tx pgx.Tx) error {
			if err := db.EraseDevices(ctx, tx, []int64{erased}); err != nil {
				return err
			}
			_, err := db.On(tx).DeleteDevice(ctx, erased)
			return err
		}))
	}}
	w := b.worker(map[string]Sender{ChannelFCM: sender}, FanOutConfig{})

	// Worked directly, not through rivertest, whose transaction holds the
	// job's row while it runs: the erasure rewrites that row's args, and
	// would wait for the test's own transaction.
	err := w.Work(ctx, &river.Job[FanOutArgs]{JobRow: c.job, Args: c.args})
	var snooze *rivertype.JobSnoozeError
	require.ErrorAs(t, err, &snooze, "fcm-2 waits for another attempt")
	require.Equal(t, []string{"fcm-1", "fcm-2"}, fcm.sends(), "the running attempt had read fcm-1 as pending")
	b.requireStatus(c, "fcm-1", "cancelled", push.ReasonDeviceDeleted)
	b.settled(c.msg.ID)

	require.NoError(t, w.Work(ctx, &river.Job[FanOutArgs]{JobRow: c.job, Args: c.args}))
	require.Equal(t, []string{"fcm-2"}, fcm.sends(), "no later attempt sends to the erased device")
	m := b.settled(c.msg.ID)
	require.Equal(t, StateDispatched, m.State)
	require.EqualValues(t, 1, m.AcceptedCount)
	require.EqualValues(t, 1, m.CancelledCount)
}
