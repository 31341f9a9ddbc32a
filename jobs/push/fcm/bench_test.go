package fcm

import (
	"testing"

	"github.com/heraldpush/herald/jobs/push/pushtest"
)

// BenchmarkSend measures Send at a few in-flight limits, as
// pushtest.Harness.BenchmarkSend describes; the client's CPU per push is the
// SDK's JSON, TLS's and HTTP/2's.
//
//	go test -run '^$' -bench . -benchtime 40x ./jobs/push/fcm/
func BenchmarkSend(b *testing.B) {
	harness().BenchmarkSend(b, 64, 200, DefaultMaxInFlight)
}

// BenchmarkPayloads compares the plain and the rich payload's cost per
// push (pushtest.Harness.BenchmarkPayloads).
//
//	go test -run '^$' -bench Payloads -benchtime 40x ./jobs/push/fcm/
func BenchmarkPayloads(b *testing.B) {
	harness().BenchmarkPayloads(b, DefaultMaxInFlight)
}

// BenchmarkReceipts compares a push's cost without and with its receipt
// token (pushtest.Harness.BenchmarkReceipts).
//
//	go test -run '^$' -bench Receipts -benchtime 40x ./jobs/push/fcm/
func BenchmarkReceipts(b *testing.B) {
	harness().BenchmarkReceipts(b, DefaultMaxInFlight)
}

// TestFakepushChild is the benchmark's fakepush; it does nothing unless
// started by pushtest.StartChild.
func TestFakepushChild(t *testing.T) { pushtest.ServeChild(t) }
