package main

import (
	"bufio"
	"bytes"
	"crypto/ecdh"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/heraldpush/herald/api/client"
	"github.com/heraldpush/herald/cmd/herald/heraldbench"
	"github.com/heraldpush/herald/db/dbtest"
)

// serveProcess is `herald serve` in a process of its own, so that its
// memory and connections are its own to measure.
type serveProcess struct {
	*child
	base string
}

// startServeProcess runs `herald serve` with args in a process of its own
// and waits for it to answer /healthz.
func startServeProcess(t *testing.T, vars map[string]string, args ...string) *serveProcess {
	t.Helper()
	return startServeProcessWith(t, 0, vars, args...)
}

// startServeProcessWith is startServeProcess with the process allowed
// nofile open files, when not zero.
func startServeProcessWith(t *testing.T, nofile int, vars map[string]string, args ...string) *serveProcess {
	t.Helper()
	argv := asHerald(append([]string{"serve", "--addr", "127.0.0.1:0"}, args...)...)
	if nofile > 0 {
		argv = append([]string{"/bin/sh", "-c", fmt.Sprintf(`ulimit -n %d && exec "$0" "$@"`, nofile)}, argv...)
	}
	p := &serveProcess{child: startChild(t, argv, vars)}
	p.base = p.child.base(t)
	require.Eventually(t, func() bool {
		resp, err := http.Get(p.base + "/healthz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, time.Minute, 20*time.Millisecond, "serve never answered")
	return p
}

// memory is the process's resident set and its peak so far, in MiB.
func (p *serveProcess) memory(t *testing.T) (rss, peak float64) {
	t.Helper()
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.cmd.Process.Pid))
	require.NoError(t, err)
	for _, line := range strings.Split(string(raw), "\n") {
		for key, dst := range map[string]*float64{"VmRSS:": &rss, "VmHWM:": &peak} {
			if rest, ok := strings.CutPrefix(line, key); ok {
				kb, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 64)
				require.NoError(t, err)
				*dst = kb / 1024
			}
		}
	}
	return rss, peak
}

// TestE2EAttackLoadRefusedBatchBodies sends 16 device batches of nearly 16 MB
// at once, each refused with 400 for its last device, as an attacker with a
// key would, far under the rate limit: the process's memory grows by at
// most 200 MB over idle (it grew by 1.5 GB when every body was read whole
// and decoded whole at once). A body beyond the process's budget of body
// bytes in flight is refused with 503 and Retry-After before it is read.
func TestE2EAttackLoadRefusedBatchBodies(t *testing.T) {
	t.Parallel()
	tdb := dbtest.New(t)
	p := startServeProcess(t, map[string]string{"DATABASE_URL": tdb.URL, "HERALD_API_KEYS": testAPIKey}, "--role", "api")
	idle, _ := p.memory(t)

	// Web Push subscriptions on a browser's push service, every one valid
	// but the last, so that each body is read to its end before it is
	// refused.
	key, err := ecdh.P256().GenerateKey(rand.Reader)
	require.NoError(t, err)
	keys := map[string]any{"p256dh": base64.RawURLEncoding.EncodeToString(key.PublicKey().Bytes()), "auth": "AAAAAAAAAAAAAAAAAAAAAA"}
	long := strings.Repeat("t", 1380)
	devices := make([]map[string]any, 10_000)
	for i := range devices {
		devices[i] = map[string]any{"user_id": fmt.Sprintf("u%d", i), "channel": "webpush",
			"subscription": map[string]any{"endpoint": fmt.Sprintf("https://fcm.googleapis.com/fcm/send/%s%05d", long, i), "keys": keys}}
	}
	devices[len(devices)-1]["channel"] = "carrier-pigeon"
	body, err := json.Marshal(map[string]any{"devices": devices})
	require.NoError(t, err)
	require.Greater(t, len(body), 15<<20)
	require.Less(t, len(body), 16<<20)

	statuses := map[int]int{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			req, err := http.NewRequest(http.MethodPost, p.base+"/v1/devices/batch", bytes.NewReader(body))
			if err != nil {
				panic(err)
			}
			req.Header.Set("Authorization", "Bearer "+testAPIKey)
			req.Header.Set("Content-Type", "application/json")
			resp, err := http.DefaultClient.Do(req)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				statuses[0]++
				return
			}
			resp.Body.Close()
			statuses[resp.StatusCode]++
			if resp.StatusCode == http.StatusServiceUnavailable && resp.Header.Get("Retry-After") == "" {
				statuses[-1]++
			}
		})
	}
	wg.Wait()
	_, peak := p.memory(t)
	t.Logf("idle RSS %.0f MiB, peak %.0f MiB (+%.0f) under 16 concurrent refused %.1f MiB bodies; answers %v",
		idle, peak, peak-idle, float64(len(body))/(1<<20), statuses)
	require.Zero(t, statuses[0], "a request got no answer")
	require.Zero(t, statuses[-1], "a 503 without Retry-After")
	require.Positive(t, statuses[http.StatusBadRequest], "some bodies were read and refused for what they hold")
	require.Equal(t, 16, statuses[http.StatusBadRequest]+statuses[http.StatusServiceUnavailable])
	require.LessOrEqual(t, peak-idle, 200.0, "refused bodies took the process's memory up by more than 200 MiB")
}

// acquires scrapes the process's connection pool's count of connections
// taken: every database query takes one.
func (p *serveProcess) acquires(t *testing.T) float64 {
	t.Helper()
	families, err := heraldbench.ScrapeMetrics(p.base)
	require.NoError(t, err)
	_, ok := families["herald_db_pool_acquires_total"]
	require.True(t, ok, "the process does not export its pool's statistics")
	return heraldbench.MetricSum(families, "herald_db_pool_acquires_total", map[string]string{"pool": "main"})
}

// TestE2EAttackLoadUnauthenticatedEndpoints floods /readyz and /metrics, which
// anyone may call, from eight clients for two seconds: the database sees a
// handful of queries, not one or more a call (a flood of them took the
// API's typical latency from 2.6 ms to 252 ms). The API's median latency
// before and during the flood is logged.
func TestE2EAttackLoadUnauthenticatedEndpoints(t *testing.T) {
	t.Parallel()
	tdb := dbtest.New(t)
	p := startServeProcess(t, map[string]string{"DATABASE_URL": tdb.URL, "HERALD_API_KEYS": testAPIKey}, "--role", "api")
	api := newAPIClient(t, p.base, testAPIKey)
	res, err := api.RegisterDeviceWithResponse(t.Context(), client.DeviceRegistration{UserID: "u1", Channel: client.ChannelFCM, Token: new("tok")})
	answered(t, http.StatusCreated, res, err)
	median := func() time.Duration {
		var took []time.Duration
		for range 50 {
			start := time.Now()
			res, err := api.GetUserWithResponse(t.Context(), "u1")
			took = append(took, time.Since(start))
			answered(t, http.StatusOK, res, err)
		}
		slices.Sort(took)
		return took[len(took)/2]
	}
	idle := median()

	time.Sleep(1100 * time.Millisecond) // past the kept page's second
	before := p.acquires(t)
	var calls atomic.Int64
	stop := time.Now().Add(2 * time.Second)
	var wg sync.WaitGroup
	for i := range 8 {
		path := []string{"/readyz", "/metrics"}[i%2]
		wg.Go(func() {
			for time.Now().Before(stop) {
				resp, err := http.Get(p.base + path)
				if err != nil {
					continue
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				calls.Add(1)
			}
		})
	}
	flooded := median()
	wg.Wait()
	time.Sleep(1100 * time.Millisecond)
	// The scrape below takes none; the API calls took one each.
	used := p.acquires(t) - before - 50
	t.Logf("%d calls of /readyz and /metrics in 2 s took %.0f connections from the pool; API median %s idle, %s during the flood",
		calls.Load(), used, idle, flooded)
	require.Greater(t, calls.Load(), int64(100), "the flood never got going")
	require.LessOrEqual(t, used, 40.0, "unauthenticated calls reached the database")
}

// TestE2EAttackLoadIdleConnections opens 3,000 idle keep-alive connections
// from one address to a process allowed 2,048 open files (the 20,000
// idle connections that used up a default process's files, at a smaller
// scale): the process keeps at most its per-client limit of them, and a
// client from another address is still served.
func TestE2EAttackLoadIdleConnections(t *testing.T) {
	t.Parallel()
	tdb := dbtest.New(t)
	// Idle connections are kept as long as the test takes: the limit, not
	// the idle timeout, is what is tested.
	p := startServeProcessWith(t, 2048, map[string]string{
		"DATABASE_URL": tdb.URL, "HERALD_API_KEYS": testAPIKey, "HERALD_HTTP_IDLE_TIMEOUT": "10m",
	}, "--role", "api")
	addr := strings.TrimPrefix(p.base, "http://")

	var (
		mu      sync.Mutex
		kept    []net.Conn
		refused int
		wg      sync.WaitGroup
	)
	t.Cleanup(func() {
		for _, c := range kept {
			c.Close()
		}
	})
	// Sixty-four attackers at once. A connection the process cannot take
	// waits in the kernel's queue for an answer that never comes, for two
	// seconds.
	attempts := make(chan struct{}, 3000)
	for range 3000 {
		attempts <- struct{}{}
	}
	close(attempts)
	for range 64 {
		wg.Go(func() {
			for range attempts {
				c, err := net.Dial("tcp", addr)
				if err == nil {
					_ = c.SetDeadline(time.Now().Add(2 * time.Second))
					if _, err = c.Write([]byte("GET /healthz HTTP/1.1\r\nHost: herald\r\n\r\n")); err == nil {
						var resp *http.Response
						if resp, err = http.ReadResponse(bufio.NewReader(c), nil); err == nil {
							resp.Body.Close()
							_ = c.SetDeadline(time.Time{})
						}
					}
				}
				mu.Lock()
				if err == nil {
					kept = append(kept, c)
				} else {
					refused++
					if c != nil {
						c.Close()
					}
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()

	// Another client, from another address on the loopback network.
	other := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		DialContext: (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}}).DialContext,
	}}
	api, err := client.NewClientWithResponses(p.base, client.WithAPIKey(testAPIKey), client.WithHTTPClient(other))
	require.NoError(t, err)
	res, err := api.RegisterDeviceWithResponse(t.Context(), client.DeviceRegistration{UserID: "u1", Channel: client.ChannelFCM, Token: new("tok")})
	fds, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", p.cmd.Process.Pid))
	limits, _ := os.ReadFile(fmt.Sprintf("/proc/%d/limits", p.cmd.Process.Pid))
	t.Logf("%d idle connections held open, %d refused; the process has %d files open (%s); another client's call: %v",
		len(kept), refused, len(fds), regexp.MustCompile(`Max open files\s+\d+`).Find(limits), err)
	answered(t, http.StatusCreated, res, err)
	require.LessOrEqual(t, len(kept), 256, "one address kept more than its limit of connections")
}
