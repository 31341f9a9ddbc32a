//go:build unix

package fake

import "syscall"

// processCPU returns the user plus system CPU time this process has used, in
// nanoseconds. fakepush reports it per request so that a benchmark sharing the
// machine can tell its own cost from fakepush's.
func processCPU() int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}
