package jobs

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// beginGate is a pool's gate for beginning chunks. When many chunks fall
// due at once (twenty messages at the same second start fifty chunks a
// process), their beginnings queued for the pool's connections and the
// database's CPU, and a message's first chunk queued with the rest: its
// first devices went out hundreds of milliseconds late. So a message's
// first chunk begins at once; any other waits while a first chunk is
// beginning (for firstsWait at most, so that a stream of small messages
// never holds it back for long), and only so many of them (a quarter of
// the pool's connections) begin at once, which leaves connections to the
// first chunks and the ledger writer.
//
// The others do not wait only for the first chunks they found beginning:
// a lane's fetch hands out every chunk of it at once, in no order, and
// when twenty messages fell due together the later first chunks then
// began among the others again (the latest first device at 515 ms,
// against 203-246 with the wait).
type beginGate struct {
	// others holds a token per chunk beginning that is not a message's
	// first.
	others chan struct{}
	// firstsWait bounds how long another chunk waits for the first ones.
	firstsWait time.Duration
	// firsts are the first chunks beginning.
	firsts holds
}

// holds counts the holders of a gate that other work waits for while
// anyone holds it, a bound at most: the first chunks beginning (beginGate),
// the urgent chunks under way (urgentFirst). An idle gate costs a waiter
// one atomic load.
type holds struct {
	n  atomic.Int64
	mu sync.Mutex
	// clear is closed, and forgotten, when n falls to zero.
	clear chan struct{}
}

func (h *holds) add() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.n.Add(1) == 1 {
		h.clear = make(chan struct{})
	}
}

func (h *holds) done() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.n.Add(-1) == 0 {
		close(h.clear)
		h.clear = nil
	}
}

// held reports whether anyone holds the gate.
func (h *holds) held() bool { return h.n.Load() > 0 }

// wait returns once nobody holds the gate or bound has passed, or with
// ctx's error when ctx ends first.
func (h *holds) wait(ctx context.Context, bound time.Duration) error {
	if !h.held() {
		return nil
	}
	h.mu.Lock()
	clear := h.clear
	h.mu.Unlock()
	if clear == nil {
		return nil
	}
	t := time.NewTimer(bound)
	defer t.Stop()
	select {
	case <-clear:
	case <-t.C:
	case <-ctx.Done():
		return ctx.Err()
	}
	return nil
}

// firstsWait is how long at most a chunk waits for first chunks to begin
// (beginGate). When twenty messages fell due at once their first chunks
// took up to 200 ms to begin, and a bound of 100 ms let the others in among
// them again: the latest first device at 262-313 ms in four runs, against
// 206-246 in five with no bound.
const firstsWait = 500 * time.Millisecond

func newBeginGate(others int, wait time.Duration) *beginGate {
	return &beginGate{others: make(chan struct{}, max(others, 1)), firstsWait: wait}
}

// othersAtOnce is how many chunks that are not a message's first begin at
// once (none without a gate: every chunk begins then, and none waits).
func (g *beginGate) othersAtOnce() int {
	if g == nil {
		return 0
	}
	return cap(g.others)
}

// enter waits until a chunk may begin (first: a message's first chunk) and
// returns what to call once it has. A nil gate lets every chunk begin.
func (g *beginGate) enter(ctx context.Context, first bool) (release func(), err error) {
	if g == nil {
		return func() {}, nil
	}
	if first {
		g.firsts.add()
		return g.firsts.done, nil
	}
	if err := g.firsts.wait(ctx, g.firstsWait); err != nil {
		return nil, err
	}
	select {
	case g.others <- struct{}{}:
		return func() { <-g.others }, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}
