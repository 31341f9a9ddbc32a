package heraldbench

import (
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	"github.com/heraldpush/herald/jobs/push/fake"
)

// Connections is what fakepush counted of the provider connections around
// the instant, with --drop-connections: every connection clients held was
// closed DroppedBeforeMs before the instant, as providers close those kept
// idle, so that the instant's pushes met them closed unless Herald's
// warm-up, which runs up to DefaultWakeAhead (2 s) ahead, came after the
// close and opened them again.
type Connections struct {
	DroppedBeforeMs float64 `json:"dropped_before_ms"`
	// Closed is how many fakepush closed: Herald's (both lanes' clients,
	// the status reader has none), the probe's and the bench's own but
	// the one that asked.
	Closed int `json:"closed"`
	// OpenedBeforeInstant counts the connections opened from the close
	// until 100 ms before the instant: the instant's warm-ups'.
	OpenedBeforeInstant int64 `json:"opened_before_instant"`
	// OpenedAfterInstant counts those opened from then until every message
	// settled: those the instant's pushes opened themselves, a TLS
	// handshake each, and the probe's one.
	OpenedAfterInstant int64 `json:"opened_after_instant"`
	// opened is fakepush's count of opened connections when last read.
	opened int64
}

// dropConnections has fakepush close every connection clients hold to it
// (but the bench's own that asks), before the instant at.
func (b *Benchmark) dropConnections(at time.Time) (*Connections, error) {
	resp, err := b.fakeHTTP.Post(b.fakeURL+"/_connections/close", "application/json", nil)
	if err != nil {
		return nil, fmt.Errorf("--drop-connections: %w", err)
	}
	defer resp.Body.Close()
	var closed fake.ClosedConnections
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("--drop-connections: fakepush answered %s", resp.Status)
	}
	if err := json.NewDecoder(resp.Body).Decode(&closed); err != nil {
		return nil, fmt.Errorf("--drop-connections: %w", err)
	}
	c := &Connections{DroppedBeforeMs: ms(time.Until(at)), Closed: closed.Closed}
	_, err = c.openedSince(b)
	return c, err
}

// openedSince reads fakepush's count of opened connections and returns how
// many were opened since the last read.
func (c *Connections) openedSince(b *Benchmark) (int64, error) {
	resp, err := b.fakeHTTP.Get(b.fakeURL + "/_stats")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var st fake.Stats
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		return 0, err
	}
	n := st.Connections.Opened - c.opened
	c.opened = st.Connections.Opened
	return n, nil
}
