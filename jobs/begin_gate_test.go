package jobs

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestBeginGateLetsFirstChunksGoFirst: a message's first chunk begins at
// once, however many chunks are beginning; another waits while a first
// chunk is beginning, but not for longer than the gate's bound, and only so
// many of the others begin at once.
func TestBeginGateLetsFirstChunksGoFirst(t *testing.T) {
	t.Parallel()
	g := newBeginGate(2, time.Hour)
	ctx := context.Background()
	quick := func() context.Context {
		c, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		t.Cleanup(cancel)
		return c
	}
	a, err := g.enter(ctx, false)
	require.NoError(t, err)
	b, err := g.enter(ctx, false)
	require.NoError(t, err)
	_, err = g.enter(quick(), false)
	require.Error(t, err, "two others are beginning")
	first, err := g.enter(quick(), true)
	require.NoError(t, err, "a first chunk does not wait for the others")
	a()
	_, err = g.enter(quick(), false)
	require.Error(t, err, "a first chunk is beginning")
	entered := make(chan func(), 1)
	go func() {
		release, err := g.enter(ctx, false)
		if err == nil {
			entered <- release
		}
	}()
	first()
	select {
	case release := <-entered:
		release()
	case <-time.After(10 * time.Second):
		t.Fatal("the other did not begin once the first chunk had")
	}
	b()

	// A stream of first chunks holds the others back no longer than the
	// bound.
	g = newBeginGate(2, 20*time.Millisecond)
	first, err = g.enter(ctx, true)
	require.NoError(t, err)
	other, err := g.enter(quick(), false)
	require.NoError(t, err, "the bound, not the first chunk, ends the wait")
	other()
	first()

	var nilGate *beginGate
	release, err := nilGate.enter(ctx, false)
	require.NoError(t, err)
	release()
}
