package jobs

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests if any goroutine outlives them: the
// chunk worker sends from goroutines of its own, and the tests start River
// clients, promoters and wakers, each of which must be stopped by the test
// that started it.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
