package main

import (
	"bytes"
	"context"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// configurationDoc is the doc whose configuration table names every
// variable `herald serve` reads, seen from this package's directory.
const configurationDoc = "../../docs/configuration.md"

// TestHelp checks that every command answers --help (and -h) on stdout,
// exiting 0, with its flags and the environment it reads; none may start
// anything or need a database to do so.
func TestHelp(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		cmd  string
		want []string
	}{
		{"serve", []string{"-addr", "-role", "-migrate", "DATABASE_URL", "HERALD_API_KEYS", "HERALD_WEBPUSH_HOSTS"}},
		{"migrate", []string{"Usage: herald migrate", "DATABASE_URL", "HERALD_LOG_LEVEL"}},
		{"fakepush", []string{"-addr", "-latency", "-tls-dir", "reads no environment"}},
		{"bench", []string{"-users", "-latency", "-urgent-worker", "DATABASE_URL", "HERALD_BULK_WORKERS"}},
	} {
		for _, flag := range []string{"--help", "-h"} {
			var stdout, stderr bytes.Buffer
			// A broken environment must not keep help from answering.
			getenv := func(k string) string {
				if k == "HERALD_CHUNK_SIZE" {
					return "not a number"
				}
				return ""
			}
			err := run(context.Background(), []string{"herald", tc.cmd, flag}, getenv, &stdout, &stderr)
			require.NoError(t, err, "herald %s %s", tc.cmd, flag)
			for _, w := range tc.want {
				require.Contains(t, stdout.String(), w, "herald %s %s", tc.cmd, flag)
			}
			require.Empty(t, stderr.String())
		}
	}
}

// TestEnvironmentDocumented checks that --help's list of the variables
// serve reads is exactly what its configuration reads, and that the
// configuration table of configurationDoc names each of them.
func TestEnvironmentDocumented(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	read := map[string]bool{}
	getenv := func(k string) string {
		mu.Lock()
		defer mu.Unlock()
		read[k] = true
		return ""
	}
	_, err := loadConfig(getenv)
	require.NoError(t, err)
	_, err = newLogger(getenv, &bytes.Buffer{})
	require.NoError(t, err)
	read["GOGC"] = true // read by main before run

	var listed []string
	for _, v := range serveEnv {
		listed = append(listed, v.name)
	}
	var readNames []string
	for k := range read {
		readNames = append(readNames, k)
	}
	slices.Sort(listed)
	slices.Sort(readNames)
	require.Equal(t, readNames, listed, "serveEnv (herald serve --help) must list exactly what serve reads")

	doc, err := os.ReadFile(configurationDoc)
	require.NoError(t, err)
	table := string(doc)
	for _, name := range listed {
		// The table writes HERALD_MAX_IN_FLIGHT_FCM as `_FCM`.
		short := strings.TrimPrefix(name, "HERALD_MAX_IN_FLIGHT")
		named := strings.Contains(table, "| `"+name+"`") || strings.Contains(table, ", `"+name+"`") ||
			strings.Contains(table, ", `"+short+"`")
		require.True(t, named, "the configuration table of %s does not name %s", configurationDoc, name)
	}
}
