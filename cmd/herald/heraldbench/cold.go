package heraldbench

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"syscall"

	"github.com/heraldpush/herald/db"
)

// coldCaches restarts the PostgreSQL server the bench runs on, and drops
// the operating system's page cache where the bench may (as root), so that
// the measured instant meets caches as cold as after a restart of the
// database or a night of other work: nothing of the messages' ledger or
// devices in PostgreSQL's buffers, and, with the page cache dropped,
// nothing in memory at all. It needs the server on this machine and the
// rights to run pg_ctl as its owner. It says what it could not do rather
// than failing: a warm page cache still shows PostgreSQL's buffers cold.
func (b *Benchmark) coldCaches(ctx context.Context, pool db.DBTX) (string, error) {
	dir, err := db.On(pool).DataDirectory(ctx)
	if err != nil {
		return "", fmt.Errorf("--cold: the server's data directory: %w", err)
	}
	dirBin, err := db.PostgresBin()
	if err != nil {
		return "", fmt.Errorf("--cold: %w", err)
	}
	bin := filepath.Join(dirBin, "pg_ctl")
	args := []string{"restart", "-D", dir, "-m", "fast", "-w"}
	cmd := exec.CommandContext(ctx, bin, args...)
	if os.Getuid() == 0 {
		cmd = exec.CommandContext(ctx, "runuser", append([]string{"-u", ownerOf(dir), "--", bin}, args...)...)
	}
	// The restarted server keeps pg_ctl's output as its log: a file, so
	// that nothing waits on a pipe the server holds open.
	log, err := os.CreateTemp("", "herald-bench-postgres-*.log")
	if err != nil {
		return "", err
	}
	defer log.Close()
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("--cold: pg_ctl restart (log in %s): %w", log.Name(), err)
	}
	syscall.Sync()
	if err := os.WriteFile("/proc/sys/vm/drop_caches", []byte("3"), 0); err != nil {
		return "PostgreSQL restarted; the page cache kept (" + err.Error() + ")", nil
	}
	return "PostgreSQL restarted and the page cache dropped", nil
}

// ownerOf is the name of the user that owns dir, "postgres" if it cannot
// be told.
func ownerOf(dir string) string {
	var st syscall.Stat_t
	if err := syscall.Stat(dir, &st); err == nil {
		if u, err := user.LookupId(strconv.Itoa(int(st.Uid))); err == nil {
			return u.Username
		}
	}
	return "postgres"
}
