package main

import (
	"context"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/heraldpush/herald/api/client"
	"github.com/heraldpush/herald/db/dbtest"
)

// walkthroughDocs are the docs whose shell blocks (```sh) make the
// walkthrough a newcomer runs beside `make run`, in the order they run: the
// README's quick start, then the API by example. No other doc may hold a
// shell block (TestDocShellBlocksAreRun), so every one of them is run.
var walkthroughDocs = []string{"README.md", "docs/api.md"}

// docShell returns the shell blocks of the doc at path (relative to the
// repository's root), in order, as one script.
func docShell(t *testing.T, path string) string {
	t.Helper()
	var script strings.Builder
	for _, block := range shellBlocks(t, path) {
		script.WriteString(block)
		script.WriteString("\n")
	}
	return script.String()
}

// walkthroughScript is the walkthrough: the shell blocks of every doc of
// walkthroughDocs, one doc after the other.
func walkthroughScript(t *testing.T) string {
	t.Helper()
	var script strings.Builder
	for _, doc := range walkthroughDocs {
		script.WriteString("# " + doc + "\n")
		script.WriteString(docShell(t, doc))
	}
	return script.String()
}

// runWalkthrough runs the walkthrough with bash in dir (where .dev/api-key
// must be), against the Herald at base and the fakepush at fakeURL, and
// returns what it printed. Every curl fails on a 4xx or 5xx, and the script
// stops at the first failing command.
func runWalkthrough(t *testing.T, dir, base, fakeURL string) string {
	t.Helper()
	script := "set -euo pipefail\n" +
		// Any curl the docs run, not only those through their api
		// function, must get what it asked for.
		"curl() { command curl --fail-with-body \"$@\"; }\n" +
		walkthroughScript(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-c", script)
	cmd.Dir = dir
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + dir, "HERALD_URL=" + base, "FAKEPUSH_URL=" + fakeURL}
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "the walkthrough of %v failed; its output:\n%s", walkthroughDocs, out)
	return string(out)
}

// TestAPIWalkthrough runs the walkthrough (the README's quick start, then
// docs/api.md) top to bottom against a live Herald wired to fakepush, as a
// newcomer would beside `make run`: every call must succeed, and the
// messages it sends must reach fakepush.
func TestAPIWalkthrough(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("bash"); err != nil {
		t.Skip("bash is not installed")
	}
	e := startE2E(t, map[string]string{"HERALD_SECRET_KEY": testSecretKey})
	dir := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(dir, ".dev"), 0o700))
	require.NoError(t, os.WriteFile(filepath.Join(dir, ".dev", "api-key"), []byte(testAPIKey+"\n"), 0o600))

	out := runWalkthrough(t, dir, e.base, e.fake.URL())
	require.Contains(t, out, `"member_count":2`)
	requireWalkthroughDelivered(t, e)
}

// requireWalkthroughDelivered checks what the walkthrough sent: its
// immediate messages settle with every device accepted.
func requireWalkthroughDelivered(t *testing.T, e *e2e) {
	t.Helper()
	var sent []client.MessageStatus
	require.Eventually(t, func() bool {
		sent = sent[:0]
		for _, m := range e.listMessages(client.ListMessagesParams{Limit: new(100)}) {
			if m.State == client.MessageStateDispatched {
				sent = append(sent, m)
			}
		}
		// The quick start's one, the API walkthrough's two at once and
		// its two to the apps; one for later, cancelled; one for tomorrow.
		return len(sent) == 5
	}, 30*time.Second, 50*time.Millisecond, "the walkthrough's messages did not settle")
	for _, m := range sent {
		require.Equal(t, m.Deliveries.Total, m.Deliveries.Accepted, "message %s: %+v", m.MessageID, m.Deliveries)
	}
}

// freeAddr returns a loopback address no one listens on now.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	return addr
}

// TestE2EMakeRun runs `make run` as a newcomer does (on a database of the
// test's, on free ports, with a state directory of its own), waits for its
// banner, which must come only once Herald answers /readyz, and runs the
// walkthrough (the README's quick start, then docs/api.md) against it as
// written. A second `make run` on the
// same state directory refuses without touching the first's files. Ctrl-C
// stops both processes.
func TestE2EMakeRun(t *testing.T) {
	t.Parallel()
	for _, tool := range []string{"make", "bash", "curl", "flock"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s is not installed", tool)
		}
	}
	tdb := dbtest.NewEmpty(t)
	dev := t.TempDir()
	addr, fpaddr := freeAddr(t), freeAddr(t)
	vars := []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME"), "DATABASE_URL=" + tdb.URL,
		"HERALD_ADDR=" + addr, "FAKEPUSH_ADDR=" + fpaddr, "DEV=" + dev, "GOFLAGS=" + os.Getenv("GOFLAGS")}
	for _, k := range []string{"GOCACHE", "GOMODCACHE", "GOPATH", "GOPROXY"} {
		if v := os.Getenv(k); v != "" {
			vars = append(vars, k+"="+v)
		}
	}
	makeRun := func(ctx context.Context) *exec.Cmd {
		cmd := exec.CommandContext(ctx, "make", "-s", "run")
		cmd.Dir = "../.."
		cmd.Env = vars
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
		return cmd
	}
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	run := makeRun(ctx)
	var out syncBuffer
	run.Stdout, run.Stderr = &out, &out
	require.NoError(t, run.Start())
	// exited closes when make run has ended, with runErr its error.
	exited := make(chan struct{})
	var runErr error
	go func() { runErr = run.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = syscall.Kill(-run.Process.Pid, syscall.SIGKILL)
		<-exited
	})

	// The first build may take minutes; everything after it, seconds.
	select {
	case <-exited:
		t.Fatalf("make run ended before its banner (%v):\n%s", runErr, out.String())
	case <-waitFor(func() bool { return strings.Contains(out.String(), "API key:") }):
	}
	resp, err := http.Get("http://" + addr + "/readyz")
	require.NoError(t, err, "the banner came before Herald answered")
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)

	// A second make run on the same state refuses, and the first's
	// fakepush env is still there.
	second := makeRun(ctx)
	secondOut, err := second.CombinedOutput()
	require.Error(t, err)
	require.Contains(t, string(secondOut), "another make run is using")
	require.FileExists(t, filepath.Join(dev, "fakepush", "env"))

	dir := t.TempDir()
	require.NoError(t, os.Symlink(dev, filepath.Join(dir, ".dev")))
	runWalkthrough(t, dir, "http://"+addr, "https://"+fpaddr)

	// Ctrl-C: the whole process group gets SIGINT, as from a terminal.
	require.NoError(t, syscall.Kill(-run.Process.Pid, syscall.SIGINT))
	select {
	case <-exited:
	case <-time.After(30 * time.Second):
		t.Fatalf("make run did not stop on SIGINT:\n%s", out.String())
	}
	for _, a := range []string{addr, fpaddr} {
		conn, err := net.DialTimeout("tcp", a, time.Second)
		if err == nil {
			conn.Close()
		}
		require.Error(t, err, "%s still answers after make run stopped", a)
	}
}

// waitFor closes the returned channel once cond holds, polling.
func waitFor(cond func() bool) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		for !cond() {
			time.Sleep(50 * time.Millisecond)
		}
		close(done)
	}()
	return done
}
