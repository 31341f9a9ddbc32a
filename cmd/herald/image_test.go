package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/heraldpush/herald/api/client"
	"github.com/heraldpush/herald/db/dbtest"
)

// hostCABundle is the CA bundle the image carries, as `make image` copies
// it from the build host.
const hostCABundle = "/etc/ssl/certs/ca-certificates.crt"

// TestE2EImage builds the container image as `make image` does (a static
// binary and deploy/image/Containerfile, with buildah and no daemon),
// unpacks it with umoci and runs what it holds: `herald migrate`, then
// `herald serve`, then a schedule in Europe/Berlin, whose runs only come out
// right if the zone database is in the binary, since the image has none. As
// root the binary runs chrooted into the unpacked root file system as the
// image's user, so that it sees only what the image holds; elsewhere it runs
// from there unconfined. It is slow (a build of its own), so -short skips
// it; make test/image installs the tools and runs it.
func TestE2EImage(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("the image test builds a binary and an image; it does not run with -short (make test/image runs it)")
	}
	for _, tool := range []string{"buildah", "umoci"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("!!! %s is missing: the image test is SKIPPED (apt-get install buildah umoci, or make test/image as root)", tool)
		}
	}
	if _, err := os.Stat(hostCABundle); err != nil {
		t.Skipf("!!! no CA bundle at %s to put in the image: the image test is SKIPPED (apt-get install ca-certificates)", hostCABundle)
	}
	tdb := dbtest.NewEmpty(t)
	dir := t.TempDir()

	// The build context, as `make image/context` fills bin/image.
	ctxDir := filepath.Join(dir, "context")
	require.NoError(t, os.MkdirAll(filepath.Join(ctxDir, "state"), 0o755))
	for _, f := range []string{"Containerfile", "passwd", "group"} {
		copyFile(t, filepath.Join("..", "..", "deploy", "image", f), filepath.Join(ctxDir, f))
	}
	copyFile(t, hostCABundle, filepath.Join(ctxDir, "ca-certificates.crt"))
	build := exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w -X main.version=image-test", "-o", filepath.Join(ctxDir, "herald"), ".")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	out, err := build.CombinedOutput()
	require.NoError(t, err, "static build:\n%s", out)

	// A store of the test's own (vfs: nothing to mount), so that the test
	// leaves nothing in the host's and needs no overlay support.
	store := []string{"--root", filepath.Join(dir, "storage"), "--runroot", filepath.Join(dir, "run"), "--storage-driver", "vfs"}
	buildah := func(args ...string) ([]byte, error) {
		cmd := exec.Command("buildah", append(store, args...)...)
		cmd.Env = append(os.Environ(), "BUILDAH_ISOLATION=chroot")
		return cmd.CombinedOutput()
	}
	t.Cleanup(func() { _, _ = buildah("rmi", "--all", "--force") })
	start := time.Now()
	if out, err := buildah("build", "--isolation", "chroot", "-f", filepath.Join(ctxDir, "Containerfile"), "-t", "localhost/herald:image-test", ctxDir); err != nil {
		if os.Geteuid() != 0 {
			t.Skipf("!!! buildah cannot build here without root (%v): the image test is SKIPPED; make test/image as root runs it\n%s", err, out)
		}
		require.NoError(t, err, "buildah build:\n%s", out)
	}
	layout := filepath.Join(dir, "oci")
	out, err = buildah("push", "localhost/herald:image-test", "oci:"+layout+":herald")
	require.NoError(t, err, "buildah push:\n%s", out)
	bundle := filepath.Join(dir, "bundle")
	out, err = exec.Command("umoci", "unpack", "--rootless", "--image", layout+":herald", bundle).CombinedOutput()
	require.NoError(t, err, "umoci unpack:\n%s", out)
	rootfs := filepath.Join(bundle, "rootfs")
	t.Logf("image built, pushed and unpacked in %s: %.1f MB as stored (OCI layout, compressed), %.1f MB unpacked",
		time.Since(start).Round(100*time.Millisecond), float64(treeSize(t, layout))/1e6, float64(treeSize(t, rootfs))/1e6)

	// What the image holds and how it runs.
	info, err := os.Stat(filepath.Join(rootfs, "herald"))
	require.NoError(t, err)
	require.NotZero(t, info.Mode()&0o111, "the binary is not executable")
	require.Equal(t, readFile(t, hostCABundle), readFile(t, filepath.Join(rootfs, hostCABundle)))
	require.Contains(t, readFile(t, filepath.Join(rootfs, "etc", "passwd")), "herald:x:65532:65532:")
	_, err = os.Stat(filepath.Join(rootfs, "usr", "share", "zoneinfo"))
	require.ErrorIs(t, err, fs.ErrNotExist, "the image has a zone database: the test would not show that the binary's own is used")
	var spec struct {
		Process struct {
			User struct{ UID, GID uint32 }
			Args []string
			Env  []string
		}
	}
	require.NoError(t, json.Unmarshal([]byte(readFile(t, filepath.Join(bundle, "config.json"))), &spec))
	require.Equal(t, uint32(65532), spec.Process.User.UID, "the image runs as root")
	require.Equal(t, []string{"/herald", "serve"}, spec.Process.Args)
	require.Contains(t, spec.Process.Env, "HERALD_ADDR=:8080")

	image := imageRunner{t: t, rootfs: rootfs, chroot: os.Geteuid() == 0, databaseURL: tdb.URL}
	if image.chroot {
		// Chrooted, the binary cannot reach the test server's Unix socket:
		// it gets a TCP address of it.
		image.databaseURL = tcpDatabaseURL(t, tdb.URL)
	} else {
		t.Log("not root: the image's binary runs from its unpacked root without a chroot")
	}

	out, err = image.command(context.Background(), nil, "version").CombinedOutput()
	require.NoError(t, err, "herald version:\n%s", out)
	require.Contains(t, string(out), "image-test")
	out, err = image.command(context.Background(), nil, "migrate").CombinedOutput()
	require.NoError(t, err, "herald migrate:\n%s", out)

	base, serveOut := image.serve()
	res, err := http.Get(base + "/readyz")
	require.NoError(t, err)
	res.Body.Close()
	require.Equal(t, http.StatusOK, res.StatusCode, "/readyz:\n%s", serveOut)

	api, err := client.NewClientWithResponses(base, client.WithAPIKey(testAPIKey))
	require.NoError(t, err)
	created, err := api.CreateScheduleWithResponse(t.Context(), nil, client.NewSchedule{
		Cron: "0 9 * * *", Timezone: new("Europe/Berlin"), Audience: toUsers("ann"), Payload: titled("standup"),
	})
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, created.StatusCode(), "%s", created.Body)
	berlin, err := time.LoadLocation("Europe/Berlin")
	require.NoError(t, err)
	require.NotEmpty(t, created.JSON201.NextRuns)
	for _, run := range created.JSON201.NextRuns {
		local := run.In(berlin)
		require.Equal(t, "09:00", local.Format("15:04"), "run %s is not 09:00 in Berlin", run)
		_, offset := local.Zone()
		require.Contains(t, []int{3600, 7200}, offset, "run %s", run)
		require.Equal(t, 9*3600-offset, run.UTC().Hour()*3600, "run %s is not 09:00 Berlin in UTC", run)
	}
}

// imageRunner runs the unpacked image's binary.
type imageRunner struct {
	t           *testing.T
	rootfs      string
	chroot      bool
	databaseURL string
}

// command is the image's herald with args, with the image's environment
// (HERALD_ADDR), the test database's URL and vars.
func (r imageRunner) command(ctx context.Context, vars []string, args ...string) *exec.Cmd {
	env := append([]string{"HERALD_ADDR=:8080", "DATABASE_URL=" + r.databaseURL, "HERALD_LOG_FORMAT=text"}, vars...)
	if !r.chroot {
		cmd := exec.CommandContext(ctx, filepath.Join(r.rootfs, "herald"), args...)
		cmd.Env = env
		return cmd
	}
	cmd := exec.CommandContext(ctx, "/herald", args...)
	cmd.Env, cmd.Dir = env, "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: r.rootfs, Credential: &syscall.Credential{Uid: 65532, Gid: 65532}}
	return cmd
}

// serve starts the image's `herald serve` and returns its URL once it
// answers /healthz, and its output so far; it is stopped with SIGTERM at
// the end of the test and must exit cleanly.
func (r imageRunner) serve() (string, *syncBuffer) {
	t := r.t
	cmd := r.command(context.Background(), []string{"HERALD_API_KEYS=" + testAPIKey}, "serve", "--addr", "127.0.0.1:0")
	out := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	require.NoError(t, cmd.Start())
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-done:
			require.NoError(t, err, "herald serve did not exit cleanly on SIGTERM:\n%s", out)
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-done //nolint:errcheck // killed: its exit status says only that
			t.Errorf("herald serve did not stop within 30 s of SIGTERM:\n%s", out)
		}
		if t.Failed() {
			t.Logf("the image's herald serve:\n%s", out)
		}
	})
	var base string
	require.Eventually(t, func() bool {
		if m := listeningLine.FindStringSubmatch(out.String()); m != nil {
			base = m[1]
			res, err := http.Get(base + "/healthz")
			if err == nil {
				res.Body.Close()
				return res.StatusCode == http.StatusOK
			}
		}
		return false
	}, time.Minute, 50*time.Millisecond, "the image's herald serve did not answer /healthz:\n%s", out)
	return base, out
}

// tcpDatabaseURL returns a URL of the database at rawURL reached over TCP:
// rawURL itself when it is TCP already, else that of a proxy on 127.0.0.1
// to its Unix socket, which lives until the test ends.
func tcpDatabaseURL(t *testing.T, rawURL string) string {
	cfg, err := pgconn.ParseConfig(rawURL)
	require.NoError(t, err)
	if !strings.HasPrefix(cfg.Host, "/") {
		return rawURL
	}
	socket := filepath.Join(cfg.Host, fmt.Sprintf(".s.PGSQL.%d", cfg.Port))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		conns []net.Conn
	)
	track := func(c net.Conn) {
		mu.Lock()
		defer mu.Unlock()
		conns = append(conns, c)
	}
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			track(c)
			wg.Go(func() {
				defer c.Close()
				up, err := net.Dial("unix", socket)
				if err != nil {
					return
				}
				track(up)
				defer up.Close()
				wg.Go(func() { _, _ = io.Copy(up, c); up.Close() })
				_, _ = io.Copy(c, up)
			})
		}
	})
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	u := url.URL{Scheme: "postgres", Host: ln.Addr().String(), Path: "/" + cfg.Database, RawQuery: "sslmode=disable"}
	if cfg.Password != "" {
		u.User = url.UserPassword(cfg.User, cfg.Password)
	} else {
		u.User = url.User(cfg.User)
	}
	return u.String()
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(to, b, 0o644))
	if info, err := os.Stat(from); err == nil && info.Mode()&0o111 != 0 {
		require.NoError(t, os.Chmod(to, 0o755))
	}
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	return string(b)
}

// treeSize is the bytes of the regular files under dir.
func treeSize(t *testing.T, dir string) int64 {
	t.Helper()
	var n int64
	require.NoError(t, filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type().IsRegular() {
			info, err := d.Info()
			if err != nil {
				return err
			}
			n += info.Size()
		}
		return nil
	}))
	return n
}
