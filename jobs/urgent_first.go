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
type urgentFirst struct {
	holds
	// bound, when set, stands for urgentHold (tests).
	bound time.Duration
}

// urgentHold bounds how long one urgent chunk holds bulk work back, and how
// long bulk work waits at a time: about an urgent chunk's begin and one
// provider round trip.
const urgentHold = 100 * time.Millisecond

// hold holds the gate for an urgent chunk; release lets go (at most
// urgentHold after hold, whichever comes first).
func (u *urgentFirst) hold() (release func()) {
	u.add()
	var once sync.Once
	letGo := func() { once.Do(u.done) }
	t := time.AfterFunc(cmp.Or(u.bound, urgentHold), letGo)
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
