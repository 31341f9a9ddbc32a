package jobs

import (
	"cmp"
	"context"
	"sync"
	"time"
)

// urgentFirst lets a process's urgent chunks go ahead of its bulk work.
//
// The lanes of one process have their own connections, River clients and
// provider clients, but they share Go's scheduler, which has no
// priorities. While a bulk fan-out keeps the processors busy, each time an
// urgent chunk waits on the network (its fetch, its begin, its provider's
// answer) the goroutines it wakes queue behind hundreds of the fan-out's:
// at the instant a bulk message fell due with it, the urgent push was
// answered 60-200 ms after its time in one process, 40-65 ms with the
// urgent lane in a process of its own. So while an urgent chunk of this
// process is under way, the process's bulk chunks do not begin and their
// requests do not start (those in flight go on): the queue drains, and the
// urgent chunk's goroutines run when they wake. A bulk message's first
// chunk does not wait: it is small (firstChunkSize) and carries its
// message's own first devices.
//
// An urgent chunk holds the gate from its start until its sends are
// answered, urgentHold at most, and bulk work waits urgentHold at most, so
// a stream of urgent messages slows a fan-out but never stops it.
//
// The gate is held from the urgent chunk's instant, not only from its
// start (expect): the way from the instant to the start is itself work
// that waits for the processors (the lane's wake, River's fetch, their
// backends in PostgreSQL), and a bulk message due at the same instant
// filled them first. In twenty-four runs of herald bench with the gate
// taken only at the start, the urgent chunk started 93 ms after its
// instant in one (River fetched it after 150 bulk chunks), and the
// largest urgent skew was 157 ms; held from the instant, in twenty-four
// runs interleaved with those, 36 and 72 ms (docs/performance.md).
type urgentFirst struct {
	holds
	// bound, when set, stands for urgentHold and urgentPickup (tests).
	bound time.Duration

	mu sync.Mutex
	// expected lets go of the hold expect took, until an urgent chunk
	// starts and holds the gate itself; nil when there is none.
	expected func()
}

// urgentHold bounds how long one urgent chunk holds bulk work back, and how
// long bulk work waits at a time: about an urgent chunk's begin and one
// provider round trip.
const urgentHold = 100 * time.Millisecond

// urgentPickup bounds how long an urgent instant holds bulk work back
// before an urgent chunk starts (expect): several times the 10-20 ms an
// urgent chunk takes to start after its instant on a busy process (36 ms
// at most in twenty-four runs of herald bench with the gate held from the
// instant), and a bound on what a process whose bulk work waited for an
// urgent chunk another process took loses.
const urgentPickup = 50 * time.Millisecond

// hold holds the gate for an urgent chunk, taking over from the hold of
// its instant (expect); release lets go (at most urgentHold after hold,
// whichever comes first).
func (u *urgentFirst) hold() (release func()) {
	release = u.take(cmp.Or(u.bound, urgentHold))
	u.expectUntil(nil)
	return release
}

// expect holds the gate at an instant an urgent chunk of the process falls
// due, until an urgent chunk starts (hold) or urgentPickup has passed. The
// chunk may be another process's: then this one's bulk work waits
// urgentPickup at most, once.
func (u *urgentFirst) expect() { u.expectUntil(u.take(cmp.Or(u.bound, urgentPickup))) }

// expectUntil makes letGo the expected hold's, nil for none, and lets go
// of the one before: an instant's hold stands for every earlier one's.
func (u *urgentFirst) expectUntil(letGo func()) {
	u.mu.Lock()
	before := u.expected
	u.expected = letGo
	u.mu.Unlock()
	if before != nil {
		before()
	}
}

// take holds the gate until the returned func is called, bound at most.
func (u *urgentFirst) take(bound time.Duration) (release func()) {
	u.add()
	var once sync.Once
	letGo := func() { once.Do(u.done) }
	t := time.AfterFunc(bound, letGo)
	return func() {
		t.Stop()
		letGo()
	}
}

// wait returns once no urgent chunk holds the gate, urgentHold at most, or
// when ctx ends.
func (u *urgentFirst) wait(ctx context.Context) {
	_ = u.holds.wait(ctx, cmp.Or(u.bound, urgentHold))
}
