package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/heraldpush/herald/cmd/herald/heraldbench"
	"github.com/heraldpush/herald/db"
	"github.com/heraldpush/herald/db/dbtest"
	"github.com/heraldpush/herald/jobs"
)

// findPgBouncer returns the path of Debian's pgbouncer, which `make
// test-e2e` installs when it is missing; where that was not possible the
// pooler tests skip, loudly, rather than fail.
func findPgBouncer(t *testing.T) string {
	t.Helper()
	if p, err := exec.LookPath("pgbouncer"); err == nil {
		return p
	}
	// Debian puts it in /usr/sbin, which a user's PATH may lack.
	if _, err := os.Stat("/usr/sbin/pgbouncer"); err == nil {
		return "/usr/sbin/pgbouncer"
	}
	t.Skip("!!! SKIPPING the pooler tests: no pgbouncer found. Install it (apt-get install pgbouncer) or run `make test-e2e` as root, which installs it.")
	return ""
}

// startPgBouncer runs a PgBouncer of the test's own in front of c's
// database herald, pooling in mode (session or transaction), listening on
// a free loopback port, and returns the URL that reaches the database
// through it. It trusts whoever connects (loopback only) as postgres, and
// stops when the test ends.
func startPgBouncer(t *testing.T, c *dbtest.Cluster, mode string) string {
	t.Helper()
	bin := findPgBouncer(t)
	direct, err := pgconn.ParseConfig(c.URL)
	require.NoError(t, err)
	// Not t.TempDir: its parent is the test's, which only root may enter.
	dir, err := os.MkdirTemp("", "herald-pgbouncer-")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	_, port, err := net.SplitHostPort(freeAddr(t))
	require.NoError(t, err)
	// Every startup parameter pgx sends is one PgBouncer either tracks
	// (application_name, client_encoding, DateStyle, TimeZone, ...) or must
	// be told to ignore, or it refuses the connection.
	ini := fmt.Sprintf(`[databases]
herald = host=%s dbname=herald user=postgres

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %s
unix_socket_dir =
auth_type = trust
auth_file = %s
pool_mode = %s
default_pool_size = 150
max_client_conn = 400
ignore_startup_parameters = extra_float_digits
logfile =
pidfile =
`, direct.Host, port, filepath.Join(dir, "userlist.txt"), mode)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "userlist.txt"), []byte(`"postgres" ""`+"\n"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "pgbouncer.ini"), []byte(ini), 0o644))
	cmd := exec.Command(bin, filepath.Join(dir, "pgbouncer.ini"))
	if os.Getuid() == 0 {
		// PgBouncer refuses to run as root, as PostgreSQL does. It is
		// started as postgres itself, not through runuser, so that killing
		// it at the end kills PgBouncer and not only runuser.
		u, err := user.Lookup("postgres")
		require.NoError(t, err, "running as root with no postgres user to run pgbouncer as")
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		require.NoError(t, os.Chown(dir, uid, gid))
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}}
	}
	bouncer := &child{cmd: cmd, out: &syncBuffer{}}
	cmd.Stdout, cmd.Stderr = bouncer.out, bouncer.out
	cmd.WaitDelay = 5 * time.Second
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("pgbouncer's output:\n%s", bouncer.out.String())
		}
	})
	addr := net.JoinHostPort("127.0.0.1", port)
	require.Eventually(t, func() bool {
		conn, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			return false
		}
		conn.Close()
		return true
	}, 30*time.Second, 20*time.Millisecond, "pgbouncer never listened on %s:\n%s", addr, bouncer.out)
	t.Logf("pgbouncer (%s mode) on %s: %s", mode, addr, strings.TrimSpace(firstLine(bouncer.out.String())))
	return fmt.Sprintf("postgres://postgres@%s/herald?sslmode=disable", addr)
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}

// TestE2EPoolerTransactionModeIsRefused puts Debian's PgBouncer (1.18) in
// transaction mode between Herald and PostgreSQL. Through it a
// connection's statements run on whichever server session is free: pgx's
// prepared statements are met by sessions that never prepared them, or
// already had ("prepared statement ... already exists": River's driver
// failed to start, the API's reads failed), a worker's liveness lock would
// stay on a session that outlives the worker, and River's LISTEN on one
// that no longer listens for it. So `herald serve`, in every role, and
// `herald migrate` refuse to start, naming the mode they need.
func TestE2EPoolerTransactionModeIsRefused(t *testing.T) {
	t.Parallel()
	c := dbtest.NewCluster(t)
	url := startPgBouncer(t, c, "transaction")
	ctx := context.Background()
	require.NoError(t, run(ctx, []string{"herald", "migrate"}, env(map[string]string{"DATABASE_URL": c.URL}), io.Discard, io.Discard))
	vars := map[string]string{"DATABASE_URL": url, "HERALD_API_KEYS": testAPIKey}
	for _, args := range [][]string{
		{"herald", "migrate"},
		{"herald", "serve", "--addr", "127.0.0.1:0"},
		{"herald", "serve", "--addr", "127.0.0.1:0", "--role", "api"},
		{"herald", "serve", "--addr", "127.0.0.1:0", "--role", "worker"},
	} {
		err := run(ctx, args, env(vars), io.Discard, io.Discard)
		require.ErrorIs(t, err, db.ErrSessionsShared, "%v", args)
		require.ErrorContains(t, err, "needs PgBouncer in session mode, or a direct connection", "%v", args)
	}
	// The check itself: through the pooler it fails, directly it passes.
	pool, err := db.Open(ctx, url, db.PoolConfig{MaxConns: 2})
	require.NoError(t, err)
	defer pool.Close()
	require.ErrorIs(t, db.CheckOwnSessions(ctx, pool), db.ErrSessionsShared)
	require.NoError(t, db.CheckOwnSessions(ctx, c.Pool()))
}

// TestE2EPoolerSessionModeWorks runs an API and two workers through
// PgBouncer in session mode, where each client connection keeps a server
// session of its own: the start-up check passes, a 10,000-device fan-out
// settles with every device accepted once, and when one worker is killed
// -9 mid fan-out the other takes its chunks over (River's rescue an hour
// away): PgBouncer ends the dead client's session with DISCARD ALL, its
// server_reset_query, which frees the liveness lock.
func TestE2EPoolerSessionModeWorks(t *testing.T) {
	t.Parallel()
	const devices = 10_000
	c := dbtest.NewCluster(t)
	url := startPgBouncer(t, c, "session")
	s := newFanOutSetupOn(t, devices, &dbtest.DB{Pool: c.Pool(), URL: url}, 40*time.Millisecond)
	s.onlyTakeover()
	a, b := startListeningWorkers(t, s.vars)
	id := s.schedule()
	require.Eventually(t, func() bool { return s.accepted() >= devices/4 }, 2*time.Minute, 5*time.Millisecond,
		"the fan-out never got going:\n%s\n%s", a.out.String(), b.out.String())
	aUnanswered := a.unanswered(t)
	a.kill(t)
	require.Less(t, s.accepted(), int64(devices), "the fan-out finished before the kill; the test proved nothing")

	dups := s.checkOnceEach(id, devices)
	families, err := heraldbench.ScrapeMetrics(b.base(t))
	require.NoError(t, err)
	takenOver := heraldbench.MetricSum(families, "herald_chunks_taken_over_total", nil)
	bUnanswered := b.unanswered(t)
	t.Logf("through pgbouncer in session mode: %.0f chunks taken over; duplicates %d; unanswered sends %d (killed worker) and %d",
		takenOver, dups, aUnanswered, bUnanswered)
	require.Positive(t, takenOver, "the survivor took over none of the dead worker's chunks")
	require.LessOrEqual(t, int64(dups), jobs.MaxUnwritten+aUnanswered+bUnanswered,
		"more answers were lost with the process than the ledger writer lets be unwritten")
}
