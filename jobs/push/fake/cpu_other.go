//go:build !unix

package fake

// processCPU is not measured outside Unix; /_stats then reports zero CPU.
func processCPU() int64 { return 0 }
