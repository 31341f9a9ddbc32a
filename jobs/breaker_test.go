package jobs

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time          { return c.t }
func (c *fakeClock) advance(d time.Duration) { c.t = c.t.Add(d) }

func TestBreaker(t *testing.T) {
	t.Parallel()
	clock := &fakeClock{t: time.Unix(1000, 0)}
	b := NewBreaker(BreakerConfig{Threshold: 3, Cooldown: time.Second, MaxCooldown: 3 * time.Second, Now: clock.now})

	require.True(t, b.Allow())
	b.Failure("503")
	b.Failure("503")
	b.Success() // a success in between resets the count
	b.Failure("503")
	b.Failure("503")
	require.Equal(t, BreakerClosed, b.Status().State)
	b.Failure("503 ServiceUnavailable")
	require.Equal(t, BreakerOpen, b.Status().State)
	require.Equal(t, "503 ServiceUnavailable", b.Status().LastError)
	require.False(t, b.Allow())
	require.Equal(t, time.Second, b.RetryIn())

	// After the cooldown exactly one probe goes through.
	clock.advance(time.Second)
	require.True(t, b.Allow())
	require.Equal(t, BreakerHalfOpen, b.Status().State)
	require.False(t, b.Allow(), "one probe at a time")

	// A failed probe reopens it for twice as long, capped.
	b.Failure("503")
	require.Equal(t, BreakerOpen, b.Status().State)
	require.Equal(t, 2*time.Second, b.RetryIn())
	clock.advance(2 * time.Second)
	require.True(t, b.Allow())
	b.Failure("503")
	require.Equal(t, 3*time.Second, b.RetryIn(), "capped at MaxCooldown")

	// A successful probe closes it and resets the cooldown.
	clock.advance(3 * time.Second)
	require.True(t, b.Allow())
	b.Success()
	require.Equal(t, BreakerClosed, b.Status().State)
	require.True(t, b.Allow())
	require.Zero(t, b.RetryIn())
	for range 3 {
		b.Failure("503")
	}
	require.Equal(t, time.Second, b.RetryIn(), "cooldown starts over")
}
