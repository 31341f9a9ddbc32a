package main

import (
	"bytes"
	"context"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestVersion: `herald version` names the release, the commit, the Go and
// the River the binary was built with; the River version is the one go.mod
// requires, read from the binary itself.
func TestVersion(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	require.NoError(t, run(context.Background(), []string{"herald", "version"}, func(string) string { return "" }, &out, &out))
	require.Regexp(t, `(?m)^herald \S+\ncommit \S+`, out.String())
	require.Regexp(t, `(?m)^go go1\.\d+`, out.String())
	require.Regexp(t, `(?m)^river v0\.\d+\.\d+$`, out.String())
}
