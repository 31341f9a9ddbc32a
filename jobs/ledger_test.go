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
		require.True(t, l.reserve(context.Background()))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	require.False(t, l.reserve(ctx), "a place past MaxUnwritten waits for one to be freed")
	got := make(chan bool, 1)
	go func() { got <- l.reserve(context.Background()) }()
	l.release(1)
	require.True(t, <-got, "a freed place goes to the request waiting for it")
}
