package jobs

import (
	"encoding/json"
	"math"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestChunkJobOfAnEarlierVersion decodes a chunk job enqueued before chunks
// were ranges of the ledger, which carried its devices instead: it reads
// its message's whole ledger for its chunk number, and the devices it
// carried are not part of its args any more.
func TestChunkJobOfAnEarlierVersion(t *testing.T) {
	t.Parallel()
	var a FanOutArgs
	require.NoError(t, json.Unmarshal([]byte(`{"message_id":7,"chunk":2,"payload_id":3,"priority":"bulk",
		"dispatch_at":"2026-12-01T09:00:00Z","expires_at":"2026-12-01T10:00:00Z","targets":"1\tfde\ttok\n"}`), &a))
	r := a.ledgerRange()
	require.EqualValues(t, 7, r.MessageID)
	require.EqualValues(t, 2, r.Chunk)
	require.Zero(t, r.FirstDevice)
	require.Equal(t, int64(math.MaxInt64), r.LastDevice)

	raw, err := json.Marshal(FanOutArgs{MessageID: 7, Chunk: 2, FirstDevice: 10, LastDevice: 20})
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(raw, &a))
	r = a.ledgerRange()
	require.EqualValues(t, 10, r.FirstDevice)
	require.EqualValues(t, 20, r.LastDevice)
}
