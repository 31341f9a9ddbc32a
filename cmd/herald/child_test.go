package main

import (
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// child is a Herald in a process of its own, so that a test can kill it,
// stop it with a signal, or measure its memory and files: this test binary
// re-executed as `herald`, or another build of Herald.
type child struct {
	cmd *exec.Cmd
	out *syncBuffer
}

// asHerald is the command line that re-executes this test binary as
// `herald` with args (TestMain runs it so when childEnv is set).
func asHerald(args ...string) []string { return append([]string{os.Args[0]}, args...) }

// startChild runs argv with vars as its whole environment (plus PATH, HOME
// and childEnv), keeps its output, logged if the test fails, and kills it
// when the test ends.
func startChild(t *testing.T, argv []string, vars map[string]string) *child {
	t.Helper()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = []string{childEnv + "=1", "PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME")}
	for k, v := range vars {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	c := &child{cmd: cmd, out: &syncBuffer{}}
	cmd.Stdout, cmd.Stderr = c.out, c.out
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("%s output:\n%s", strings.Join(argv, " "), c.out.String())
		}
	})
	return c
}

// base waits for the child to say where it listens and returns that URL.
func (c *child) base(t *testing.T) string {
	t.Helper()
	var base string
	require.Eventually(t, func() bool {
		if m := listeningLine.FindStringSubmatch(c.out.String()); m != nil {
			base = m[1]
		}
		return base != ""
	}, time.Minute, 20*time.Millisecond, "%v never said where it listens:\n%s", c.cmd.Args, c.out)
	return base
}
