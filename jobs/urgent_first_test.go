package jobs

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/heraldpush/herald/db"
	"github.com/heraldpush/herald/jobs/push"
)

// TestUrgentFirstHoldsBulkBack: bulk work waits while an urgent chunk holds
// the gate and goes on when it lets go; an idle gate never waits; and a
// hold that is never let go ends by itself after urgentHold, so bulk work
// is slowed, never stopped.
func TestUrgentFirstHoldsBulkBack(t *testing.T) {
	t.Parallel()
	var u urgentFirst
	ctx := context.Background()

	waited := func() <-chan struct{} {
		done := make(chan struct{})
		go func() {
			u.wait(ctx)
			close(done)
		}()
		return done
	}
	// An idle gate returns at once: it has no hold to wait out.
	start := time.Now()
	u.wait(ctx)
	require.Less(t, time.Since(start), urgentHold, "an idle gate held bulk work back")

	release := u.hold()
	second := u.hold()
	done := waited()
	select {
	case <-done:
		t.Fatal("bulk work went on while urgent chunks held the gate")
	case <-time.After(urgentHold / 5):
	}
	release()
	release() // letting go twice counts once
	select {
	case <-done:
		t.Fatal("bulk work went on while an urgent chunk still held the gate")
	case <-time.After(urgentHold / 10):
	}
	second()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("bulk work still waited once the urgent chunks let go")
	}
	require.False(t, u.held())

	// Held and never let go: the hold ends by itself.
	start = time.Now()
	_ = u.hold()
	<-waited()
	require.GreaterOrEqual(t, time.Since(start), urgentHold/2)
	require.Eventually(t, func() bool { return !u.held() }, 10*urgentHold, urgentHold/10)

	// A waiter whose context ends stops waiting.
	release = u.hold()
	defer release()
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	u.wait(cctx)
}

// TestUrgentFirstHeldFromTheInstant: the gate is held from an urgent
// instant (expect) until the urgent chunk that starts then lets go, not
// only from its start; an instant's hold stands for the earlier ones'; and
// an instant whose chunk never starts here holds bulk work back
// urgentPickup at most.
func TestUrgentFirstHeldFromTheInstant(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	u := urgentFirst{bound: time.Minute}
	u.expect()
	require.True(t, u.held(), "the gate was not held from the urgent instant")
	done := make(chan struct{})
	go func() {
		u.wait(ctx)
		close(done)
	}()
	release := u.hold() // the urgent chunk starts
	select {
	case <-done:
		t.Fatal("bulk work went on between the urgent instant and its chunk's answers")
	case <-time.After(50 * time.Millisecond):
	}
	release()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("bulk work still waited once the urgent chunk let go")
	}
	require.False(t, u.held(), "the instant's hold outlived the chunk that took over from it")

	u.expect()
	u.expect()
	require.EqualValues(t, 1, u.n.Load(), "each urgent instant added a hold of its own")
	u.hold()()
	require.False(t, u.held())

	// No urgent chunk starts here (another process took it): the hold ends
	// by itself.
	v := urgentFirst{bound: 50 * time.Millisecond}
	v.expect()
	require.Eventually(t, func() bool { return !v.held() }, 5*time.Second, 10*time.Millisecond)
}

// TestFanOutDueHoldsBulkBackAtUrgentInstants: told that the urgent lane's
// chunks fall due, a worker serving that lane holds its bulk work back; told
// of the bulk lane's, or serving no urgent lane, it does not.
func TestFanOutDueHoldsBulkBackAtUrgentInstants(t *testing.T) {
	t.Parallel()
	b := setupFanOut(t)
	w := b.worker(nil, FanOutConfig{})
	w.Due(QueueBulk)
	require.False(t, w.urgent.held(), "a bulk instant held bulk work back")
	w.Due(QueueUrgent)
	require.True(t, w.urgent.held(), "an urgent instant did not hold bulk work back")
	w.urgent.hold()()
	require.False(t, w.urgent.held())

	bulkOnly := NewFanOutWorker(FanOutConfig{Pool: b.db.Pool, Logger: discard, Clock: b.clock,
		Lanes: []Lane{{Queue: QueueBulk}}})
	bulkOnly.Due(QueueUrgent)
	require.False(t, bulkOnly.urgent.held(), "a process serving no urgent lane held its bulk work back")
}

// TestFanOutBulkWaitsForAnUrgentChunk: while an urgent chunk of the process
// holds the gate, a bulk message's later chunk sends nothing until the hold
// ends (here by itself, after urgentHold); its first chunk goes on.
func TestFanOutBulkWaitsForAnUrgentChunk(t *testing.T) {
	t.Parallel()
	b := setupFanOut(t)
	ctx := context.Background()
	tokens := make([]string, firstChunkSize+1)
	for i := range tokens {
		tokens[i] = fmt.Sprintf("fcm-%03d", i)
	}
	users := b.devices(tokens...)
	var msg db.Message
	require.NoError(t, db.InTx(ctx, b.db.Pool, func(tx pgx.Tx) error {
		var err error
		msg, err = NewEnqueuer(b.client, 0).Create(ctx, tx, MessageSpec{
			Priority: PriorityBulk, DispatchAt: b.clock.Now(), ExpiresAt: b.clock.Now().Add(time.Hour),
			Audience: Audience{UserIDs: users}, AudienceJSON: []byte(`{}`), Content: push.Content{Title: "t"},
		})
		return err
	}))
	jobIDs, err := b.q.MessageChunkJobs(ctx, msg.ID)
	require.NoError(t, err)
	require.Len(t, jobIDs, 2)
	chunks := map[int]chunkJob{}
	for _, id := range jobIDs {
		c := chunkJob{msg: msg, job: b.job(id)}
		var err error
		c.args, err = ChunkArgs(c.job.Kind, c.job.EncodedArgs)
		require.NoError(t, err)
		chunks[c.args.Chunk] = c
	}

	// The later chunk waits out the hold, which ends by itself.
	// A Send's hook runs on the sender's goroutine, one per slice.
	var sentAt atomic.Int64
	fcm := &recordingSender{sending: func() { sentAt.Store(time.Now().UnixNano()) }}
	w := b.worker(map[string]Sender{ChannelFCM: fcm}, FanOutConfig{})
	held := time.Now()
	_ = w.urgent.hold()
	b.work(w, chunks[1])
	require.Len(t, fcm.sent, 1)
	require.GreaterOrEqual(t, time.Unix(0, sentAt.Load()).Sub(held), urgentHold, "a later chunk sent while an urgent chunk held the gate")

	// The first chunk sends while a hold of a minute is held.
	var held0 atomic.Bool
	fcm = &recordingSender{sending: func() { held0.Store(w.urgent.held()) }}
	w = b.worker(map[string]Sender{ChannelFCM: fcm}, FanOutConfig{})
	w.urgent.bound = time.Minute
	release := w.urgent.hold()
	b.work(w, chunks[0])
	release()
	require.Len(t, fcm.sent, firstChunkSize)
	require.True(t, held0.Load(), "the first chunk waited for the urgent chunk")
}
