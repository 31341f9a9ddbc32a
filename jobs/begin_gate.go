package jobs

import (
	"context"
	"sync"
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
	mu         sync.Mutex
	// firsts counts the first chunks beginning; clear is closed, and
	// forgotten, when it falls to zero.
	firsts int
	clear  chan struct{}
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

// enter waits until a chunk may begin (first: a message's first chunk) and
// returns what to call once it has. A nil gate lets every chunk begin.
func (g *beginGate) enter(ctx context.Context, first bool) (release func(), err error) {
	if g == nil {
		return func() {}, nil
	}
	g.mu.Lock()
	if first {
		g.firsts++
		g.mu.Unlock()
		return func() {
			g.mu.Lock()
			defer g.mu.Unlock()
			if g.firsts--; g.firsts == 0 && g.clear != nil {
				close(g.clear)
				g.clear = nil
			}
		}, nil
	}
	if g.firsts > 0 {
		if g.clear == nil {
			g.clear = make(chan struct{})
		}
		clear := g.clear
		g.mu.Unlock()
		wait := time.NewTimer(g.firstsWait)
		defer wait.Stop()
		select {
		case <-clear:
		case <-wait.C:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	} else {
		g.mu.Unlock()
	}
	select {
	case g.others <- struct{}{}:
		return func() { <-g.others }, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}
