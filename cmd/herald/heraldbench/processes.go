package heraldbench

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/heraldpush/herald/api/client"
	"github.com/heraldpush/herald/jobs/push/fake"
)

// self runs this binary as `herald args...` in a process of its own.
func (b *Benchmark) self(ctx context.Context, env []string, args ...string) (*exec.Cmd, *lineReader, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, nil, err
	}
	cmd := exec.CommandContext(ctx, exe, args...)
	cmd.Env = append(slices.Clip(env), b.ChildEnv...)
	cmd.Stderr = b.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, nil, err
	}
	b.cleanups = append(b.cleanups, func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
	})
	return cmd, newLineReader(out), nil
}

func (b *Benchmark) startFakepush(ctx context.Context) error {
	dir, err := os.MkdirTemp("", "herald-bench-fakepush-")
	if err != nil {
		return err
	}
	b.cleanups = append(b.cleanups, func() { os.RemoveAll(dir) })
	args := []string{"fakepush", "--addr", "127.0.0.1:0", "--tls-dir", dir,
		"--latency", b.Config.Latency.String(), "--decrypt-one-in", strconv.Itoa(b.Config.DecryptOneIn)}
	if names := b.extraApps(); len(names) > 0 {
		args = append(args, "--apps", strings.Join(names, ","))
	}
	_, lines, err := b.self(ctx, os.Environ(), args...)
	if err != nil {
		return fmt.Errorf("start fakepush: %w", err)
	}
	if _, err := lines.waitFor(regexp.MustCompile(`fakepush listening on (\S+)`), 30*time.Second); err != nil {
		return fmt.Errorf("fakepush: %w", err)
	}
	raw, err := os.ReadFile(filepath.Join(dir, "env"))
	if err != nil {
		return err
	}
	b.fakeEnv = fake.ParseEnvFile(raw)
	b.fakeURL = b.fakeEnv["APNS_HOST"]
	ca, err := os.ReadFile(b.fakeEnv["SSL_CERT_FILE"])
	if err != nil {
		return err
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca)
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = &tls.Config{RootCAs: pool}
	tr.MaxIdleConnsPerHost = 16
	// fakepush's view of a run lists every push it took (/_receipts):
	// about 250 bytes a device, which ten million devices took more than
	// 30 s to list and read. The bound grows with the population (2.5
	// devices a user).
	devices := int64(b.Config.Users) * 5 / 2 * int64(b.Config.messages())
	b.fakeHTTP = &http.Client{Transport: tr, Timeout: 30*time.Second + time.Duration(devices)*20*time.Microsecond}
	for _, name := range b.extraApps() {
		raw, err := os.ReadFile(filepath.Join(dir, "apps", name, "app.json"))
		if err != nil {
			return fmt.Errorf("fakepush's app %s: %w", name, err)
		}
		var a fake.App
		if err := json.Unmarshal(raw, &a); err != nil {
			return fmt.Errorf("fakepush's app %s: %w", name, err)
		}
		b.fakeApps = append(b.fakeApps, a)
	}
	b.Progress("fakepush at %s, %s round trip", b.fakeURL, b.Config.Latency)
	return nil
}

func (b *Benchmark) startHerald(ctx context.Context, dbURL string) error {
	b.apiKey = "bench-key-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	env := []string{"PATH=" + b.Getenv("PATH"), "DATABASE_URL=" + dbURL, "HERALD_API_KEYS=" + b.apiKey, "HERALD_LOG_LEVEL=warn",
		"HERALD_SECRET_KEY=" + randomSealKey()}
	for k, v := range b.fakeEnv {
		env = append(env, k+"="+v)
	}
	for _, k := range benchTuning {
		if v := b.Getenv(k); v != "" {
			env = append(env, k+"="+v)
		}
	}
	args := []string{"serve", "--migrate", "--addr", "127.0.0.1:0"}
	if b.Config.ProfileDir != "" {
		if err := os.MkdirAll(b.Config.ProfileDir, 0o755); err != nil {
			return err
		}
		args = append(args, "--cpuprofile", filepath.Join(b.Config.ProfileDir, "herald.cpu.pprof"),
			"--memprofile", filepath.Join(b.Config.ProfileDir, "herald.heap.pprof"))
	}
	serveEnv := env
	if b.Config.UrgentWorker {
		serveEnv = append(slices.Clip(env), "HERALD_LANES=bulk")
	}
	if b.Config.Workers > 0 {
		args = append(args, "--role", "api")
	}
	p, err := b.startServe(ctx, serveEnv, args...)
	if err != nil {
		return err
	}
	b.heralds = append(b.heralds, p)
	b.herald, b.base = p.cmd, p.base
	if b.api, err = client.NewClientWithResponses(b.base, client.WithAPIKey(b.apiKey)); err != nil {
		return err
	}
	b.Progress("herald at %s (pid %d)", b.base, p.cmd.Process.Pid)
	// The others after the first has migrated the database.
	if b.Config.UrgentWorker {
		worker, err := b.startServe(ctx, append(slices.Clip(env), "HERALD_LANES=urgent"), "serve", "--role", "worker", "--addr", "127.0.0.1:0")
		if err != nil {
			return err
		}
		b.heralds = append(b.heralds, worker)
		b.Progress("herald urgent-lane worker (pid %d)", worker.cmd.Process.Pid)
	}
	for range b.Config.Workers {
		worker, err := b.startServe(ctx, env, "serve", "--role", "worker", "--addr", "127.0.0.1:0")
		if err != nil {
			return err
		}
		b.heralds = append(b.heralds, worker)
		b.Progress("herald worker (pid %d)", worker.cmd.Process.Pid)
	}
	return b.startStatusReader(ctx, env)
}

// startServe starts a Herald process and waits until it listens.
func (b *Benchmark) startServe(ctx context.Context, env []string, args ...string) (heraldProcess, error) {
	cmd, lines, err := b.self(ctx, env, args...)
	if err != nil {
		return heraldProcess{}, fmt.Errorf("start herald: %w", err)
	}
	m, err := lines.waitFor(ListeningLine, time.Minute)
	if err != nil {
		return heraldProcess{}, fmt.Errorf("herald %s: %w", strings.Join(args, " "), err)
	}
	return heraldProcess{cmd: cmd, base: m[1]}, nil
}

// heraldProcess is a Herald process of the run and where it listens.
type heraldProcess struct {
	cmd  *exec.Cmd
	base string
}

// heraldCPU is the CPU time of every Herald process of the run.
func (b *Benchmark) heraldCPU() (time.Duration, error) {
	var total time.Duration
	for _, h := range b.heralds {
		cpu, err := processCPU(h.cmd.Process.Pid)
		if err != nil {
			return 0, err
		}
		total += cpu
	}
	return total, nil
}

// stopHerald ends the Herald process cleanly, which writes its profiles.
func (b *Benchmark) stopHerald() error {
	if err := b.herald.Process.Signal(syscall.SIGTERM); err != nil {
		return err
	}
	done := make(chan error, 1)
	go func() { done <- b.herald.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			return fmt.Errorf("herald did not exit cleanly on SIGTERM: %w", err)
		}
		return nil
	case <-time.After(30 * time.Second):
		_ = b.herald.Process.Kill()
		return errors.New("herald did not stop within 30 s of SIGTERM")
	}
}

// ListeningLine is what `herald serve` prints once it accepts connections,
// its first group the base URL; the tests that start Herald wait for it too.
var ListeningLine = regexp.MustCompile(`listening on (http://\S+)`)

// lineReader scans a child's stdout in the background, so that the test
// can wait for a line while the child keeps writing.
type lineReader struct {
	mu    sync.Mutex
	lines []string
	added chan struct{}
}

func newLineReader(r io.Reader) *lineReader {
	lr := &lineReader{added: make(chan struct{}, 1)}
	go func() {
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			lr.mu.Lock()
			lr.lines = append(lr.lines, sc.Text())
			lr.mu.Unlock()
			select {
			case lr.added <- struct{}{}:
			default:
			}
		}
	}()
	return lr
}

func (lr *lineReader) waitFor(re *regexp.Regexp, within time.Duration) ([]string, error) {
	deadline := time.After(within)
	seen := 0
	for {
		lr.mu.Lock()
		for ; seen < len(lr.lines); seen++ {
			if m := re.FindStringSubmatch(lr.lines[seen]); m != nil {
				lr.mu.Unlock()
				return m, nil
			}
		}
		lr.mu.Unlock()
		select {
		case <-lr.added:
		case <-deadline:
			return nil, fmt.Errorf("no line matching %q within %s", re, within)
		}
	}
}

// workerProcesses is how many of the run's Herald processes work chunks:
// all of them but the API process of --workers.
func (b *Benchmark) workerProcesses() int {
	if b.Config.Workers > 0 {
		return b.Config.Workers
	}
	return len(b.heralds)
}
