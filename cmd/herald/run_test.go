package main

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/heraldpush/herald/api/client"
	"github.com/heraldpush/herald/db/dbtest"
)

const testAPIKey = "e2e-key-0123456789abcdef"

// syncBuffer is a bytes.Buffer safe to write from the process under test
// while the test reads it.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func env(vars map[string]string) func(string) string {
	return func(k string) string { return vars[k] }
}

// startServe runs `herald serve` in-process and returns its base URL once it
// answers /healthz, and a function that stops it and returns run's error.
func startServe(t *testing.T, vars map[string]string, args ...string) (string, func() error) {
	t.Helper()
	base, _, stop := startServeOut(t, vars, args...)
	return base, stop
}

// startServeOut is startServe that also returns what serve printed.
func startServeOut(t *testing.T, vars map[string]string, args ...string) (string, *syncBuffer, func() error) {
	t.Helper()
	base, stdout, _, stop := startServeLog(t, vars, args...)
	return base, stdout, stop
}

// startServeLog is startServeOut that also returns serve's log (stderr).
func startServeLog(t *testing.T, vars map[string]string, args ...string) (string, *syncBuffer, *syncBuffer, func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var stdout, stderr syncBuffer
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, append([]string{"herald", "serve", "--addr", "127.0.0.1:0"}, args...), env(vars), &stdout, &stderr)
	}()
	var base string
	require.Eventually(t, func() bool {
		select {
		case err := <-done:
			done <- err
			return true
		default:
		}
		m := listeningLine.FindStringSubmatch(stdout.String())
		if m == nil {
			return false
		}
		base = m[1]
		resp, err := http.Get(base + "/healthz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, time.Minute, 20*time.Millisecond, "serve did not answer /healthz; stderr:\n%s", &stderr)
	require.NotEmpty(t, base, "serve exited early; stderr:\n%s", stderr.String())
	// Stopping waits for run to return, so that nothing of this Herald
	// outlives its test (TestMain checks for leaked goroutines).
	var (
		once    sync.Once
		stopErr error
	)
	stop := func() error {
		once.Do(func() {
			cancel()
			select {
			case stopErr = <-done:
			case <-time.After(30 * time.Second):
				t.Error("serve did not stop within 30 s of cancellation")
			}
		})
		return stopErr
	}
	t.Cleanup(func() {
		_ = stop() // a test that cares calls stop itself and checks
		if t.Failed() {
			t.Logf("herald serve's log:\n%s", stderr.String())
		}
	})
	return base, &stdout, &stderr, stop
}

func TestServeRefusesUnmigratedDatabase(t *testing.T) {
	t.Parallel()
	tdb := dbtest.NewEmpty(t)
	var stderr bytes.Buffer
	err := run(context.Background(), []string{"herald", "serve", "--addr", "127.0.0.1:0"},
		env(map[string]string{"DATABASE_URL": tdb.URL}), io.Discard, &stderr)
	require.Error(t, err)
	require.Contains(t, err.Error(), "not migrated")
	require.Contains(t, err.Error(), "herald migrate")
}

// TestServeBindsFirst takes serve's port before it starts, on a database
// that is not even migrated: the port is what serve reports, naming the
// setting to change, because it binds before anything else. (When it bound
// last, River had started working chunks in a process that then failed.)
func TestServeBindsFirst(t *testing.T) {
	t.Parallel()
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer taken.Close()
	tdb := dbtest.NewEmpty(t)
	err = run(context.Background(), []string{"herald", "serve", "--migrate", "--addr", taken.Addr().String()},
		env(map[string]string{"DATABASE_URL": tdb.URL}), io.Discard, io.Discard)
	require.Error(t, err)
	require.Contains(t, err.Error(), "listen on "+taken.Addr().String())
	require.Contains(t, err.Error(), "HERALD_ADDR")
	var migrated bool
	require.NoError(t, tdb.Pool.QueryRow(context.Background(),
		`SELECT EXISTS (SELECT FROM pg_tables WHERE tablename = 'river_job')`).Scan(&migrated))
	require.False(t, migrated, "serve did work before it had its address")
}

func TestMigrateThenServe(t *testing.T) {
	t.Parallel()
	tdb := dbtest.NewEmpty(t)
	vars := map[string]string{"DATABASE_URL": tdb.URL, "HERALD_API_KEYS": "short-key-ignored-0000, " + testAPIKey}

	var out bytes.Buffer
	migrate := func(args ...string) string {
		t.Helper()
		out.Reset()
		require.NoError(t, run(context.Background(), append([]string{"herald", "migrate"}, args...), env(vars), &out, io.Discard))
		return out.String()
	}
	// --status and --dry-run say what would be done, and do none of it.
	status := migrate("--status")
	require.Regexp(t, `(?m)^river\s+1\s+.+\s+pending$`, status)
	require.Regexp(t, `(?m)^herald\s+12\s+0012_device_owner.sql\s+pending$`, status)
	require.NotContains(t, status, "applied")
	dry := migrate("--dry-run")
	require.Contains(t, dry, "-- herald migration 1: 0001_initial.sql\n")
	require.Contains(t, dry, "CREATE TABLE deliveries")
	var exists bool
	require.NoError(t, tdb.Pool.QueryRow(context.Background(),
		`SELECT EXISTS (SELECT FROM pg_tables WHERE tablename IN ('river_job', 'deliveries'))`).Scan(&exists))
	require.False(t, exists, "a dry run changed the database")

	require.Contains(t, migrate(), "applied")
	require.Contains(t, migrate(), "up to date")
	status = migrate("--status")
	require.NotRegexp(t, `(?m)^\S+\s+\d+\s+.+\s+pending$`, status)
	require.Contains(t, status, "0 pending")
	require.Contains(t, migrate("--dry-run"), "nothing would be applied")

	base, stop := startServe(t, vars)
	api := newAPIClient(t, base, testAPIKey)
	ready, err := api.GetReadinessWithResponse(t.Context())
	answered(t, http.StatusOK, ready, err)
	res, err := api.RegisterDeviceWithResponse(t.Context(), client.DeviceRegistration{UserID: "u1", Channel: client.ChannelFCM, Token: new("tok")})
	answered(t, http.StatusCreated, res, err)

	require.NoError(t, stop(), "a signal ends serve cleanly")
}

func TestServeMigratesWithFlag(t *testing.T) {
	t.Parallel()
	tdb := dbtest.NewEmpty(t)
	base, stop := startServe(t, map[string]string{"DATABASE_URL": tdb.URL}, "--migrate")
	api := newAPIClient(t, base, testAPIKey)
	ready, err := api.GetReadinessWithResponse(t.Context())
	answered(t, http.StatusOK, ready, err)
	// Without API keys every /v1 call is refused.
	devices, err := api.ListUserDevicesWithResponse(t.Context(), "u1", nil)
	answered(t, http.StatusUnauthorized, devices, err)
	require.NoError(t, stop())
}

func TestRunRejectsBadConfiguration(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cases := []struct {
		name string
		args []string
		vars map[string]string
		want string
	}{
		{"no command", []string{"herald"}, nil, "no command"},
		{"unknown command", []string{"herald", "launch"}, nil, `unknown command "launch"`},
		{"serve without database", []string{"herald", "serve"}, nil, "DATABASE_URL is not set"},
		{"migrate without database", []string{"herald", "migrate"}, nil, "DATABASE_URL is not set"},
		{"bad role", []string{"herald", "serve", "--role", "boss"}, map[string]string{"DATABASE_URL": "postgres:///x"}, `--role "boss"`},
		{"short api key", []string{"herald", "serve"}, map[string]string{"DATABASE_URL": "postgres:///x", "HERALD_API_KEYS": "abc"}, "at least 16"},
		{"bad log level", []string{"herald", "serve"}, map[string]string{"DATABASE_URL": "postgres:///x", "HERALD_LOG_LEVEL": "loud"}, "HERALD_LOG_LEVEL"},
		{"bad flag", []string{"herald", "serve", "--nope"}, nil, "not defined"},
		{"unknown lane", []string{"herald", "serve"}, map[string]string{"DATABASE_URL": "postgres:///x", "HERALD_LANES": "urgent,fast"}, `HERALD_LANES: unknown lane "fast"`},
		{"short admin password", []string{"herald", "serve"}, map[string]string{"DATABASE_URL": "postgres:///x", "HERALD_ADMIN_PASSWORD": "elevenchars"}, "HERALD_ADMIN_PASSWORD is 11 characters long; use at least 12"},
		{"short admin password in runes", []string{"herald", "serve"}, map[string]string{"DATABASE_URL": "postgres:///x", "HERALD_ADMIN_PASSWORD": "ééééééééééé"}, "HERALD_ADMIN_PASSWORD is 11 characters long"},
		{"bad trusted proxy", []string{"herald", "serve"}, map[string]string{"DATABASE_URL": "postgres:///x", "HERALD_TRUSTED_PROXIES": "10.0.0.0/8, proxy.internal"}, `HERALD_TRUSTED_PROXIES: "proxy.internal" is not a network`},
		{"bad prefix length", []string{"herald", "serve"}, map[string]string{"DATABASE_URL": "postgres:///x", "HERALD_TRUSTED_PROXIES": "10.0.0.0/33"}, `HERALD_TRUSTED_PROXIES: "10.0.0.0/33"`},
		{"bad secure cookies", []string{"herald", "serve"}, map[string]string{"DATABASE_URL": "postgres:///x", "HERALD_SECURE_COOKIES": "always"}, `HERALD_SECURE_COOKIES: "always" is neither true nor false`},
		{"bad read timeout", []string{"herald", "serve"}, map[string]string{"DATABASE_URL": "postgres:///x", "HERALD_HTTP_READ_TIMEOUT": "forever"}, "HERALD_HTTP_READ_TIMEOUT"},
		{"tiny idle timeout", []string{"herald", "serve"}, map[string]string{"DATABASE_URL": "postgres:///x", "HERALD_HTTP_IDLE_TIMEOUT": "10ms"}, "HERALD_HTTP_IDLE_TIMEOUT"},
		{"write shorter than read", []string{"herald", "serve"}, map[string]string{"DATABASE_URL": "postgres:///x", "HERALD_HTTP_READ_TIMEOUT": "3m"}, "HERALD_HTTP_WRITE_TIMEOUT (2m0s) must be at least HERALD_HTTP_READ_TIMEOUT (3m0s)"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := run(ctx, tc.args, env(tc.vars), io.Discard, io.Discard)
			require.Error(t, err)
			require.Contains(t, err.Error(), tc.want)
		})
	}
}

// TestLoadConfigHTTP checks the defaults and the parsing of the HTTP
// server's settings.
func TestLoadConfigHTTP(t *testing.T) {
	t.Parallel()
	cfg, err := loadConfig(env(nil))
	require.NoError(t, err)
	require.Empty(t, cfg.TrustedProxies)
	require.False(t, cfg.SecureCookies)
	require.Equal(t, time.Minute, cfg.ReadTimeout)
	require.Equal(t, 2*time.Minute, cfg.WriteTimeout)
	require.Equal(t, 2*time.Minute, cfg.IdleTimeout)
	require.NoError(t, cfg.validateAdminPassword(), "no password leaves the dashboard off")

	cfg, err = loadConfig(env(map[string]string{
		"HERALD_TRUSTED_PROXIES":    " 10.1.0.0/16,192.0.2.7 , 2001:db8::/32,,2001:db8:1::1",
		"HERALD_SECURE_COOKIES":     "true",
		"HERALD_HTTP_READ_TIMEOUT":  "5s",
		"HERALD_HTTP_WRITE_TIMEOUT": "5s",
		"HERALD_HTTP_IDLE_TIMEOUT":  "30s",
		"HERALD_ADMIN_PASSWORD":     "q8Zt3_kL0-xYw2Ab",
	}))
	require.NoError(t, err)
	var nets []string
	for _, n := range cfg.TrustedProxies {
		nets = append(nets, n.String())
	}
	require.Equal(t, []string{"10.1.0.0/16", "192.0.2.7/32", "2001:db8::/32", "2001:db8:1::1/128"}, nets)
	require.True(t, cfg.SecureCookies)
	require.Equal(t, []time.Duration{5 * time.Second, 5 * time.Second, 30 * time.Second}, []time.Duration{cfg.ReadTimeout, cfg.WriteTimeout, cfg.IdleTimeout})
	require.NoError(t, cfg.validateAdminPassword(), "make run's 16-character password is long enough")
}
