package main

import (
	"bytes"
	"context"
	"os"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

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
// configuration table (docs/configuration.md) names each of them.
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

	table := configurationSection(t)
	for _, name := range listed {
		// The table writes HERALD_MAX_IN_FLIGHT_FCM as `_FCM`.
		short := strings.TrimPrefix(name, "HERALD_MAX_IN_FLIGHT")
		named := strings.Contains(table, "| `"+name+"`") || strings.Contains(table, ", `"+name+"`") ||
			strings.Contains(table, ", `"+short+"`")
		require.True(t, named, "%s's configuration table does not name %s", configurationDoc, name)
	}
}

// configurationDoc is the document whose table describes the
// configuration, from this package's directory: the one place that says
// where it is.
const configurationDoc = "../../docs/configuration.md"

// configurationHeading is the heading of the doc's section that holds the
// table.
const configurationHeading = "Environment variables"

// configurationSection is the configuration doc's section of the table:
// from its heading to the next heading of the same level or above, or to
// the end.
func configurationSection(t *testing.T) string {
	t.Helper()
	doc, err := os.ReadFile(configurationDoc)
	require.NoError(t, err)
	lines := strings.Split(string(doc), "\n")
	start := slices.IndexFunc(lines, func(l string) bool {
		return strings.HasPrefix(l, "#") && strings.TrimLeft(l, "#") == " "+configurationHeading
	})
	require.GreaterOrEqual(t, start, 0, "%s has no %s heading", configurationDoc, configurationHeading)
	level := strings.Index(lines[start], " ")
	end := len(lines)
	for i := start + 1; i < len(lines); i++ {
		if n := strings.Index(lines[i], " "); strings.HasPrefix(lines[i], "#") && n <= level && strings.Trim(lines[i][:n], "#") == "" {
			end = i
			break
		}
	}
	return strings.Join(lines[start:end], "\n")
}

// configurationDefaults reads the configuration table: the default it
// shows for each variable, backquotes removed. A row naming several
// variables (`HERALD_CHUNK_TIMEOUT`, `HERALD_RESCUE_AFTER`, or
// `HERALD_MAX_IN_FLIGHT_APNS`, `_FCM`) gives as many defaults, separated by
// a comma or a semicolon, or one default for them all.
func configurationDefaults(t *testing.T) map[string]string {
	t.Helper()
	name := regexp.MustCompile("`([A-Z_][A-Z0-9_]*)`")
	split := regexp.MustCompile(`[,;] `)
	defaults := map[string]string{}
	for _, line := range strings.Split(configurationSection(t), "\n") {
		if !strings.HasPrefix(line, "| `") {
			continue
		}
		cells := strings.Split(strings.Trim(strings.ReplaceAll(line, `\|`, "/"), "| "), " | ")
		require.Len(t, cells, 3, "a row of the configuration table: %s", line)
		var names []string
		for _, m := range name.FindAllStringSubmatch(cells[0], -1) {
			n := m[1]
			if strings.HasPrefix(n, "_") && len(names) > 0 {
				first := names[0]
				n = first[:strings.LastIndex(first, "_")] + n
			}
			names = append(names, n)
		}
		def := strings.ReplaceAll(cells[2], "`", "")
		parts := split.Split(def, -1)
		for i, n := range names {
			if len(parts) == len(names) {
				defaults[n] = parts[i]
			} else {
				defaults[n] = def
			}
		}
	}
	return defaults
}

// TestConfigurationTableShowsTheDefaults checks that every default the
// configuration table shows for a variable with a default in code is that
// value, as --help shows it: the table may say more after it, never
// another value.
func TestConfigurationTableShowsTheDefaults(t *testing.T) {
	t.Parallel()
	defaults := configurationDefaults(t)
	checked := 0
	for _, v := range serveEnv {
		if v.value == nil {
			continue
		}
		shownThere, ok := defaults[v.name]
		require.True(t, ok, "%s's configuration table has no row for %s", configurationDoc, v.name)
		want := shown(v.value)
		matches := shownThere == want || strings.HasPrefix(shownThere, want+" ") || strings.HasPrefix(shownThere, want+":")
		require.True(t, matches, "%s's configuration table shows %q as the default of %s; the code's is %s", configurationDoc, shownThere, v.name, want)
		checked++
	}
	require.Greater(t, checked, 30, "the defaults in code that the table is checked against")
}

// TestShownDefaults: --help and the table write a duration as an operator
// would set it.
func TestShownDefaults(t *testing.T) {
	t.Parallel()
	for value, want := range map[any]string{
		250 * time.Millisecond: "250ms", 30 * time.Second: "30s", time.Minute: "1m", 2 * time.Minute: "2m",
		90 * time.Second: "1m30s", 720 * time.Hour: "720h (30 days)", 500: "500", "herald": "herald", false: "false",
	} {
		require.Equal(t, want, shown(value))
	}
}

// TestHelpListsEachVariableOnce: a command's --help names each variable it
// reads once.
func TestHelpListsEachVariableOnce(t *testing.T) {
	t.Parallel()
	for _, cmd := range []string{"serve", "migrate"} {
		var stdout bytes.Buffer
		require.NoError(t, run(context.Background(), []string{"herald", cmd, "--help"}, func(string) string { return "" }, &stdout, &bytes.Buffer{}))
		_, env, ok := strings.Cut(stdout.String(), "\nEnvironment")
		require.True(t, ok)
		seen := map[string]bool{}
		for _, line := range strings.Split(env, "\n")[1:] {
			if fields := strings.Fields(line); len(fields) > 0 {
				require.False(t, seen[fields[0]], "herald %s --help lists %s twice", cmd, fields[0])
				seen[fields[0]] = true
			}
		}
		require.Contains(t, seen, "HERALD_DB_SCHEMA")
	}
}
