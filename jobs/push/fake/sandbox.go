package fake

import (
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
)

// sandboxConn marks, in a connection's context, a connection to the APNs
// sandbox listener.
type sandboxConn struct{}

// onSandbox reports whether r came to the APNs sandbox host.
func onSandbox(r *http.Request) bool {
	v, _ := r.Context().Value(sandboxConn{}).(bool)
	return v
}

// sandboxTokens are the APNs tokens declared to be of the sandbox
// environment (lower-case hex). Apple's two environments each know only
// their own apps' tokens; fakepush has no builds of its apps, so a test
// declares which tokens a debug build would have, and every other token is
// a production one.
type sandboxTokens struct {
	mu sync.RWMutex
	m  map[string]struct{}
	// n is len(m), read without the lock so that a server with no sandbox
	// tokens pays nothing per push.
	n atomic.Int64
}

// has reports whether token was declared a sandbox token.
func (t *sandboxTokens) has(token string) bool {
	if t.n.Load() == 0 {
		return false
	}
	t.mu.RLock()
	defer t.mu.RUnlock()
	_, ok := t.m[strings.ToLower(token)]
	return ok
}

func (t *sandboxTokens) add(tokens []string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, tok := range tokens {
		t.m[strings.ToLower(tok)] = struct{}{}
	}
	t.n.Store(int64(len(t.m)))
}

func (t *sandboxTokens) reset() {
	t.mu.Lock()
	defer t.mu.Unlock()
	clear(t.m)
	t.n.Store(0)
}

// DeclareSandboxTokens makes tokens sandbox ones, as POST
// /_apns/sandbox-tokens does: from now on the sandbox host accepts them and
// the production host answers them 400 BadDeviceToken, as Apple does with a
// token of the other environment. Reset forgets them.
func (s *Server) DeclareSandboxTokens(tokens []string) error {
	for _, tok := range tokens {
		if !isHex(tok) {
			return fmt.Errorf("tokens: %q is not an APNs token (hex digits)", tok)
		}
	}
	s.sandbox.add(tokens)
	return nil
}

// SandboxTokens is the body of POST /_apns/sandbox-tokens.
type SandboxTokens struct {
	Tokens []string `json:"tokens"`
}

func (s *Server) handleSandboxTokens(w http.ResponseWriter, r *http.Request) {
	var body SandboxTokens
	if s.applyControl(w, r, &body, func() error { return s.DeclareSandboxTokens(body.Tokens) }) {
		w.WriteHeader(http.StatusNoContent)
	}
}

// wrongEnvironment reports whether token is not known to the host r came
// to: a sandbox token on the production host, or any other on the sandbox
// host.
func (s *Server) wrongEnvironment(r *http.Request, token string) bool {
	return s.sandbox.has(token) != onSandbox(r)
}

// sandboxServesAPNsOnly answers only APNs requests on the sandbox listener,
// as Apple's sandbox host serves nothing else; the control endpoints and the
// other providers are on the main address.
func (s *Server) sandboxServesAPNsOnly(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if onSandbox(r) && !strings.HasPrefix(r.URL.Path, "/3/") {
			http.NotFound(w, r)
			return
		}
		next.ServeHTTP(w, r)
	})
}
