// Package fake is fakepush: a local stand-in for APNs, FCM HTTP v1 and Web Push that
// speaks their wire protocols over HTTPS with HTTP/2, so that the real client SDKs
// talk to it unchanged. It checks what the real providers check (signed tokens,
// headers, payload limits, encryption), answers with their status codes and error
// bodies, and records every accepted push for tests and benchmarks to read back.
//
// A Server is started in-process by tests of other packages, or by `herald fakepush`.
// Everything a client needs (the CA, the provider credentials and the URLs) is
// written into one directory, together with an env file naming it all.
package fake

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Server is one fakepush instance. Create it with New, then call Start.
type Server struct {
	cfg   Config
	dir   string // absolute Config.TLSDir
	ca    *certAuthority
	creds *credentials // the default app's first keys
	pool  *x509.CertPool

	// apps are the apps fakepush plays and their keys; bindings say which
	// app each declared device token belongs to.
	apps     appRegistry
	bindings tokenBindings

	// Set by Start and read-only afterwards.
	baseURL    string
	sandboxURL string
	http       *http.Server
	served     sync.WaitGroup // done when both listeners' Serve return
	started    atomic.Bool

	closeOnce sync.Once
	closeErr  error

	// env is what DIR/env holds, rewritten when the default app's keys change.
	envMu sync.Mutex
	env   map[string]string

	rec       *recorder
	devices   *devices
	counters  [numChannels]counters
	behaviour [numChannels]atomic.Pointer[behaviour]
	cpuBase   atomic.Int64 // process CPU nanoseconds at start or last reset
	handling  atomic.Int64 // push requests being handled now

	conns       conns
	throttles   throttles
	sandbox     sandboxTokens
	apnsTokens  tokenCache
	subKeys     subscriptionCache
	apnsBodies  map[string][]byte
	fcmBodies   fcmBodies
	fcmSeq      atomic.Uint64 // numbers FCM message names
	webPushSeq  atomic.Uint64 // numbers Web Push messages for their Location
	decryptSeq  atomic.Uint64 // counts Web Push bodies for decrypt sampling
	bodyBuffers sync.Pool     // *[]byte for request bodies, which are all small

	// jsonType is the Content-Type value of every JSON response. net/http never
	// modifies header slices, so one serves all requests without an allocation.
	jsonType []string
}

// New prepares a server: it fills in and validates cfg, creates the TLS directory,
// and loads or creates the CA and every provider key in it. It does not listen.
func New(cfg Config) (*Server, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	dir, err := filepath.Abs(cfg.TLSDir)
	if err != nil {
		return nil, fmt.Errorf("fakepush: TLS dir: %w", err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("fakepush: TLS dir: %w", err)
	}
	ca, err := loadOrCreateCA(dir, cfg.Now())
	if err != nil {
		return nil, fmt.Errorf("fakepush: %w", err)
	}
	creds, err := loadOrCreateCredentials(dir)
	if err != nil {
		return nil, fmt.Errorf("fakepush: %w", err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca.cert)

	s := &Server{
		cfg:        cfg,
		dir:        dir,
		ca:         ca,
		creds:      creds,
		pool:       pool,
		rec:        newRecorder("", 0),
		devices:    newDevices(cfg.Devices, cfg.Now),
		apnsBodies: apnsErrorBodies(),
		fcmBodies:  newFCMBodies(),
		jsonType:   []string{"application/json"},
	}
	s.apnsTokens.m = make(map[string]cachedToken)
	s.subKeys.m = make(map[string]cachedSubscription)
	s.sandbox.m = make(map[string]struct{})
	s.bodyBuffers.New = func() any {
		b := make([]byte, 0, 8<<10)
		return &b
	}
	if err := s.loadApps(); err != nil {
		return nil, fmt.Errorf("fakepush: %w", err)
	}
	s.resetBehaviour()
	s.cpuBase.Store(processCPU())
	return s, nil
}

// Start listens on Config.Addr, writes the service-account file and DIR/env with
// the address actually bound, and serves in the background until Close is called
// or ctx is done. It returns once the server accepts connections.
func (s *Server) Start(ctx context.Context) error {
	if !s.started.CompareAndSwap(false, true) {
		return errors.New("fakepush: already started")
	}
	ln, err := (&net.ListenConfig{}).Listen(ctx, "tcp", s.cfg.Addr)
	if err != nil {
		return fmt.Errorf("fakepush: listen: %w", err)
	}
	sandboxLn, err := (&net.ListenConfig{}).Listen(ctx, "tcp", s.cfg.SandboxAddr)
	if err != nil {
		ln.Close()
		return fmt.Errorf("fakepush: listen for the APNs sandbox: %w", err)
	}
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	_, sandboxPort, _ := net.SplitHostPort(sandboxLn.Addr().String())
	host := s.cfg.Hostname
	if host == "" {
		host, _, _ = net.SplitHostPort(s.cfg.Addr)
		if ip := net.ParseIP(host); host == "" || ip != nil && ip.IsUnspecified() {
			host = "127.0.0.1"
		}
	}
	s.baseURL = "https://" + net.JoinHostPort(host, port)
	s.sandboxURL = "https://" + net.JoinHostPort(host, sandboxPort)
	s.rec = newRecorder(s.baseURL+"/webpush/", s.cfg.Details)
	s.conns.sandboxAddr = sandboxLn.Addr().String()

	cert, err := s.ca.serverCertificate(host, s.cfg.Now())
	if err != nil {
		ln.Close()
		sandboxLn.Close()
		return fmt.Errorf("fakepush: %w", err)
	}
	if err := s.writeClientFiles(); err != nil {
		ln.Close()
		sandboxLn.Close()
		return fmt.Errorf("fakepush: %w", err)
	}

	s.http = &http.Server{
		Handler: s.routes(),
		TLSConfig: &tls.Config{
			Certificates: []tls.Certificate{cert},
			MinVersion:   tls.VersionTLS12,
		},
		// APNs keeps connections for hours; an idle limit still reaps clients that
		// vanished without closing.
		IdleTimeout:       10 * time.Minute,
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          slog.NewLogLogger(s.cfg.Logger.Handler(), slog.LevelWarn),
		HTTP2: &http.HTTP2Config{
			MaxConcurrentStreams: s.cfg.MaxConcurrentStreams,
		},
		// Every connection keeps its APNs provider tokens, which Apple
		// allows to change only every 20 minutes; a connection to the
		// sandbox listener is marked, so that the APNs handler knows which
		// host a push came to.
		// Each connection is counted and may be closed on demand (conns.go).
		ConnState: s.conns.track,
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			ctx = context.WithValue(ctx, apnsConnKey{}, &apnsConn{})
			ctx = context.WithValue(ctx, connKey{}, c)
			if c.LocalAddr().String() == sandboxLn.Addr().String() {
				return context.WithValue(ctx, sandboxConn{}, true)
			}
			return ctx
		},
	}
	s.devices.start()
	for _, l := range []net.Listener{ln, sandboxLn} {
		s.served.Go(func() {
			if err := s.http.ServeTLS(l, "", ""); err != nil && !errors.Is(err, http.ErrServerClosed) {
				s.cfg.Logger.Error("fakepush: serve", "err", err)
			}
		})
	}
	context.AfterFunc(ctx, func() { s.Close() })
	return nil
}

// inFlight counts a push endpoint's requests while they are handled.
func (s *Server) inFlight(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		s.handling.Add(1)
		defer s.handling.Add(-1)
		h(w, r)
	}
}

// routes lists every endpoint fakepush serves, in one place.
func (s *Server) routes() http.Handler {
	mux := http.NewServeMux()

	// APNs (token-based provider API).
	mux.HandleFunc("POST /3/device/{token}", s.inFlight(s.handleAPNs))
	mux.HandleFunc("/3/", s.handleAPNsBadRequestLine)

	// FCM HTTP v1, with Google's OAuth 2.0 token endpoint beside it.
	mux.HandleFunc("POST /token", s.handleToken)
	mux.HandleFunc("POST /v1/projects/{project}/messages:send", s.inFlight(s.handleFCMSend))

	// Web Push (RFC 8030 push service, RFC 8291 encryption, RFC 8292 VAPID).
	mux.HandleFunc("POST /_webpush/subscriptions", s.handleMintSubscription)
	mux.HandleFunc("POST /webpush/{id}", s.inFlight(s.handleWebPush))
	mux.HandleFunc("HEAD /{$}", s.handleWebPushWarmup)

	// Control and inspection.
	mux.HandleFunc("GET /_stats", s.handleStats)
	mux.HandleFunc("GET /_receipts", s.handleReceipts)
	mux.HandleFunc("POST /_reset", s.handleReset)
	mux.HandleFunc("GET /_control", s.handleGetControl)
	mux.HandleFunc("POST /_control", s.handleControl)
	mux.HandleFunc("GET /_throttled", s.handleThrottled)
	mux.HandleFunc("POST /_apns/sandbox-tokens", s.handleSandboxTokens)
	mux.HandleFunc("GET /_devices", s.handleGetDevices)
	mux.HandleFunc("POST /_devices", s.handleDevices)
	mux.HandleFunc("POST /_connections/close", s.handleCloseConnections)

	// The apps, their keys and their devices' tokens (apps.go).
	mux.HandleFunc("GET /_apps", s.handleApps)
	mux.HandleFunc("POST /_apps", s.handleAddApp)
	mux.HandleFunc("GET /_apps/{name}", s.handleApp)
	mux.HandleFunc("GET /_apps/{name}/credentials/{channel}", s.handleAppCredential)
	mux.HandleFunc("POST /_apps/{name}/tokens", s.handleAppTokens)
	mux.HandleFunc("POST /_apps/{name}/rotate", s.handleRotateApp)
	mux.HandleFunc("POST /_apps/{name}/revoke", s.handleRevokeApp)
	return s.sandboxServesAPNsOnly(mux)
}

// writeClientFiles writes what a client needs beside the keys New wrote: the
// service accounts (their token_uri depends on the bound port), each app's
// app.json and DIR/env.
func (s *Server) writeClientFiles() error {
	s.apps.mu.Lock()
	defer s.apps.mu.Unlock()
	// The default app's first service-account key lives in this file, so it
	// is written whether or not that key is still the one in use.
	saPath := filepath.Join(s.dir, fileFCMAccount)
	if err := s.creds.writeServiceAccount(saPath, s.cfg.FCMProjectID, s.baseURL+"/token"); err != nil {
		return err
	}
	s.apps.written = true
	set := s.apps.load()
	for _, a := range set.sorted() {
		if err := s.writeAppFiles(set, a); err != nil {
			return err
		}
	}
	return nil
}

// writeEnv writes DIR/env from the default app's keys in use in set. The
// caller holds s.apps.mu.
func (s *Server) writeEnv(set *appSet) error {
	def := set.def
	apns, vapid := set.current(def, APNs), set.current(def, WebPush)
	env := map[string]string{
		EnvAPNsKeyFile:        apns.file,
		EnvAPNsKeyID:          apns.id,
		EnvAPNsTeamID:         def.teamID,
		EnvAPNsTopic:          def.topic,
		EnvAPNsHost:           s.baseURL,
		EnvAPNsSandboxHost:    s.sandboxURL,
		EnvFCMCredentialsFile: s.credentialsFile(set, def),
		EnvFCMEndpoint:        s.baseURL + "/v1",
		EnvVAPIDPublicKey:     b64(vapid.public),
		EnvVAPIDPrivateKey:    b64(vapid.private),
		EnvVAPIDSubject:       s.cfg.VAPIDSubject,
		EnvSSLCertFile:        filepath.Join(s.dir, fileCACert),
		// fakepush's Web Push endpoints are on its own address, which
		// Herald's egress policy refuses (a loopback address, not a known
		// push service) unless the operator admits it: this does.
		EnvWebPushHosts: strings.TrimPrefix(s.baseURL, "https://"),
	}
	if err := writeFileAtomic(s.EnvFile(), encodeEnvFile(env), 0o600); err != nil {
		return err
	}
	s.envMu.Lock()
	s.env = env
	s.envMu.Unlock()
	return nil
}

// Close stops the server, letting in-flight requests finish for a few seconds.
// It is safe to call more than once and before Start.
func (s *Server) Close() error {
	s.closeOnce.Do(func() {
		if !s.started.Load() || s.http == nil {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := s.http.Shutdown(ctx); err != nil {
			s.closeErr = s.http.Close()
		}
		s.served.Wait()
		s.devices.close()
	})
	return s.closeErr
}

// SandboxURL is the base URL of the APNs sandbox host. It is known once
// Start has returned.
func (s *Server) SandboxURL() string { return s.sandboxURL }

// URL is the base URL clients use, such as https://127.0.0.1:8443. It is known
// once Start has returned.
func (s *Server) URL() string { return s.baseURL }

// CertPool returns a pool holding fakepush's CA, for a client's tls.Config.RootCAs.
func (s *Server) CertPool() *x509.CertPool { return s.pool.Clone() }

// CACertPEM returns the CA certificate in PEM, the content of DIR/ca.pem.
func (s *Server) CACertPEM() []byte { return append([]byte(nil), s.ca.pem...) }

// Dir is the absolute path of the TLS directory.
func (s *Server) Dir() string { return s.dir }

// EnvFile is the path of DIR/env.
func (s *Server) EnvFile() string { return filepath.Join(s.dir, fileEnv) }

// Env returns the variables written to DIR/env: all a Herald process needs to use
// this server. It is known once Start has returned, and names the default app's
// new keys once they are rotated.
func (s *Server) Env() map[string]string {
	s.envMu.Lock()
	defer s.envMu.Unlock()
	return maps.Clone(s.env)
}

// HTTPClient returns a client that trusts fakepush's CA and speaks HTTP/2, for
// tests and for the control endpoints.
func (s *Server) HTTPClient() *http.Client {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.TLSClientConfig = &tls.Config{RootCAs: s.pool.Clone()}
	t.ForceAttemptHTTP2 = true
	return &http.Client{Transport: t}
}

// readBody reads at most limit bytes of a request body into a pooled buffer and
// reports whether there was more. The caller returns the buffer with putBuffer.
func (s *Server) readBody(r *http.Request, limit int) (buf *[]byte, body []byte, tooLarge bool, err error) {
	buf = s.bodyBuffers.Get().(*[]byte)
	if r.ContentLength > int64(limit) {
		return buf, nil, true, nil
	}
	b := (*buf)[:0]
	for {
		if len(b) == cap(b) {
			b = append(b, 0)[:len(b)]
		}
		n, rerr := r.Body.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		if len(b) > limit {
			*buf = b
			return buf, nil, true, nil
		}
		if rerr == io.EOF {
			*buf = b
			return buf, b, false, nil
		}
		if rerr != nil {
			*buf = b
			return buf, nil, false, rerr
		}
	}
}

func (s *Server) putBuffer(buf *[]byte) {
	// Bodies are capped at a few KiB except for odd clients; a buffer grown far
	// beyond that is left to the collector rather than kept forever.
	if cap(*buf) <= 64<<10 {
		*buf = (*buf)[:0]
		s.bodyBuffers.Put(buf)
	}
}

// tokenCache remembers provider tokens whose signature has been verified, keyed
// by the whole token, so that a client reusing its token (apns2 does so for 50
// minutes) costs a map lookup instead of an ECDSA verification per push. Expiry
// and the key's revocation are still checked on every use.
type tokenCache struct {
	mu sync.RWMutex
	m  map[string]cachedToken
}

// cachedToken is what a verified provider token said: when it was issued
// (Unix seconds) and which key signed it.
type cachedToken struct {
	iat int64
	kid string
}

func (c *tokenCache) get(token string) (cachedToken, bool) {
	c.mu.RLock()
	t, ok := c.m[token]
	c.mu.RUnlock()
	return t, ok
}

func (c *tokenCache) put(token string, t cachedToken) {
	c.mu.Lock()
	defer c.mu.Unlock()
	// Real clients hold one token per key; a bound keeps a misbehaving one (a new
	// token per request) from growing the map without limit.
	if len(c.m) >= 1024 {
		clear(c.m)
	}
	c.m[token] = t
}

// admission is what a provider endpoint has once admit let its request in.
type admission struct {
	at       int64 // receipt time, Unix nanoseconds
	cnt      *counters
	buf      *[]byte // pooled; the handler returns it with putBuffer
	body     []byte
	tooLarge bool
}

// admit is the start every provider endpoint shares: count the request, read
// its body (up to limit), wait the channel's injected latency, and answer
// for a channel that /_control made unavailable (503) or rate limited (429)
// through reject, in that provider's own words. retryAfter is the seconds
// its Retry-After should say, zero for none. ok is false when the request
// has been answered already, or its client left.
func (s *Server) admit(w http.ResponseWriter, r *http.Request, ch Channel, limit int,
	reject func(w http.ResponseWriter, status, retryAfter int),
) (a admission, ok bool) {
	a.at = s.cfg.Now().UnixNano()
	a.cnt = &s.counters[ch]
	a.cnt.received.Add(1)
	var err error
	a.buf, a.body, a.tooLarge, err = s.readBody(r, limit)
	if err != nil {
		s.putBuffer(a.buf)
		return a, false // the client went away mid-body
	}
	b := s.behaviourOf(ch)
	if !wait(r.Context(), b.latency) {
		s.putBuffer(a.buf)
		return a, false
	}
	switch b.mode {
	case ModeUnavailable:
		reject(w, http.StatusServiceUnavailable, b.retryAfter)
	case ModeRateLimited:
		reject(w, http.StatusTooManyRequests, max(b.retryAfter, 1))
	default:
		return a, true
	}
	s.putBuffer(a.buf)
	return a, false
}

// setRetryAfter sets the Retry-After header, unless seconds is zero.
func setRetryAfter(w http.ResponseWriter, seconds int) {
	if seconds > 0 {
		w.Header()["Retry-After"] = []string{strconv.Itoa(seconds)}
	}
}

// wait sleeps for the injected latency on a timer and reports false if the client
// gave up first.
func wait(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return true
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
