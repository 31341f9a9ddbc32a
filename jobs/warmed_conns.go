package jobs

import (
	"sync"
	"time"
)

// rewarmAfter is how long a connection warmed for an instant is taken to be
// still open, so that the next instants' warm-ups leave it be: no provider
// closes a connection idle for so little (Herald's Web Push client keeps one
// 90 s), and without it a process whose instants come every second would
// send a warm-up request a connection every second.
const rewarmAfter = 5 * time.Second

// connKey names a connection an instant's warm-up opens: a lane's client of
// an app's credential on a channel (as sendGroup names it), and within it the
// APNs environment or the Web Push service host ("" for FCM, one host).
type connKey struct {
	lane       string
	channel    string
	app        int32
	credential int64
	where      string
}

// connWarmups are the connections this process's instant warm-ups opened
// lately, by when.
type connWarmups struct {
	mu sync.Mutex
	at map[connKey]time.Time
}

// claim reports whether k should be warmed now, and if so takes it to be
// warm from now: it was not warmed within rewarmAfter.
func (c *connWarmups) claim(k connKey, now time.Time) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.at == nil {
		c.at = map[connKey]time.Time{}
	}
	if at, ok := c.at[k]; ok && now.Sub(at) < rewarmAfter {
		return false
	}
	for old, at := range c.at {
		if now.Sub(at) >= rewarmAfter {
			delete(c.at, old)
		}
	}
	c.at[k] = now
	return true
}

// forget takes keys to be cold again: their warm-up failed, and the next
// instant's tries again.
func (c *connWarmups) forget(keys []connKey) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, k := range keys {
		delete(c.at, k)
	}
}
