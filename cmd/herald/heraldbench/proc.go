package heraldbench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/heraldpush/herald/db"
)

// processCPU is a process's user and system CPU so far, from /proc.
func processCPU(pid int) (time.Duration, error) {
	st, err := readProcStat(pid)
	if err != nil {
		return 0, fmt.Errorf("read process CPU: %w", err)
	}
	return st.own, nil
}

// procStat is what /proc/PID/stat says of a process's CPU.
type procStat struct {
	ppid int
	// own is the process's CPU; children that of its children it has
	// reaped.
	own, children time.Duration
}

func readProcStat(pid int) (procStat, error) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return procStat{}, err
	}
	// Fields after the command name, which is in parentheses and may hold spaces.
	fields := strings.Fields(string(raw[bytes.LastIndexByte(raw, ')')+2:]))
	if len(fields) < 15 {
		return procStat{}, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(fields))
	}
	n := func(i int) int64 { v, _ := strconv.ParseInt(fields[i], 10, 64); return v }
	// The kernel counts in clock ticks of 1/100 s (USER_HZ) on Linux.
	const tick = 10 * time.Millisecond
	return procStat{
		ppid:     int(n(1)),
		own:      time.Duration(n(11)+n(12)) * tick,
		children: time.Duration(n(13)+n(14)) * tick,
	}, nil
}

// clusterCPU returns a reader of the CPU the PostgreSQL cluster behind
// pool has used: its postmaster's and every child's, running or reaped. It
// is nil when the server is not a process of this host that can be read (a
// remote database, or its data directory closed to this user).
func clusterCPU(ctx context.Context, pool db.DBTX) func() (time.Duration, error) {
	dir, err := db.On(pool).DataDirectory(ctx)
	if err != nil {
		return nil
	}
	raw, err := os.ReadFile(filepath.Join(dir, "postmaster.pid"))
	if err != nil {
		return nil
	}
	pid, err := strconv.Atoi(strings.TrimSpace(strings.SplitN(string(raw), "\n", 2)[0]))
	if err != nil {
		return nil
	}
	if _, err := readProcStat(pid); err != nil {
		return nil
	}
	return func() (time.Duration, error) {
		pm, err := readProcStat(pid)
		if err != nil {
			return 0, fmt.Errorf("read PostgreSQL's CPU: %w", err)
		}
		total := pm.own + pm.children
		entries, err := os.ReadDir("/proc")
		if err != nil {
			return 0, fmt.Errorf("read PostgreSQL's CPU: %w", err)
		}
		for _, e := range entries {
			child, err := strconv.Atoi(e.Name())
			if err != nil {
				continue
			}
			// A process may end between the listing and the read: its
			// CPU then moves to the postmaster's reaped children, and the
			// next reading counts it.
			if st, err := readProcStat(child); err == nil && st.ppid == pid {
				total += st.own
			}
		}
		return total, nil
	}
}

// peakRSS is a process's peak resident set, in MiB.
func peakRSS(pid int) (float64, error) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, fmt.Errorf("read process memory: %w", err)
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 64)
			return round1(kb / 1024), err
		}
	}
	return 0, errors.New("no VmHWM in /proc status")
}

// selfCPU is this process's CPU so far.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// machine describes where the figures came from.
func machine() string {
	model := "unknown CPU"
	if raw, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(raw), "\n") {
			if rest, ok := strings.CutPrefix(line, "model name"); ok {
				model = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(rest), ":"))
				break
			}
		}
	}
	return fmt.Sprintf("%d cores, %s", runtime.NumCPU(), model)
}

// cpuSpans reads Herald's and PostgreSQL's CPU at four marks: before the
// messages are scheduled (0), once they are (1), at their instant (2) and
// once they have settled (3). The sends' CPU is what the spans from 0 to 1
// and from 2 to 3 took: scheduling and the fan-out.
type cpuSpans struct {
	herald func() (time.Duration, error)
	// postgres is nil when the cluster is not a process of this host.
	postgres             func() (time.Duration, error)
	heraldAt, postgresAt [4]time.Duration
}

func (c *cpuSpans) markHerald(i int) (err error) {
	c.heraldAt[i], err = c.herald()
	return err
}

func (c *cpuSpans) markPostgres(i int) (err error) {
	if c.postgres == nil {
		return nil
	}
	c.postgresAt[i], err = c.postgres()
	return err
}

// perSend divides the spans' CPU among sends, in µs: Herald's, and
// PostgreSQL's when it was read.
func (c *cpuSpans) perSend(sends int) (herald float64, postgres *float64) {
	per := func(at [4]time.Duration) float64 {
		return round1(float64((at[1] - at[0] + at[3] - at[2]).Microseconds()) / float64(sends))
	}
	if c.postgres != nil {
		v := per(c.postgresAt)
		postgres = &v
	}
	return per(c.heraldAt), postgres
}
