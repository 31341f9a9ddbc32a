package webpush

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestSenderThrottleNeedsNearlyEveryAnswer: a burst's first answers can be
// mostly 429s by chance when a few of its subscriptions are throttled each
// on its own (three of the first four, with a fifth of them throttled, is
// one burst in about forty). Read as the sender throttled, that paused the
// service's breaker and halved its bound in flight for a throttle that was
// no one's but those subscriptions'. A sender-wide throttle answers 429 to
// nearly every request: that is what reads as one.
func TestSenderThrottleNeedsNearlyEveryAnswer(t *testing.T) {
	t.Parallel()
	at := time.Now()
	var s senderThrottle
	for i, throttled := range []bool{true, true, false, true, false, true, true, false} {
		require.False(t, s.observe(at.Add(time.Duration(i)*time.Millisecond), throttled),
			"answer %d: a burst whose answers are some 429s and some accepted is no sender's throttle", i)
	}

	// A wall: every answer a 429, from the fifth on read as the sender's.
	var wall senderThrottle
	for i := range 8 {
		sender := wall.observe(at.Add(time.Duration(i)*time.Millisecond), true)
		require.Equal(t, i+1 >= senderWideAfter, sender, "answer %d of a wall of 429s", i)
	}
	// An accepted answer among them leaves it the sender's while 429s are
	// four in five of the answers.
	require.False(t, wall.observe(at.Add(9*time.Millisecond), false))
	require.True(t, wall.observe(at.Add(10*time.Millisecond), true))

	// Two windows on, the counts start again.
	require.False(t, wall.observe(at.Add(3*throttleWindow), true))
}
