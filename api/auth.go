package api

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/labstack/echo/v4"

	"github.com/heraldpush/herald/db"
)

// Scope is what an API key may do. Each scope may do all that the one before
// it may: read may only read (GET); send may do what an application does
// (messages, schedules, devices, users, segments: create, update, cancel,
// delete a device); admin may also erase (users, segments), manage keys and
// read the audit log. Every /v1 route names the scope it needs in routes.go.
type Scope string

// The scopes: read, send and admin each include the one before; apps
// manages apps and their credentials (docs/apps.md) and includes read, and
// admin includes it too.
const (
	ScopeRead  Scope = "read"
	ScopeSend  Scope = "send"
	ScopeApps  Scope = "apps"
	ScopeAdmin Scope = "admin"
)

var scopes = []Scope{ScopeRead, ScopeSend, ScopeAdmin}

// ParseScope reads a scope's name.
func ParseScope(s string) (Scope, error) {
	if !slices.Contains(scopes, Scope(s)) && Scope(s) != ScopeApps {
		return "", fmt.Errorf("scope %q is not one of read, send, apps, admin", s)
	}
	return Scope(s), nil
}

// allows reports whether a key of scope s may make a call that needs need.
func (s Scope) allows(need Scope) bool {
	switch {
	case s == ScopeAdmin || s == need:
		return true
	case need == ScopeApps:
		return false
	case s == ScopeApps:
		return need == ScopeRead
	}
	return slices.Index(scopes, s) >= slices.Index(scopes, need)
}

// Key refresh: each process reads the live keys every keyRefreshEvery, so a
// key revoked or made by another process (or by `herald keys`) counts here
// within about that; when keys were last used is written every
// keyUseFlushEvery.
const (
	keyRefreshEvery  = time.Second
	keyUseFlushEvery = time.Minute
)

// bootstrapPrefix starts the name of each of HERALD_API_KEYS's keys, which
// a stored key's name cannot contain (a colon).
const bootstrapPrefix = "bootstrap:"

// apiKey is a key as a process checks it: never its secret, only the
// secret's SHA-256.
type apiKey struct {
	name    string
	scope   Scope
	digest  [sha256.Size]byte
	expires time.Time // zero: never
	// caller keeps the key's idempotency keys and rate apart from others'.
	caller string
	// stored is false for HERALD_API_KEYS's keys.
	stored bool
	// apps are the ids of the apps the key may act for; nil for all.
	apps []int32
}

// keyring holds the keys a process accepts: HERALD_API_KEYS's, with scope
// admin, and the stored keys as last read from the database. A request's
// key is looked up here alone, so a flood of unknown keys never reaches the
// database; each lookup compares the presented key's digest with every
// key's, in constant time, so that neither the comparison nor the loop
// reveals how close a guess came.
type keyring struct {
	pool      *pgxpool.Pool
	logger    *slog.Logger
	now       func() time.Time
	bootstrap []apiKey
	keys      atomic.Pointer[[]apiKey]
	// failing is set while refreshing fails, so that a streak of failures
	// is logged once.
	failing atomic.Bool

	mu   sync.Mutex
	used map[string]time.Time // stored key's name -> when it was last used
}

func newKeyring(pool *pgxpool.Pool, logger *slog.Logger, bootstrap []string) *keyring {
	k := &keyring{pool: pool, logger: logger, now: time.Now, used: map[string]time.Time{}}
	for _, secret := range bootstrap {
		if secret == "" {
			continue
		}
		d := sha256.Sum256([]byte(secret))
		// The fingerprint is what the key's idempotency keys were kept
		// under before keys had names, so they still answer retries.
		fingerprint := hex.EncodeToString(d[:8])
		k.bootstrap = append(k.bootstrap, apiKey{name: bootstrapPrefix + fingerprint, scope: ScopeAdmin, digest: d, caller: fingerprint})
	}
	keys := slices.Clone(k.bootstrap)
	k.keys.Store(&keys)
	return k
}

// refresh reads the live stored keys; until it first succeeds, only
// HERALD_API_KEYS's are accepted.
func (k *keyring) refresh(ctx context.Context) error {
	rows, err := db.On(k.pool).LiveAPIKeys(ctx)
	if err != nil {
		return fmt.Errorf("read API keys: %w", err)
	}
	keys := slices.Clone(k.bootstrap)
	for _, r := range rows {
		key := apiKey{name: r.Name, scope: Scope(r.Scope), caller: "key:" + r.Name, stored: true, apps: r.AppIds}
		copy(key.digest[:], r.Digest)
		if r.ExpiresAt != nil {
			key.expires = *r.ExpiresAt
		}
		keys = append(keys, key)
	}
	k.keys.Store(&keys)
	return nil
}

// match returns the key whose secret token is.
func (k *keyring) match(token string) (apiKey, bool) {
	d := sha256.Sum256([]byte(token))
	keys := *k.keys.Load()
	found := -1
	for i := range keys {
		if subtle.ConstantTimeCompare(d[:], keys[i].digest[:]) == 1 {
			found = i
		}
	}
	if found < 0 {
		return apiKey{}, false
	}
	return keys[found], true
}

// markUsed notes that a stored key was used now, for flushUse to write.
func (k *keyring) markUsed(name string) {
	now := k.now()
	k.mu.Lock()
	defer k.mu.Unlock()
	k.used[name] = now
}

// flushUse writes when keys were last used, as noted since the last flush.
func (k *keyring) flushUse(ctx context.Context) error {
	k.mu.Lock()
	used := k.used
	k.used = map[string]time.Time{}
	k.mu.Unlock()
	if len(used) == 0 {
		return nil
	}
	p := db.TouchAPIKeysParams{}
	for name, at := range used {
		p.Names, p.UsedAt = append(p.Names, name), append(p.UsedAt, at)
	}
	if err := db.On(k.pool).TouchAPIKeys(ctx, p); err != nil {
		return fmt.Errorf("record when API keys were used: %w", err)
	}
	return nil
}

// run refreshes the keys every keyRefreshEvery and writes their use every
// keyUseFlushEvery until ctx ends, and once more then. A failed refresh
// keeps the keys last read.
func (k *keyring) run(ctx context.Context) {
	refresh := time.NewTicker(keyRefreshEvery)
	defer refresh.Stop()
	flush := time.NewTicker(keyUseFlushEvery)
	defer flush.Stop()
	for {
		select {
		case <-ctx.Done():
			final, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			k.report(final, "API key use not recorded", k.flushUse(final))
			return
		case <-refresh.C:
			k.report(ctx, "API keys not refreshed; the keys last read still count", k.refresh(ctx))
		case <-flush.C:
			k.report(ctx, "API key use not recorded", k.flushUse(ctx))
		}
	}
}

// report logs the first of a streak of failures, and the recovery.
func (k *keyring) report(ctx context.Context, msg string, err error) {
	switch {
	case err != nil && ctx.Err() != nil:
	case err != nil && !k.failing.Swap(true):
		k.logger.WarnContext(ctx, msg, "error", err)
	case err == nil && k.failing.Swap(false):
		k.logger.InfoContext(ctx, "API keys read again")
	}
}

// caller is who made a request: an API key, or an operator through the
// dashboard (whose scope is admin).
type caller struct {
	// key is the API key's name; operator the dashboard operator's. One of
	// the two is set.
	key, operator string
	scope         Scope
	// scopeName keeps the caller's idempotency keys and rate apart from
	// other callers'.
	scopeName string
	// apps are the ids of the apps the caller may act for; nil for all.
	apps []int32
}

// mayActFor reports whether the caller may act for app id.
func (c caller) mayActFor(id int32) bool { return c.apps == nil || slices.Contains(c.apps, id) }

type callerKey struct{}

func withCaller(ctx context.Context, c caller) context.Context {
	return context.WithValue(ctx, callerKey{}, c)
}

func callerOf(ctx context.Context) caller {
	c, _ := ctx.Value(callerKey{}).(caller)
	return c
}

// callerScope returns a stable, non-secret name for the caller that made
// the request, so that per-caller state (idempotency keys, rates) is kept
// apart.
func callerScope(ctx context.Context) string { return callerOf(ctx).scopeName }

// requireAPIKey guards /v1/*: a request needs Authorization: Bearer <key>
// with a live key. A missing, unknown, revoked or expired key is 401.
func (s *Server) requireAPIKey(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		auth := c.Request().Header.Get(echo.HeaderAuthorization)
		scheme, token, ok := strings.Cut(auth, " ")
		if !ok || !strings.EqualFold(scheme, "Bearer") || token == "" {
			c.Response().Header().Set(echo.HeaderWWWAuthenticate, `Bearer realm="herald"`)
			return &Error{Status: http.StatusUnauthorized, Code: "unauthorized",
				Message: "an API key is required: Authorization: Bearer <key>"}
		}
		key, ok := s.keys.match(strings.TrimSpace(token))
		if !ok {
			c.Response().Header().Set(echo.HeaderWWWAuthenticate, `Bearer realm="herald", error="invalid_token"`)
			return &Error{Status: http.StatusUnauthorized, Code: "unauthorized", Message: "the API key is not valid"}
		}
		if !key.expires.IsZero() && !s.keys.now().Before(key.expires) {
			c.Response().Header().Set(echo.HeaderWWWAuthenticate, `Bearer realm="herald", error="invalid_token"`)
			return &Error{Status: http.StatusUnauthorized, Code: "unauthorized",
				Message: fmt.Sprintf("the API key %q expired at %s", key.name, key.expires.UTC().Format(time.RFC3339))}
		}
		if key.stored {
			s.keys.markUsed(key.name)
		}
		req := c.Request()
		c.SetRequest(req.WithContext(withCaller(req.Context(), caller{key: key.name, scope: key.scope, scopeName: key.caller, apps: key.apps})))
		return next(c)
	}
}

// needs refuses, with 403 forbidden, a call whose key's scope does not
// reach need. It runs after requireAPIKey, on each /v1 route.
func needs(need Scope) echo.MiddlewareFunc {
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			who := callerOf(c.Request().Context())
			if !who.scope.allows(need) {
				return &Error{Status: http.StatusForbidden, Code: "forbidden", Extra: map[string]any{"scope_needed": need},
					Message: fmt.Sprintf("this call needs a key of scope %s; key %q has scope %s", need, who.key, who.scope)}
			}
			return next(c)
		}
	}
}
