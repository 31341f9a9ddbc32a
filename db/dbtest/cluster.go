package dbtest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/heraldpush/herald/db"
)

// Cluster is a PostgreSQL server of a test's own, in a temporary directory
// in RAM, for a test that restarts or stops its database under a running
// Herald without disturbing the tests that share the server of `make test`.
type Cluster struct {
	tb   testing.TB
	dir  string
	bin  string
	data string
	// opts are server settings of this cluster's own, given to every
	// start (-c name=value ...).
	opts string
	// URL connects to the cluster's database herald, empty: `herald serve
	// --migrate` or db.Migrate makes its tables.
	URL string
}

// NewCluster initialises and starts a cluster (as db/cluster.sh starts the
// test cluster: a Unix socket only, fsync off) with an empty database,
// and stops and deletes it when the test ends. It takes a few seconds.
func NewCluster(tb testing.TB) *Cluster {
	tb.Helper()
	return newCluster(tb, "")
}

// newCluster is NewCluster with opts given to every start of the server.
func newCluster(tb testing.TB, opts string) *Cluster {
	tb.Helper()
	c := emptyCluster(tb)
	c.opts = opts
	if out, err := c.asOwner(filepath.Join(c.bin, "initdb"), "-D", c.data, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--locale=C").CombinedOutput(); err != nil {
		tb.Fatalf("dbtest: initdb: %v\n%s", err, out)
	}
	c.Start()
	admin := fmt.Sprintf("postgres://postgres@/postgres?host=%s&sslmode=disable", c.dir)
	ctx := context.Background()
	pool, err := db.Open(ctx, admin, db.PoolConfig{MaxConns: 1})
	if err != nil {
		tb.Fatalf("dbtest: %v", err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, "CREATE DATABASE herald"); err != nil {
		tb.Fatalf("dbtest: create database: %v", err)
	}
	c.URL = fmt.Sprintf("postgres://postgres@/herald?host=%s&sslmode=disable", c.dir)
	return c
}

// emptyCluster makes the directory of a cluster with no data yet, owned by
// the postgres user when root, deleted (the server stopped first) when the
// test ends.
func emptyCluster(tb testing.TB) *Cluster {
	tb.Helper()
	bin, err := db.PostgresBin()
	if err != nil {
		tb.Fatalf("dbtest: %v", err)
	}
	parent := "/dev/shm"
	if _, err := os.Stat(parent); err != nil {
		parent = os.TempDir()
	}
	dir, err := os.MkdirTemp(parent, "herald-pg-")
	if err != nil {
		tb.Fatalf("dbtest: %v", err)
	}
	c := &Cluster{tb: tb, dir: dir, bin: bin, data: filepath.Join(dir, "data")}
	tb.Cleanup(func() {
		_ = c.pgctl("stop", "-m", "immediate")
		_ = os.RemoveAll(dir)
	})
	if err := c.own(dir); err != nil {
		tb.Fatalf("dbtest: %v", err)
	}
	return c
}

// Pool opens a pool on the cluster's database, closed when the test ends.
func (c *Cluster) Pool() *pgxpool.Pool {
	c.tb.Helper()
	pool, err := db.Open(context.Background(), c.URL, db.PoolConfig{MaxConns: 4})
	if err != nil {
		c.tb.Fatalf("dbtest: %v", err)
	}
	c.tb.Cleanup(pool.Close)
	return pool
}

// Start starts the stopped cluster and waits until it takes connections.
func (c *Cluster) Start() {
	c.tb.Helper()
	opts := fmt.Sprintf("-k %s -c listen_addresses='' -c max_connections=200 -c fsync=off -c full_page_writes=off %s", c.dir, c.opts)
	if err := c.pgctl("start", "-l", filepath.Join(c.dir, "server.log"), "-w", "-t", "60", "-o", opts); err != nil {
		log, _ := os.ReadFile(filepath.Join(c.dir, "server.log"))
		c.tb.Fatalf("dbtest: start cluster: %v\n%s", err, log)
	}
}

// Stop stops the cluster the way `pg_ctl stop -m fast` does: sessions are
// ended, transactions in progress roll back, committed ones are kept.
func (c *Cluster) Stop() {
	c.tb.Helper()
	if err := c.pgctl("stop", "-m", "fast", "-w"); err != nil {
		c.tb.Fatalf("dbtest: stop cluster: %v", err)
	}
}

// Kill stops the cluster the way a crash of its machine does (`pg_ctl
// stop -m immediate`): every process exits at once, without a checkpoint,
// and whatever its standbys had not received is theirs never to receive.
func (c *Cluster) Kill() {
	c.tb.Helper()
	if err := c.pgctl("stop", "-m", "immediate", "-w"); err != nil {
		c.tb.Fatalf("dbtest: kill cluster: %v", err)
	}
}

// Restart is `pg_ctl restart -m fast`.
func (c *Cluster) Restart() {
	c.tb.Helper()
	c.Stop()
	c.Start()
}

// Backup takes a base backup of the running cluster (pg_basebackup -X
// stream, over its Unix socket, after a fast checkpoint) into a cluster of
// its own, not started: Start then restores the database as it was when
// the backup ended, as a restore of that backup, or a point-in-time
// recovery to that moment, would. Its URL names its database herald; it is
// stopped and deleted when the test ends.
func (c *Cluster) Backup() *Cluster {
	c.tb.Helper()
	return c.basebackup("")
}

// basebackup copies the running cluster into a new one with
// pg_basebackup, connecting with conninfo added to the connection string
// and given args (-R to make the copy a standby).
func (c *Cluster) basebackup(conninfo string, args ...string) *Cluster {
	c.tb.Helper()
	b := emptyCluster(c.tb)
	b.opts = c.opts
	argv := append([]string{"-d", fmt.Sprintf("host=%s user=postgres %s", c.dir, conninfo),
		"-D", b.data, "-X", "stream", "-c", "fast"}, args...)
	if out, err := b.asOwner(filepath.Join(b.bin, "pg_basebackup"), argv...).CombinedOutput(); err != nil {
		c.tb.Fatalf("dbtest: pg_basebackup: %v\n%s", err, out)
	}
	b.URL = fmt.Sprintf("postgres://postgres@/herald?host=%s&sslmode=disable", b.dir)
	return b
}

func (c *Cluster) pgctl(args ...string) error {
	args = append([]string{"-D", c.data}, args...)
	out, err := c.asOwner(filepath.Join(c.bin, "pg_ctl"), args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("pg_ctl %s: %w: %s", strings.Join(args, " "), err, out)
	}
	return nil
}

// asOwner runs a PostgreSQL program as the cluster's owner: PostgreSQL
// refuses to run as root, so as root that is the postgres user.
func (c *Cluster) asOwner(name string, args ...string) *exec.Cmd {
	if os.Getuid() == 0 {
		return exec.Command("runuser", append([]string{"-u", "postgres", "--", name}, args...)...)
	}
	return exec.Command(name, args...)
}

// own hands dir to the postgres user when the test runs as root.
func (c *Cluster) own(dir string) error {
	if os.Getuid() != 0 {
		return nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return fmt.Errorf("running as root with no postgres user to own a cluster: %w", err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return os.Chown(dir, uid, gid)
}
