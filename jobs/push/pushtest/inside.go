package pushtest

import (
	"net"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
)

// Inside is a TCP service on this machine's loopback that counts the
// connections it receives: what a Web Push endpoint must never reach.
type Inside struct {
	// Port is the service's port on 127.0.0.1.
	Port     string
	accepted atomic.Int64
}

// StartInside starts an Inside, closed when t ends.
func StartInside(t testing.TB) *Inside {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	in := &Inside{}
	_, in.Port, _ = net.SplitHostPort(ln.Addr().String())
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			in.accepted.Add(1)
			c.Close()
		}
	}()
	return in
}

// Connections is how many connections the service has received.
func (in *Inside) Connections() int64 { return in.accepted.Load() }
