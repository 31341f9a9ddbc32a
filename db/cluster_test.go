package db_test

import (
	"context"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestAttackLocalClusterRefusesOtherUsers is issue #26's item 11: the
// clusters db/cluster.sh runs (dev for make run, test for make test)
// listened on a world-accessible socket directory with trust for every
// local connection, so any user of the machine (nobody, in the report)
// connected as the superuser and read the device tokens. Now the socket's
// directory is the cluster owner's alone, and local connections are
// authenticated by peer, mapped to the postgres role for the owner and
// root only. The test checks the cluster of DATABASE_URL, which make test
// starts with the same script and the same code path as make run's dev
// cluster; with a DATABASE_URL of another server it has nothing to check.
func TestAttackLocalClusterRefusesOtherUsers(t *testing.T) {
	t.Parallel()
	u, err := url.Parse(os.Getenv("DATABASE_URL"))
	require.NoError(t, err)
	dir := u.Query().Get("host")
	if !filepath.IsAbs(dir) {
		t.Skip("DATABASE_URL does not name a Unix socket directory: not a cluster of db/cluster.sh")
	}
	info, err := os.Stat(dir)
	require.NoError(t, err)
	require.Zero(t, info.Mode().Perm()&0o077, "the socket directory %s is %s: others can reach the socket", dir, info.Mode().Perm())

	// As another user of the machine: refused, whatever the directory.
	if os.Geteuid() != 0 {
		return // only root can act as another user
	}
	if _, err := user.Lookup("nobody"); err != nil {
		t.Skip("no user nobody to act as")
	}
	psql, err := exec.LookPath("psql")
	if err != nil {
		t.Skip("no psql to connect with")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// The attack as reported: psql as nobody, the superuser asked for.
	out, err := exec.CommandContext(ctx, "runuser", "-u", "nobody", "--", psql,
		"-h", dir, "-U", "postgres", "-d", "postgres", "-tAc", "SELECT 1").CombinedOutput()
	require.Error(t, err, "user nobody connected as postgres: %s", out)
}
