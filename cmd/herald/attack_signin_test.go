package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/heraldpush/herald/db/dbtest"
)

// These tests attack a running `herald serve` the way a hostile caller on
// the network would: spoofed forwarding headers, redirects off the site,
// bodies that never end or never arrive, and questions meant to make the
// server describe its database. Each runs its own process on loopback.

// signInPassword is long enough for HERALD_ADMIN_PASSWORD's minimum.
const signInPassword = "attack-admin-password-0123"

// startSignIn serves the API and the dashboard on a fresh database, with
// extra added to the environment.
func startSignIn(t *testing.T, extra map[string]string) (string, *dbtest.DB) {
	t.Helper()
	tdb := dbtest.New(t)
	vars := map[string]string{
		"DATABASE_URL":          tdb.URL,
		"HERALD_API_KEYS":       testAPIKey,
		"HERALD_ADMIN_PASSWORD": signInPassword,
		"HERALD_LOG_LEVEL":      "error",
	}
	maps.Copy(vars, extra)
	base, _ := startServe(t, vars, "--migrate", "--role", "api")
	return base, tdb
}

// signIn posts the login form as a browser on the same site would, with
// the given extra headers, and returns the answer without following its
// redirect.
func signIn(t *testing.T, base, password, next string, header map[string]string) signInAnswer {
	t.Helper()
	return signInAs(t, base, "admin", password, next, header)
}

// signInAs is signIn as the operator user.
func signInAs(t *testing.T, base, user, password, next string, header map[string]string) signInAnswer {
	t.Helper()
	form := url.Values{"username": {user}, "password": {password}, "next": {next}}
	req, err := http.NewRequest(http.MethodPost, base+"/login", strings.NewReader(form.Encode()))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	for k, v := range header {
		req.Header.Set(k, v)
	}
	// The transport, unlike a client, leaves the redirect alone, even one
	// whose Location does not parse.
	resp, err := http.DefaultTransport.RoundTrip(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return signInAnswer{StatusCode: resp.StatusCode, Header: resp.Header, cookies: resp.Cookies()}
}

// signInAnswer is what a sign-in answered, its body read and closed.
type signInAnswer struct {
	StatusCode int
	Header     http.Header
	cookies    []*http.Cookie
}

func sessionCookie(resp signInAnswer) *http.Cookie {
	for _, c := range resp.cookies {
		if c.Name == "herald_session" {
			return c
		}
	}
	return nil
}

// TestAttackSignInThrottleIgnoresSpoofedAddresses: a guesser that names a
// new address in X-Forwarded-For or X-Real-IP on every attempt is still one
// caller, since no proxy is trusted.
func TestAttackSignInThrottleIgnoresSpoofedAddresses(t *testing.T) {
	t.Parallel()
	base, _ := startSignIn(t, nil)
	for i := range 6 {
		resp := signIn(t, base, fmt.Sprintf("guess-%d", i), "/", map[string]string{
			"X-Forwarded-For": fmt.Sprintf("198.51.100.%d", i+1),
			"X-Real-IP":       fmt.Sprintf("203.0.113.%d", i+1),
		})
		require.Contains(t, []int{http.StatusUnauthorized, http.StatusTooManyRequests}, resp.StatusCode, "guess %d", i+1)
	}
	// Even the right password now waits, whatever address it claims.
	resp := signIn(t, base, signInPassword, "/", map[string]string{"X-Forwarded-For": "192.0.2.77", "X-Real-IP": "192.0.2.78"})
	require.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
	require.NotEmpty(t, resp.Header.Get("Retry-After"))
	require.Nil(t, sessionCookie(resp))
}

// TestAttackSignInTrustedProxy: behind a trusted proxy, each client is
// throttled by the address the proxy saw, and an address the client put in
// front of X-Forwarded-For itself does not let it escape.
func TestAttackSignInTrustedProxy(t *testing.T) {
	t.Parallel()
	base, _ := startSignIn(t, map[string]string{"HERALD_TRUSTED_PROXIES": "10.255.0.0/16, 127.0.0.1/32"})
	for i := range 6 {
		// The proxy appends the address it saw (203.0.113.1) to what the
		// client sent, which changes every time.
		xff := fmt.Sprintf("198.51.100.%d, 203.0.113.1", i+1)
		resp := signIn(t, base, "guess", "/", map[string]string{"X-Forwarded-For": xff})
		require.Contains(t, []int{http.StatusUnauthorized, http.StatusTooManyRequests}, resp.StatusCode, "guess %d", i+1)
	}
	resp := signIn(t, base, signInPassword, "/", map[string]string{"X-Forwarded-For": "192.0.2.1, 203.0.113.1"})
	require.Equal(t, http.StatusTooManyRequests, resp.StatusCode, "the guesser escaped its throttle")

	// Another client behind the same proxy is not held back by the
	// guesser, and the proxy's word that it came over https makes the
	// cookie Secure.
	resp = signIn(t, base, signInPassword, "/", map[string]string{"X-Forwarded-For": "203.0.113.2", "X-Forwarded-Proto": "https"})
	require.Equal(t, http.StatusSeeOther, resp.StatusCode)
	ck := sessionCookie(resp)
	require.NotNil(t, ck)
	require.True(t, ck.Secure)
}

// TestAttackSignInForwardedProto: X-Forwarded-Proto from a caller that is
// not a trusted proxy does not decide the cookie's Secure flag;
// HERALD_SECURE_COOKIES=true makes it Secure even over plain HTTP, as
// behind a TLS-terminating proxy that sends no header.
func TestAttackSignInForwardedProto(t *testing.T) {
	t.Parallel()
	base, _ := startSignIn(t, nil)
	resp := signIn(t, base, signInPassword, "/", map[string]string{"X-Forwarded-Proto": "https"})
	require.Equal(t, http.StatusSeeOther, resp.StatusCode)
	ck := sessionCookie(resp)
	require.NotNil(t, ck)
	require.False(t, ck.Secure, "an untrusted caller's X-Forwarded-Proto made the cookie Secure")

	secure, _ := startSignIn(t, map[string]string{"HERALD_SECURE_COOKIES": "true"})
	resp = signIn(t, secure, signInPassword, "/", nil)
	require.Equal(t, http.StatusSeeOther, resp.StatusCode)
	ck = sessionCookie(resp)
	require.NotNil(t, ck)
	require.True(t, ck.Secure, "HERALD_SECURE_COOKIES=true did not make the cookie Secure")
}

// TestAttackSignInNextStaysOnSite: after signing in, the operator is sent to
// a path of this site and nowhere else, however next is dressed up.
func TestAttackSignInNextStaysOnSite(t *testing.T) {
	t.Parallel()
	base, _ := startSignIn(t, nil)
	for _, next := range []string{
		"/\t/evil.example", "/\n/evil.example", "/\r/evil.example", "/\t\\evil.example",
		"//evil.example", "/\\evil.example", "\\\\evil.example", " //evil.example",
		"\t//evil.example", "https://evil.example/", "javascript:alert(1)", "/x\x00y",
		"/\x7f/evil.example", "https:/evil.example",
	} {
		resp := signIn(t, base, signInPassword, next, nil)
		require.Equal(t, http.StatusSeeOther, resp.StatusCode, "%q", next)
		require.Equal(t, "/", resp.Header.Get("Location"), "next %q", next)
	}
	for _, next := range []string{"/#/providers", "/riverui/jobs?state=available", "/%2F/evil.example"} {
		resp := signIn(t, base, signInPassword, next, nil)
		require.Equal(t, next, resp.Header.Get("Location"))
	}
}

// TestAttackSignInShortAdminPassword: a password that a small dictionary
// finds never guards the dashboard: serve refuses to start with it.
func TestAttackSignInShortAdminPassword(t *testing.T) {
	t.Parallel()
	tdb := dbtest.NewEmpty(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var stdout syncBuffer
	err := run(ctx, []string{"herald", "serve", "--migrate", "--role", "api", "--addr", "127.0.0.1:0"},
		env(map[string]string{"DATABASE_URL": tdb.URL, "HERALD_ADMIN_PASSWORD": "hunter2-pwd"}), &stdout, io.Discard)
	require.Error(t, err, "serve started with an 11-character admin password")
	require.Contains(t, err.Error(), "HERALD_ADMIN_PASSWORD")
	require.Contains(t, err.Error(), "12")
	require.NotContains(t, stdout.String(), "listening")
	require.NoError(t, ctx.Err(), "serve did not refuse at once")

	// make run's password, 12 random bytes in base64, is long enough.
	base, _ := startSignIn(t, map[string]string{"HERALD_ADMIN_PASSWORD": "q8Zt3_kL0-xYw2Ab"})
	resp := signIn(t, base, "q8Zt3_kL0-xYw2Ab", "/", nil)
	require.Equal(t, http.StatusSeeOther, resp.StatusCode)
}

// dial opens a raw connection to the server at base.
func dial(t *testing.T, base string) net.Conn {
	t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	return conn
}

// requireClosedWithin reads what the server sends until it closes the
// connection, and fails if that takes longer than within. It returns what
// was read.
func requireClosedWithin(t *testing.T, conn net.Conn, within time.Duration) string {
	t.Helper()
	start := time.Now()
	require.NoError(t, conn.SetReadDeadline(start.Add(within)))
	var got strings.Builder
	_, err := io.Copy(&got, conn)
	var netErr net.Error
	if errors.As(err, &netErr) && netErr.Timeout() {
		t.Fatalf("the server still held the connection after %s; it sent %d bytes", within, got.Len())
	}
	return got.String()
}

// TestAttackSignInHalfSentBody: a body that stops halfway, or headers that
// never end, hold a connection for HERALD_HTTP_READ_TIMEOUT and no longer.
func TestAttackSignInHalfSentBody(t *testing.T) {
	t.Parallel()
	base, _ := startSignIn(t, map[string]string{"HERALD_HTTP_READ_TIMEOUT": "1s"})

	for _, r := range []struct{ name, request, answer string }{
		{"login form", "POST /login HTTP/1.1\r\nHost: herald\r\nContent-Type: application/x-www-form-urlencoded\r\n" +
			"Content-Length: 100\r\n\r\nusername=admin&pass", "HTTP/1.1 408 "},
		{"device registration", "POST /v1/devices HTTP/1.1\r\nHost: herald\r\nAuthorization: Bearer " + testAPIKey +
			"\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"user_id\":", "HTTP/1.1 408 "},
		// Headers that never end get no answer: there is no request yet.
		{"headers", "GET /healthz HTTP/1.1\r\nHost: herald\r\nX-Slow: ", ""},
	} {
		t.Run(r.name, func(t *testing.T) {
			t.Parallel()
			conn := dial(t, base)
			_, err := io.WriteString(conn, r.request)
			require.NoError(t, err)
			got := requireClosedWithin(t, conn, 4*time.Second)
			require.True(t, strings.HasPrefix(got, r.answer), "answered %q", got)
			if r.answer != "" {
				require.Contains(t, got, `"code":"request_timeout"`)
			}
			require.NotContains(t, got, "i/o timeout", "the answer describes the server's connection")
		})
	}
}

// TestAttackSignInIdleConnection: a kept-alive connection that asks
// nothing more is closed after HERALD_HTTP_IDLE_TIMEOUT.
func TestAttackSignInIdleConnection(t *testing.T) {
	t.Parallel()
	base, _ := startSignIn(t, map[string]string{"HERALD_HTTP_IDLE_TIMEOUT": "1s"})
	conn := dial(t, base)
	_, err := io.WriteString(conn, "GET /healthz HTTP/1.1\r\nHost: herald\r\n\r\n")
	require.NoError(t, err)
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.NotEqual(t, "close", resp.Header.Get("Connection"))
	// The response is read in full above (it is short and buffered), so the
	// next read waits for the server to close.
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	requireClosedWithin(t, conn, 4*time.Second)
}

// TestAttackSignInSlowReader: a caller that asks for a lot and never reads
// the answers does not hold a connection and its goroutine for ever: the
// server gives up writing after HERALD_HTTP_WRITE_TIMEOUT.
func TestAttackSignInSlowReader(t *testing.T) {
	t.Parallel()
	base, _ := startSignIn(t, map[string]string{"HERALD_HTTP_READ_TIMEOUT": "1s", "HERALD_HTTP_WRITE_TIMEOUT": "1s"})
	conn := dial(t, base)
	// A small receive window keeps the answers in the server's buffers.
	require.NoError(t, conn.(*net.TCPConn).SetReadBuffer(4096))
	// 400 pipelined requests for the OpenAPI document ask for about 10 MB,
	// more than the kernel buffers between the two ends hold.
	var sent atomic.Int64
	go func() {
		for range 400 {
			if _, err := io.WriteString(conn, "GET /openapi.yaml HTTP/1.1\r\nHost: herald\r\n\r\n"); err != nil {
				return
			}
			sent.Add(1)
		}
	}()
	time.Sleep(2500 * time.Millisecond)
	got := requireClosedWithin(t, conn, 4*time.Second)
	answered := strings.Count(got, "HTTP/1.1 200 OK")
	require.Less(t, answered, 400, "every request was answered: the server never gave up on the slow reader")
	t.Logf("%d requests sent, %d answered before the server closed the connection", sent.Load(), answered)
}

// TestAttackSignInLoginBodyLimit: the anonymous login form takes a few KiB;
// a larger body is refused with 413 before it is read, whether its length
// is announced or it just keeps coming.
func TestAttackSignInLoginBodyLimit(t *testing.T) {
	t.Parallel()
	base, _ := startSignIn(t, nil)

	t.Run("announced", func(t *testing.T) {
		t.Parallel()
		conn := dial(t, base)
		_, err := io.WriteString(conn, "POST /login HTTP/1.1\r\nHost: herald\r\n"+
			"Content-Type: multipart/form-data; boundary=x\r\nContent-Length: 60000000\r\n\r\n--x\r\n")
		require.NoError(t, err)
		require.NoError(t, conn.SetReadDeadline(time.Now().Add(5*time.Second)))
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		require.NoError(t, err, "no answer before the 60 MB body arrived")
		requireTooLarge(t, resp)
	})

	t.Run("streamed", func(t *testing.T) {
		t.Parallel()
		// A chunked body has no length to check: the server stops reading
		// at its limit.
		body := &countingZeros{limit: 60 << 20}
		req, err := http.NewRequest(http.MethodPost, base+"/login", io.MultiReader(
			strings.NewReader("--x\r\nContent-Disposition: form-data; name=\"blob\"\r\n\r\n"), body))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "multipart/form-data; boundary=x")
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		resp, err := http.DefaultClient.Do(req.WithContext(ctx))
		require.NoError(t, err)
		requireTooLarge(t, resp)
		require.Less(t, body.read.Load(), int64(16<<20), "the server read most of a 60 MB login form")
	})
}

func requireTooLarge(t *testing.T, resp *http.Response) {
	t.Helper()
	defer resp.Body.Close()
	require.Equal(t, http.StatusRequestEntityTooLarge, resp.StatusCode)
	require.Contains(t, resp.Header.Get("Content-Type"), "application/json")
	var out struct {
		Error struct{ Code, Message string } `json:"error"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&out))
	require.Equal(t, "too_large", out.Error.Code)
}

// countingZeros yields up to limit zero bytes and counts how many were
// taken.
type countingZeros struct {
	limit int64
	read  atomic.Int64
}

func (z *countingZeros) Read(p []byte) (int, error) {
	left := z.limit - z.read.Load()
	if left <= 0 {
		return 0, io.EOF
	}
	n := int(min(int64(len(p)), left))
	clear(p[:n])
	z.read.Add(int64(n))
	return n, nil
}

// TestAttackSignInReadyzHidesDatabase: when the database goes away,
// /readyz says the process is not ready and nothing about the database:
// not its address, its name or its error. The log has those.
func TestAttackSignInReadyzHidesDatabase(t *testing.T) {
	t.Parallel()
	base, tdb := startSignIn(t, nil)
	cfg, err := pgx.ParseConfig(tdb.URL)
	require.NoError(t, err)

	// Drop the database under the running server.
	admin, err := pgx.Connect(context.Background(), dbtest.AdminURL(t))
	require.NoError(t, err)
	defer admin.Close(context.Background())
	tdb.Pool.Close()
	_, err = admin.Exec(context.Background(), "DROP DATABASE "+pgx.Identifier{cfg.Database}.Sanitize()+" WITH (FORCE)")
	require.NoError(t, err)

	secrets := []string{cfg.Database, cfg.Host, "SQLSTATE", "postgres", "5432", "connect"}
	if dir, err := os.Getwd(); err == nil {
		secrets = append(secrets, dir)
	}
	notReady := 0
	for range 5 {
		resp, err := http.Get(base + "/readyz")
		require.NoError(t, err)
		raw, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.NoError(t, err)
		if resp.StatusCode == http.StatusOK {
			continue
		}
		notReady++
		require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode, string(raw))
		var out struct {
			Error struct{ Code, Message string } `json:"error"`
		}
		require.NoError(t, json.Unmarshal(raw, &out))
		require.Equal(t, "not_ready", out.Error.Code)
		for _, s := range secrets {
			require.NotContains(t, out.Error.Message, s, "/readyz told an anonymous caller about the database")
		}
	}
	require.Positive(t, notReady, "/readyz said ready without its database")
}
