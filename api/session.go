package api

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/labstack/echo/v4"
)

const (
	// adminUser is the one dashboard user; its password is
	// Config.AdminPassword.
	adminUser = "admin"
	// sessionCookie names the cookie that carries a dashboard session.
	sessionCookie = "herald_session"
	// sessionLifetime bounds a session: an operator signs in again each day.
	sessionLifetime = 12 * time.Hour
	// csrfHeader carries the session's CSRF token on every state-changing
	// call the dashboard makes.
	csrfHeader = "X-CSRF-Token"
	// dashboardScope is the idempotency scope of calls made through the
	// dashboard: it cannot equal an API key's scope (16 hex digits), so a
	// key used in the dashboard never replays an API caller's request.
	dashboardScope = "dashboard"
)

// sessions signs and checks dashboard sessions. A session token is
// "expiry.nonce.mac": the HMAC of the first two under a key drawn at random
// when the process starts, so tokens need no storage and a restart signs
// everyone out. Logging out revokes the token's nonce until it would have
// expired anyway. The CSRF token is a second HMAC of the session token,
// so each session has its own and the server can check it without storing it.
type sessions struct {
	key      []byte
	password [sha256.Size]byte
	now      func() time.Time

	mu      sync.Mutex
	revoked map[string]time.Time // nonce -> the token's expiry
	// failed counts recent failed logins per remote address, so that the
	// one password cannot be guessed at network speed.
	failed map[string]*loginFailures
}

// loginFailures is one remote address's run of failed logins.
type loginFailures struct {
	count int
	last  time.Time
}

// Login throttling: after freeLoginFailures failures from one address, each
// further attempt must wait twice as long as the last, up to
// maxLoginLockout; a success or an hour without failures forgets them.
const (
	freeLoginFailures = 5
	maxLoginLockout   = 15 * time.Minute
	loginFailureTTL   = time.Hour
)

// loginWait is how long remote must wait before its next login attempt.
func (s *sessions) loginWait(remote string) time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	f := s.failed[remote]
	if f == nil || f.count < freeLoginFailures {
		return 0
	}
	lockout := min(time.Minute<<(f.count-freeLoginFailures), maxLoginLockout)
	return max(f.last.Add(lockout).Sub(s.now()), 0)
}

// loginFailed and loginSucceeded keep the count loginWait reads.
func (s *sessions) loginFailed(remote string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	if len(s.failed) > 10_000 {
		for k, f := range s.failed {
			if now.Sub(f.last) > loginFailureTTL {
				delete(s.failed, k)
			}
		}
	}
	f := s.failed[remote]
	if f == nil || now.Sub(f.last) > loginFailureTTL {
		f = &loginFailures{}
		s.failed[remote] = f
	}
	f.count++
	f.last = now
}

func (s *sessions) loginSucceeded(remote string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.failed, remote)
}

func newSessions(password string) *sessions {
	key := make([]byte, 32)
	_, _ = rand.Read(key) // crypto/rand.Read never fails (Go 1.24+).
	return &sessions{key: key, password: sha256.Sum256([]byte(password)), now: time.Now, revoked: map[string]time.Time{}, failed: map[string]*loginFailures{}}
}

// checkPassword compares the user and password in constant time; comparing
// digests hides the password's length too.
func (s *sessions) checkPassword(user, password string) bool {
	u := sha256.Sum256([]byte(user))
	wantUser := sha256.Sum256([]byte(adminUser))
	p := sha256.Sum256([]byte(password))
	userOK := subtle.ConstantTimeCompare(u[:], wantUser[:])
	passOK := subtle.ConstantTimeCompare(p[:], s.password[:])
	return userOK&passOK == 1
}

func (s *sessions) mac(parts ...string) string {
	m := hmac.New(sha256.New, s.key)
	m.Write([]byte(strings.Join(parts, "\x00")))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// issue returns a new session token and its expiry.
func (s *sessions) issue() (string, time.Time) {
	nonce := make([]byte, 16)
	_, _ = rand.Read(nonce)
	expires := s.now().Add(sessionLifetime).Truncate(time.Second)
	payload := strconv.FormatInt(expires.Unix(), 10) + "." + base64.RawURLEncoding.EncodeToString(nonce)
	return payload + "." + s.mac("session", payload), expires
}

// valid reports whether token is a session this process issued, unexpired
// and not logged out.
func (s *sessions) valid(token string) bool {
	payload, mac, ok := cutLast(token, ".")
	if !ok || !hmac.Equal([]byte(mac), []byte(s.mac("session", payload))) {
		return false
	}
	exp, nonce, _ := strings.Cut(payload, ".")
	unix, err := strconv.ParseInt(exp, 10, 64)
	if err != nil || !s.now().Before(time.Unix(unix, 0)) {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	_, revoked := s.revoked[nonce]
	return !revoked
}

// revoke ends a valid session before its expiry, and forgets revocations
// whose tokens have expired by themselves.
func (s *sessions) revoke(token string) {
	payload, _, _ := cutLast(token, ".")
	exp, nonce, _ := strings.Cut(payload, ".")
	unix, _ := strconv.ParseInt(exp, 10, 64)
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	for n, until := range s.revoked {
		if !now.Before(until) {
			delete(s.revoked, n)
		}
	}
	s.revoked[nonce] = time.Unix(unix, 0)
}

// csrfToken is the CSRF token of a session.
func (s *sessions) csrfToken(session string) string { return s.mac("csrf", session) }

// checkCSRF compares a presented CSRF token with the session's.
func (s *sessions) checkCSRF(session, presented string) bool {
	return presented != "" && hmac.Equal([]byte(presented), []byte(s.csrfToken(session)))
}

func cutLast(s, sep string) (before, after string, found bool) {
	i := strings.LastIndex(s, sep)
	if i < 0 {
		return s, "", false
	}
	return s[:i], s[i+len(sep):], true
}

// sessionOf returns the request's session token when it is valid.
func (s *Server) sessionOf(c echo.Context) (string, bool) {
	ck, err := c.Cookie(sessionCookie)
	if err != nil || !s.sessions.valid(ck.Value) {
		return "", false
	}
	return ck.Value, true
}

// setSessionCookie sets (or, with an empty token, clears) the session
// cookie. It is HttpOnly so that scripts cannot read it, SameSite=Strict so
// that other sites' requests do not carry it, and Secure whenever the request
// came over TLS (directly or through a trusted proxy that says so) or the
// operator asked for it (Config.SecureCookies), so that it never travels in
// clear once HTTPS is in use. c.Scheme believes X-Forwarded-Proto only from
// trusted proxies (proxy.go): anyone else could otherwise mark the cookie
// Secure on a plain-HTTP site and sign the operator out of it.
func (s *Server) setSessionCookie(c echo.Context, token string, expires time.Time) {
	ck := &http.Cookie{
		Name: sessionCookie, Value: token, Path: "/",
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: s.cfg.SecureCookies || c.Scheme() == "https",
	}
	if token == "" {
		ck.MaxAge = -1
	} else {
		ck.Expires = expires
	}
	c.SetCookie(ck)
}

type sessionKey struct{}

// requireSession lets signed-in requests through, with the dashboard's
// idempotency scope. Others are refused: a page is redirected to the login
// form, and anything else (the dashboard's and River UI's APIs, any
// state-changing call) gets 401.
func (s *Server) requireSession(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		token, ok := s.sessionOf(c)
		if !ok {
			req := c.Request()
			if req.Method == http.MethodGet && !strings.Contains(req.URL.Path, "/api/") {
				return c.Redirect(http.StatusSeeOther, "/login?next="+url.QueryEscape(req.URL.RequestURI()))
			}
			return &Error{Status: http.StatusUnauthorized, Code: "unauthorized", Message: "sign in to the dashboard at /login"}
		}
		req := c.Request()
		ctx := context.WithValue(req.Context(), callerKey{}, dashboardScope)
		ctx = context.WithValue(ctx, sessionKey{}, token)
		c.SetRequest(req.WithContext(ctx))
		return next(c)
	}
}

// requireCSRF refuses a state-changing request whose X-CSRF-Token header is
// not its session's token. SameSite=Strict alone would leave older browsers
// and same-site subdomains open; a token a forged request cannot know closes
// that. It runs after requireSession.
func (s *Server) requireCSRF(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		switch c.Request().Method {
		case http.MethodGet, http.MethodHead, http.MethodOptions:
			return next(c)
		}
		token, _ := c.Request().Context().Value(sessionKey{}).(string)
		if !s.sessions.checkCSRF(token, c.Request().Header.Get(csrfHeader)) {
			return &Error{Status: http.StatusForbidden, Code: "csrf_failed",
				Message: "a state-changing dashboard call needs the session's token in the " + csrfHeader + " header"}
		}
		return next(c)
	}
}

// sameOrigin refuses cross-origin state-changing requests from browsers
// (by their Sec-Fetch-Site or Origin headers). It guards the login form,
// which has no session yet, and River UI's API, whose front end cannot send
// Herald's CSRF token; on the dashboard's own API it adds to the token.
func sameOrigin() echo.MiddlewareFunc {
	cop := http.NewCrossOriginProtection()
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			if err := cop.Check(c.Request()); err != nil {
				return &Error{Status: http.StatusForbidden, Code: "cross_origin", Message: "cross-origin requests are refused"}
			}
			return next(c)
		}
	}
}

// dashboardOn answers 503, saying why, while no admin password is set: the
// dashboard and River UI are off rather than open.
func (s *Server) dashboardOn(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		if s.sessions == nil {
			return &Error{Status: http.StatusServiceUnavailable, Code: "dashboard_disabled",
				Message: "the dashboard and River UI are disabled: set HERALD_ADMIN_PASSWORD to enable them"}
		}
		return next(c)
	}
}
