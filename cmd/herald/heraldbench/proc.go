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
	st := procStat{
		ppid:     int(n(1)),
		own:      time.Duration(n(11)+n(12)) * tick,
		children: time.Duration(n(13)+n(14)) * tick,
	}
	return st, nil
}

// threadCPU is the CPU of a single-threaded process (a PostgreSQL
// backend), in nanoseconds from /proc/PID/schedstat where the kernel has
// it (a backend's share of a small message is a few ticks, which rounding
// would blur), else in ticks. schedstat counts the main thread only, so
// it is not for Go processes.
func threadCPU(pid int) (time.Duration, error) {
	if raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/schedstat", pid)); err == nil {
		if ns, err := strconv.ParseInt(strings.Fields(string(raw) + " x")[0], 10, 64); err == nil {
			return time.Duration(ns), nil
		}
	}
	st, err := readProcStat(pid)
	return st.own, err
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
		// A backend that ends while its siblings are read would be counted
		// nowhere (gone from the listing, not yet among the reaped) or
		// twice: its whole life's CPU, which made a span negative when
		// Herald's connections closed at the last mark. So the reading is
		// taken again until no child was reaped during it.
		for range 10 {
			before, err := readProcStat(pid)
			if err != nil {
				return 0, fmt.Errorf("read PostgreSQL's CPU: %w", err)
			}
			live, err := childrenCPU(pid)
			if err != nil {
				return 0, err
			}
			after, err := readProcStat(pid)
			if err != nil {
				return 0, fmt.Errorf("read PostgreSQL's CPU: %w", err)
			}
			if after.children != before.children {
				continue
			}
			// Children that ended are counted in ticks, the rest to the
			// nanosecond (threadCPU).
			total := after.children + live
			if own, err := threadCPU(pid); err == nil {
				total += own
			}
			return total, nil
		}
		return 0, errors.New("read PostgreSQL's CPU: its backends kept ending while they were read")
	}
}

// childrenCPU is the CPU of the running children of the process pid.
func childrenCPU(pid int) (time.Duration, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0, fmt.Errorf("read PostgreSQL's CPU: %w", err)
	}
	var total time.Duration
	for _, e := range entries {
		child, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if st, err := readProcStat(child); err == nil && st.ppid == pid {
			if own, err := threadCPU(child); err == nil {
				total += own
			}
		}
	}
	return total, nil
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

// backendsCPU returns a reader of the CPU of each PostgreSQL backend
// serving a connection named application (application_name), by process
// id. It is nil when the cluster is not a process of this host.
func backendsCPU(pool db.DBTX, cluster func() (time.Duration, error), application string) func(context.Context) (map[int32]time.Duration, error) {
	if cluster == nil {
		return nil
	}
	return func(ctx context.Context) (map[int32]time.Duration, error) {
		pids, err := db.On(pool).BackendPIDs(ctx, application)
		if err != nil {
			return nil, fmt.Errorf("read the backends of %s: %w", application, err)
		}
		cpu := make(map[int32]time.Duration, len(pids))
		for _, pid := range pids {
			// A backend that ended since the listing used nothing more.
			if own, err := threadCPU(int(pid)); err == nil {
				cpu[pid] = own
			}
		}
		return cpu, nil
	}
}

// The marks of cpuSpans, in the order a message's life passes them.
const (
	markBefore    = iota // before the messages are scheduled
	markScheduled        // once they are
	markInstant          // at their instant
	markSettled          // once every one has settled
	markCleaned          // once the cleanup they left is done
	// markReleased is, in a --preferences run, when the quiet hours of the
	// users held at the instant end, between markInstant and markSettled;
	// not taken when the messages settled first.
	markReleased
	marks
)

// cpuSpans reads Herald's and PostgreSQL's CPU at the marks of a message's
// life. The sends' CPU (cpu_us_per_send, postgres_cpu_us_per_send) is what
// the spans from markBefore to markScheduled and from markInstant to
// markSettled took: scheduling and the fan-out. PostgreSQL's share over
// the whole life (postgresShare) adds the wait for the instant and the
// cleanup, and tells the status reads apart by their backends.
type cpuSpans struct {
	herald func() (time.Duration, error)
	// postgres and status are nil when the cluster is not a process of this
	// host.
	postgres func() (time.Duration, error)
	status   func(context.Context) (map[int32]time.Duration, error)
	// wal reads the cluster's WAL position, in bytes; nil reads none.
	wal        func(context.Context) (int64, error)
	walAt      [marks]int64
	heraldAt   [marks]time.Duration
	postgresAt [marks]time.Duration
	statusAt   [marks]map[int32]time.Duration
	// released says markReleased was taken.
	released bool
}

func (c *cpuSpans) markHerald(i int) (err error) {
	c.heraldAt[i], err = c.herald()
	return err
}

func (c *cpuSpans) markPostgres(ctx context.Context, i int) (err error) {
	if c.wal != nil {
		if c.walAt[i], err = c.wal(ctx); err != nil {
			return err
		}
	}
	if c.postgres == nil {
		return nil
	}
	if c.statusAt[i], err = c.status(ctx); err != nil {
		return err
	}
	c.postgresAt[i], err = c.postgres()
	return err
}

// statusCPU is the status reads' backends' CPU between marks from and to:
// a backend first seen at to began inside the span and counts whole.
func (c *cpuSpans) statusCPU(from, to int) time.Duration {
	var sum time.Duration
	for pid, cpu := range c.statusAt[to] {
		sum += cpu - c.statusAt[from][pid]
	}
	return sum
}

// postgresCPU is the cluster's CPU between marks from and to, less the
// status reads'.
func (c *cpuSpans) postgresCPU(from, to int) time.Duration {
	return c.postgresAt[to] - c.postgresAt[from] - c.statusCPU(from, to)
}

// both is Herald's and PostgreSQL's CPU between marks from and to (less
// the status reads'), and false when PostgreSQL's was not read.
func (c *cpuSpans) both(from, to int) (time.Duration, bool) {
	return c.heraldAt[to] - c.heraldAt[from] + c.postgresCPU(from, to), c.postgres != nil
}

// perSend divides the spans' CPU among sends, in µs: Herald's, and
// PostgreSQL's (without the status reads, which the bench did not make
// before it counted them apart) when it was read.
func (c *cpuSpans) perSend(sends int) (herald float64, postgres *float64) {
	if c.postgres != nil {
		postgres = new(perDevice(c.postgresCPU(markBefore, markScheduled)+c.postgresCPU(markInstant, markSettled), sends))
	}
	return perDevice(c.heraldAt[markScheduled]-c.heraldAt[markBefore]+c.heraldAt[markSettled]-c.heraldAt[markInstant], sends), postgres
}

// walPerSend is the WAL the spans of perSend wrote, in bytes a send; nil
// when it was not read.
func (c *cpuSpans) walPerSend(sends int) *float64 {
	if c.wal == nil || sends == 0 {
		return nil
	}
	return new(round1(float64(c.walAt[markScheduled]-c.walAt[markBefore]+c.walAt[markSettled]-c.walAt[markInstant]) / float64(sends)))
}

// share is PostgreSQL's CPU over the messages' whole life, by part, per
// device sent to; nil when the cluster was not read.
func (c *cpuSpans) share(devices int) *postgresShare {
	if c.postgres == nil {
		return nil
	}
	// Summed span by span, as the other parts subtract it, so that the
	// parts add up to the total even if a backend ended in between.
	var status time.Duration
	for i := markBefore; i < markCleaned; i++ {
		status += c.statusCPU(i, i+1)
	}
	return &postgresShare{
		Schedule:    perDevice(c.postgresCPU(markBefore, markScheduled), devices),
		Wait:        perDevice(c.postgresCPU(markScheduled, markInstant), devices),
		Fanout:      perDevice(c.postgresCPU(markInstant, markSettled), devices),
		StatusReads: perDevice(status, devices),
		Cleanup:     perDevice(c.postgresCPU(markSettled, markCleaned), devices),
		Total:       perDevice(c.postgresAt[markCleaned]-c.postgresAt[markBefore], devices),
	}
}

// perDevice is cpu divided among n, in µs to a tenth.
func perDevice(cpu time.Duration, n int) float64 {
	return round1(float64(cpu.Microseconds()) / float64(n))
}
