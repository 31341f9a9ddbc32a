package api

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package when a test leaves a goroutine behind: the
// server's handlers, sessions and rate limiter start none of their own, so
// one left running is a request, pool or client that was not closed.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
