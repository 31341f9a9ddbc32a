package webpush

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests if a goroutine outlives them: a
// provider's Close must end its senders and its connections.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
