package api

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/labstack/echo/v4"

	"github.com/heraldpush/herald/db"
)

const (
	// adminUser is HERALD_ADMIN_PASSWORD's operator (Config.AdminPassword);
	// no named operator may take its name.
	adminUser = "admin"
	// sessionCookie names the cookie that carries a dashboard session.
	sessionCookie = "herald_session"
	// sessionLifetime bounds a session: an operator signs in again each day.
	sessionLifetime = 12 * time.Hour
	// csrfHeader carries the session's CSRF token on every state-changing
	// call the dashboard makes.
	csrfHeader = "X-CSRF-Token"
	// dashboardScope is the idempotency scope of calls made through the
	// dashboard: it cannot equal an API key's scope (16 hex digits, or
	// key:<name>), so a key used in the dashboard never replays an API
	// caller's request.
	dashboardScope = "dashboard"
	// sessionKeyPurpose names the signing key of sessions and their CSRF
	// tokens in the database (signing_keys).
	sessionKeyPurpose = "dashboard_session"
	// maxPasswordChecks is how many operators' passwords a process hashes
	// at once; passwordCheckWait how long a sign-in waits for its turn
	// before it is told to try again.
	maxPasswordChecks = 2
	passwordCheckWait = 5 * time.Second
)

// sessions keeps dashboard sessions in the database, so that any process
// serves any session and signing out ends it everywhere. A session token is
// "nonce.mac": 32 random bytes and their HMAC under a key every process
// shares (signing_keys), so that a forged cookie is refused without a query;
// the database keeps the token's SHA-256 with its operator, expiry and
// revocation, and decides whether a genuine token is still valid. The CSRF
// token is a second HMAC of the session token, so each session has its own
// and any process can check it without storing it.
type sessions struct {
	pool *pgxpool.Pool
	// adminPassword is the digest of HERALD_ADMIN_PASSWORD, the password of
	// operator admin; nil when it is unset.
	adminPassword *[sha256.Size]byte
	now           func() time.Time
	// key is the shared signing key, nil until read (loadKey).
	key atomic.Pointer[[]byte]
	// passwordChecks holds a place for each password being hashed;
	// checkWait is how long a sign-in waits for one (passwordCheckWait).
	passwordChecks chan struct{}
	checkWait      time.Duration

	mu sync.Mutex
	// failed counts recent failed logins per remote address, so that
	// passwords cannot be guessed at network speed.
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

func newSessions(pool *pgxpool.Pool, adminPassword string) *sessions {
	s := &sessions{pool: pool, now: time.Now, failed: map[string]*loginFailures{},
		passwordChecks: make(chan struct{}, maxPasswordChecks), checkWait: passwordCheckWait}
	if adminPassword != "" {
		d := sha256.Sum256([]byte(adminPassword))
		s.adminPassword = &d
	}
	return s
}

// loadKey reads the shared signing key, drawing it first if no process has.
func (s *sessions) loadKey(ctx context.Context) error {
	if s.key.Load() != nil {
		return nil
	}
	key, err := db.SharedKey(ctx, s.pool, sessionKeyPurpose, 32)
	if err != nil {
		return err
	}
	s.key.Store(&key)
	return nil
}

// signingKey is the shared signing key, read on first use.
func (s *sessions) signingKey(ctx context.Context) ([]byte, error) {
	if err := s.loadKey(ctx); err != nil {
		return nil, err
	}
	return *s.key.Load(), nil
}

// errBusy answers a sign-in while maxPasswordChecks others are hashed.
var errBusy = &Error{Status: http.StatusServiceUnavailable, Code: "busy", RetryAfter: 1,
	Message: "too many sign-ins at once; try again in a second"}

// checkPassword reports whether password is user's: HERALD_ADMIN_PASSWORD
// for admin, compared in constant time (digests hide its length too), or
// a named operator's, against its argon2id hash. A name that no operator
// has costs a hash all the same.
func (s *sessions) checkPassword(ctx context.Context, user, password string) (bool, error) {
	if user == adminUser {
		if s.adminPassword == nil {
			return false, nil
		}
		p := sha256.Sum256([]byte(password))
		return subtle.ConstantTimeCompare(p[:], s.adminPassword[:]) == 1, nil
	}
	// The turn is taken first, so that a flood of sign-ins costs neither
	// more hashes nor more queries than there are turns.
	wait := time.NewTimer(s.checkWait)
	defer wait.Stop()
	select {
	case s.passwordChecks <- struct{}{}:
		defer func() { <-s.passwordChecks }()
	case <-wait.C:
		return false, errBusy
	case <-ctx.Done():
		return false, ctx.Err()
	}
	encoded := decoyHash()
	known := false
	if checkOperatorName(user) == nil && len(password) <= maxPasswordLength {
		stored, err := db.On(s.pool).OperatorPasswordHash(ctx, user)
		switch {
		case err == nil:
			encoded, known = stored, true
		case !errors.Is(err, db.ErrNotFound):
			return false, fmt.Errorf("read operator: %w", err)
		}
	}
	ok, err := verifyPassword(encoded, password)
	if err != nil {
		return false, fmt.Errorf("operator %q: %w", user, err)
	}
	return ok && known, nil
}

func mac(key []byte, parts ...string) string {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(strings.Join(parts, "\x00")))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// credential tags a session of admin with the HERALD_ADMIN_PASSWORD it was
// opened with (an HMAC of its digest), so that a session opened with a
// password since changed is no longer valid; a named operator's is nil
// (removing the operator ends its sessions).
func (s *sessions) credential(key []byte, operator string) []byte {
	if operator != adminUser || s.adminPassword == nil {
		return nil
	}
	return []byte(mac(key, "credential", string(s.adminPassword[:])))
}

// tokenDigest is what the database keeps of a session token.
func tokenDigest(token string) []byte {
	d := sha256.Sum256([]byte(token))
	return d[:]
}

// issue starts a session for operator and returns its token and expiry.
func (s *sessions) issue(ctx context.Context, operator string) (string, time.Time, error) {
	key, err := s.signingKey(ctx)
	if err != nil {
		return "", time.Time{}, err
	}
	raw := make([]byte, 32)
	_, _ = rand.Read(raw)
	nonce := base64.RawURLEncoding.EncodeToString(raw)
	token := nonce + "." + mac(key, "session", nonce)
	expires := s.now().Add(sessionLifetime).Truncate(time.Second)
	err = db.On(s.pool).InsertDashboardSession(ctx, db.InsertDashboardSessionParams{
		Digest: tokenDigest(token), Operator: operator, Credential: s.credential(key, operator), ExpiresAt: expires,
	})
	if err != nil {
		return "", time.Time{}, fmt.Errorf("store session: %w", err)
	}
	return token, expires, nil
}

// operatorOf returns the operator of token when it is a live session: one
// this installation issued (its MAC, checked without a query), neither
// expired nor signed out (its row), and, for admin, opened with this
// process's HERALD_ADMIN_PASSWORD.
func (s *sessions) operatorOf(ctx context.Context, token string) (string, bool, error) {
	key, err := s.signingKey(ctx)
	if err != nil {
		return "", false, err
	}
	nonce, sum, ok := cutLast(token, ".")
	if !ok || !hmac.Equal([]byte(sum), []byte(mac(key, "session", nonce))) {
		return "", false, nil
	}
	row, err := db.On(s.pool).LiveDashboardSession(ctx, db.LiveDashboardSessionParams{
		Digest: tokenDigest(token), Now: s.now(),
	})
	switch {
	case errors.Is(err, db.ErrNotFound):
		return "", false, nil
	case err != nil:
		return "", false, fmt.Errorf("read session: %w", err)
	}
	if row.Operator == adminUser {
		want := s.credential(key, adminUser)
		if want == nil || !hmac.Equal(row.Credential, want) {
			return "", false, nil
		}
	}
	return row.Operator, true, nil
}

// revoke ends a session on every process before its expiry.
func (s *sessions) revoke(ctx context.Context, token string) error {
	if err := db.On(s.pool).RevokeDashboardSession(ctx, tokenDigest(token)); err != nil {
		return fmt.Errorf("end session: %w", err)
	}
	return nil
}

// csrfToken is the CSRF token of a session; the signing key is loaded, as
// the session was checked.
func (s *sessions) csrfToken(session string) string { return mac(*s.key.Load(), "csrf", session) }

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

// sessionOf returns the request's session token and its operator when the
// token is a live session.
func (s *Server) sessionOf(c echo.Context) (token, operator string, ok bool, err error) {
	ck, cerr := c.Cookie(sessionCookie)
	if errors.Is(cerr, http.ErrNoCookie) {
		return "", "", false, nil
	}
	if cerr != nil {
		return "", "", false, fmt.Errorf("read session cookie: %w", cerr)
	}
	operator, ok, err = s.sessions.operatorOf(c.Request().Context(), ck.Value)
	return ck.Value, operator, ok, err
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

// requireSession lets signed-in requests through, as their operator with
// scope admin and the dashboard's idempotency scope. Others are refused: a
// page is redirected to the login form, and anything else (the dashboard's
// and River UI's APIs, any state-changing call) gets 401.
func (s *Server) requireSession(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		token, operator, ok, err := s.sessionOf(c)
		if err != nil {
			return err
		}
		if !ok {
			req := c.Request()
			if req.Method == http.MethodGet && !strings.Contains(req.URL.Path, "/api/") {
				return c.Redirect(http.StatusSeeOther, "/login?next="+url.QueryEscape(req.URL.RequestURI()))
			}
			return &Error{Status: http.StatusUnauthorized, Code: "unauthorized", Message: "sign in to the dashboard at /login"}
		}
		req := c.Request()
		ctx := withCaller(req.Context(), caller{operator: operator, scope: ScopeAdmin, scopeName: dashboardScope})
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
