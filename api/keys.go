package api

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/heraldpush/herald/db"
	"github.com/heraldpush/herald/jobs"
	"github.com/heraldpush/herald/jobs/apps"
)

// keyName is what a stored key may be called: letters, digits and . _ -,
// starting with a letter or digit, at most 64 characters. The migration
// holds the table to the same. No stored key's name has a colon, so none is
// ever a HERALD_API_KEYS key's (bootstrapName).
var (
	keyName       = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)
	bootstrapName = regexp.MustCompile(`^` + bootstrapPrefix + `[0-9a-f]{16}$`)
)

// secretPrefix starts every key's secret, so that a secret pasted where it
// should not be is recognisable (and secret scanners can be taught it).
const secretPrefix = "herald_"

// Key is an API key as it is listed: never its secret.
type Key struct {
	Name       string     `json:"name"`
	Scope      Scope      `json:"scope"`
	CreatedAt  time.Time  `json:"created_at"`
	ExpiresAt  *time.Time `json:"expires_at"`
	LastUsedAt *time.Time `json:"last_used_at"`
	RevokedAt  *time.Time `json:"revoked_at"`
	// Apps are the apps the key may act for; none: every app.
	Apps []string `json:"apps,omitempty"`
}

// appNames are the apps' names by id.
func appNames(ctx context.Context, dbtx db.DBTX) (map[int32]string, error) {
	ix, err := apps.ReadIndex(ctx, dbtx)
	return ix.ByID, err
}

// keyOf is a key as it is listed, its apps named by names.
func keyOf(r db.ApiKey, names map[int32]string) Key {
	utc := func(t *time.Time) *time.Time {
		if t == nil {
			return nil
		}
		u := t.UTC()
		return &u
	}
	k := Key{Name: r.Name, Scope: Scope(r.Scope), CreatedAt: r.CreatedAt.UTC(),
		ExpiresAt: utc(r.ExpiresAt), LastUsedAt: utc(r.LastUsedAt), RevokedAt: utc(r.RevokedAt)}
	for _, id := range r.AppIds {
		k.Apps = append(k.Apps, names[id])
	}
	return k
}

// keyOfRow is keyOf, reading the apps' names when the key has some.
func keyOfRow(ctx context.Context, dbtx db.DBTX, r db.ApiKey) (Key, error) {
	if len(r.AppIds) == 0 {
		return keyOf(r, nil), nil
	}
	names, err := appNames(ctx, dbtx)
	return keyOf(r, names), err
}

// NewKey is a key to make: POST /v1/keys's body, and `herald keys create`.
type NewKey struct {
	Name  string `json:"name"`
	Scope Scope  `json:"scope"`
	// ExpiresAt is when the key stops working; nil: never.
	ExpiresAt *time.Time `json:"expires_at"`
	// Apps limits the key to acting for these apps (registering their
	// devices, sending to them, managing them); none: every app.
	Apps []string `json:"apps"`
}

func (k *NewKey) validate() error {
	switch {
	case k.Name == "":
		return invalid("name", "name is required")
	case !keyName.MatchString(k.Name):
		return invalid("name", "name %q: use 1 to 64 letters, digits and . _ -, starting with a letter or digit", k.Name)
	}
	if _, err := ParseScope(string(k.Scope)); err != nil {
		return invalid("scope", "%v", err)
	}
	if k.ExpiresAt != nil {
		if err := jobs.CheckInstant("expires_at", *k.ExpiresAt); err != nil {
			return err
		}
		if !k.ExpiresAt.After(time.Now()) {
			return invalid("expires_at", "expires_at %s has passed", k.ExpiresAt.UTC().Format(time.RFC3339))
		}
	}
	return nil
}

// CreateKey makes a key and returns it with its secret, which is stored
// nowhere: only its SHA-256 is kept. A name that any key, even a revoked
// one, has is a 409.
func CreateKey(ctx context.Context, dbtx db.DBTX, k NewKey) (Key, string, error) {
	if err := k.validate(); err != nil {
		return Key{}, "", err
	}
	raw := make([]byte, 32)
	_, _ = rand.Read(raw) // crypto/rand.Read never fails (Go 1.24+).
	secret := secretPrefix + base64.RawURLEncoding.EncodeToString(raw)
	digest := sha256.Sum256([]byte(secret))
	ids, err := apps.Resolve(ctx, dbtx, "apps", k.Apps)
	if err != nil {
		return Key{}, "", err
	}
	if len(k.Apps) > 0 && k.Scope == ScopeAdmin {
		return Key{}, "", invalid("apps", "an admin key acts for every app; limit a key of scope read, send or apps")
	}
	row, err := db.On(dbtx).InsertAPIKey(ctx, db.InsertAPIKeyParams{
		Name: k.Name, Scope: string(k.Scope), Digest: digest[:], ExpiresAt: k.ExpiresAt, AppIds: ids,
	})
	if errors.Is(err, db.ErrConflict) {
		return Key{}, "", &Error{Status: http.StatusConflict, Code: "conflict", Field: "name",
			Message: fmt.Sprintf("a key named %q exists already (a revoked key keeps its name)", k.Name)}
	}
	if err != nil {
		return Key{}, "", fmt.Errorf("create key: %w", err)
	}
	key, err := keyOfRow(ctx, dbtx, row)
	return key, secret, err
}

// ListKeys returns every stored key, revoked ones included, oldest first.
// HERALD_API_KEYS's keys are not stored, so not listed.
func ListKeys(ctx context.Context, dbtx db.DBTX) ([]Key, error) {
	q := db.On(dbtx)
	names, err := appNames(ctx, dbtx)
	if err != nil {
		return nil, err
	}
	var out []Key
	var after int64
	for {
		rows, err := q.ListAPIKeys(ctx, db.ListAPIKeysParams{AfterID: after, PageSize: maxPageSize})
		if err != nil {
			return nil, fmt.Errorf("list keys: %w", err)
		}
		for _, r := range rows {
			out = append(out, keyOf(r, names))
			after = r.ID
		}
		if len(rows) < maxPageSize {
			return out, nil
		}
	}
}

// RevokeKey revokes the key named name; every process refuses it within
// about a second (keyring). Revoking a revoked key changes nothing.
func RevokeKey(ctx context.Context, dbtx db.DBTX, name string) (Key, error) {
	if strings.HasPrefix(name, bootstrapPrefix) {
		return Key{}, &Error{Status: http.StatusConflict, Code: "bootstrap_key",
			Message: fmt.Sprintf("key %q is one of HERALD_API_KEYS: remove it there and restart the processes", name)}
	}
	if !keyName.MatchString(name) {
		return Key{}, notFound("key", name)
	}
	row, err := db.On(dbtx).RevokeAPIKey(ctx, name)
	if errors.Is(err, db.ErrNotFound) {
		return Key{}, notFound("key", name)
	}
	if err != nil {
		return Key{}, fmt.Errorf("revoke key: %w", err)
	}
	return keyOfRow(ctx, dbtx, row)
}

// createdKey is a key as POST /v1/keys answers it: with its secret, once.
type createdKey struct {
	Key
	Secret string `json:"secret"`
}

// createKey makes a key; this process takes it at once, the others within
// about a second.
func (s *Server) createKey(c echo.Context) error {
	var req NewKey
	if err := decode(c, smallBodyLimit, &req); err != nil {
		return err
	}
	key, secret, err := CreateKey(c.Request().Context(), s.pool, req)
	if err != nil {
		return err
	}
	setAuditTarget(c, key.Name)
	s.refreshKeys(c)
	return c.JSON(http.StatusCreated, createdKey{Key: key, Secret: secret})
}

// revokeKey revokes a key; this process refuses it at once, the others
// within about a second.
func (s *Server) revokeKey(c echo.Context) error {
	if _, err := RevokeKey(c.Request().Context(), s.pool, c.Param("key_name")); err != nil {
		return err
	}
	s.refreshKeys(c)
	return c.NoContent(http.StatusNoContent)
}

// refreshKeys reads the keys again after a change made here; a failure is
// logged and left to the next refresh, a second away.
func (s *Server) refreshKeys(c echo.Context) {
	if err := s.keys.refresh(c.Request().Context()); err != nil {
		s.cfg.Logger.WarnContext(c.Request().Context(), "API keys not refreshed after a change; the next refresh will",
			"error", err, "request_id", c.Response().Header().Get(echo.HeaderXRequestID))
	}
}

type keyPage struct {
	Items      []Key   `json:"items"`
	NextCursor *string `json:"next_cursor"`
}

// listKeys lists the stored keys, oldest first, never their secrets.
func (s *Server) listKeys(c echo.Context) error {
	page, err := readPage(c, "keys")
	if err != nil {
		return err
	}
	rows, err := db.On(s.pool).ListAPIKeys(c.Request().Context(), db.ListAPIKeysParams{AfterID: page.afterOr(0), PageSize: page.fetch()})
	if err != nil {
		return fmt.Errorf("list keys: %w", err)
	}
	names, err := appNames(c.Request().Context(), s.pool)
	if err != nil {
		return err
	}
	rows, next := paginate(page, rows, func(r db.ApiKey) int64 { return r.ID })
	out := keyPage{Items: make([]Key, 0, len(rows)), NextCursor: next}
	for _, r := range rows {
		out.Items = append(out.Items, keyOf(r, names))
	}
	return c.JSON(http.StatusOK, out)
}
