package fake

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"
)

// childArg is the first argument after "--" that makes a test binary serve
// fakepush as a benchmark's child process.
const childArg = "fakepush-child"

// childReady is the line a child prints once it accepts connections.
const childReady = "fakepush-ready"

// Child is a fakepush running in another process: the running test binary,
// re-executed. Benchmarks use one so that the client and the server each keep
// their own CPU account, while still sharing the machine's cores as Herald and
// fakepush do in `herald bench`.
type Child struct {
	// Env is what the child wrote to DIR/env.
	Env   map[string]string
	pool  *x509.CertPool
	cmd   *exec.Cmd
	stdin io.WriteCloser
}

// StartChild re-executes the running test binary so that its test named
// testName (which must call ServeChild) serves fakepush from dir, waits until
// it accepts connections, and returns it. decryptOneIn is Config.DecryptOneIn.
func StartChild(testName, dir string, decryptOneIn int) (*Child, error) {
	cmd := exec.Command(os.Args[0], "-test.run=^"+testName+"$", "--", childArg, dir, strconv.Itoa(decryptOneIn))
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	c := &Child{cmd: cmd, stdin: stdin}
	lines := bufio.NewScanner(stdout)
	ready := false
	for !ready && lines.Scan() {
		ready = lines.Text() == childReady
	}
	if !ready {
		_ = c.Stop() // the error that made it stop is the one to return
		return nil, fmt.Errorf("fakepush child exited before it was ready: %w", lines.Err())
	}
	// The test framework prints its verdict when the child exits; nobody reads it.
	go func() { _, _ = io.Copy(io.Discard, stdout) }()
	data, err := os.ReadFile(filepath.Join(dir, fileEnv))
	if err != nil {
		_ = c.Stop() // the error that made it stop is the one to return
		return nil, err
	}
	c.Env = ParseEnvFile(data)
	ca, err := os.ReadFile(c.Env[EnvSSLCertFile])
	if err != nil {
		_ = c.Stop() // the error that made it stop is the one to return
		return nil, err
	}
	c.pool = x509.NewCertPool()
	c.pool.AppendCertsFromPEM(ca)
	return c, nil
}

// CertPool returns a pool holding the child's CA, for a client's RootCAs.
func (c *Child) CertPool() *x509.CertPool { return c.pool.Clone() }

// HTTPClient returns a client that trusts the child's CA, for its control
// endpoints.
func (c *Child) HTTPClient() *http.Client {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.TLSClientConfig = &tls.Config{RootCAs: c.pool.Clone()}
	t.ForceAttemptHTTP2 = true
	return &http.Client{Transport: t}
}

// Stop ends the child, which exits when its stdin closes, and waits for it.
func (c *Child) Stop() error {
	c.stdin.Close()
	return c.cmd.Wait()
}

// ServeChild is the child's half of StartChild. Given the test binary's
// flag.Args(), it reports false at once unless StartChild wrote them; otherwise
// it serves fakepush until its stdin closes.
func ServeChild(args []string) (bool, error) {
	if len(args) != 3 || args[0] != childArg {
		return false, nil
	}
	decryptOneIn, err := strconv.Atoi(args[2])
	if err != nil {
		return true, fmt.Errorf("fakepush child: decrypt one in: %w", err)
	}
	srv, err := New(Config{Addr: "127.0.0.1:0", TLSDir: args[1], DecryptOneIn: decryptOneIn})
	if err != nil {
		return true, err
	}
	if err := srv.Start(context.Background()); err != nil {
		return true, err
	}
	fmt.Println(childReady)
	_, _ = io.Copy(io.Discard, os.Stdin) // until the parent closes it
	return true, errors.Join(srv.Close())
}

// ProcessCPU returns the CPU time, user plus system, that this process has
// used, so that a benchmark can report its own share beside fakepush's.
func ProcessCPU() time.Duration { return time.Duration(processCPU()) }
