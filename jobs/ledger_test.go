package jobs

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestLedgerBoundsWhatIsUnwritten: past MaxUnwritten places, a request
// waits until a written answer frees one, so that what a crash can lose
// stays bounded however slow the writes are.
func TestLedgerBoundsWhatIsUnwritten(t *testing.T) {
	t.Parallel()
	l := &ledger{chunks: map[chunkKey]*chunkRecord{}}
	for range MaxUnwritten {
		require.True(t, l.reserve(context.Background(), false))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	require.False(t, l.reserve(ctx, false), "a place past MaxUnwritten waits for one to be freed")
	got := make(chan bool, 1)
	go func() { got <- l.reserve(context.Background(), false) }()
	l.release(1)
	require.True(t, <-got, "a freed place goes to the request waiting for it")

	// A lead (a message's first devices) does not wait behind a full
	// writer; it takes a place past the bound, which it gives back.
	require.True(t, l.reserve(context.Background(), true), "a lead takes a place at once")
	require.Equal(t, MaxUnwritten+1, l.owed)
	l.release(2)
	require.True(t, l.reserve(context.Background(), false), "a place freed below the bound goes to the others again")
}
