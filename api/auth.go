package api

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"net/http"
	"strings"

	"github.com/labstack/echo/v4"
)

// apiKeys checks bearer tokens against the configured keys. Keys are kept
// as SHA-256 digests and every key is compared, in constant time, so that
// neither the comparison nor the loop reveals how close a guess came.
type apiKeys struct {
	digests [][sha256.Size]byte
}

func newAPIKeys(keys []string) apiKeys {
	var k apiKeys
	for _, key := range keys {
		if key != "" {
			k.digests = append(k.digests, sha256.Sum256([]byte(key)))
		}
	}
	return k
}

// match returns the index of the key that token is, or -1.
func (k apiKeys) match(token string) int {
	d := sha256.Sum256([]byte(token))
	found := -1
	for i := range k.digests {
		if subtle.ConstantTimeCompare(d[:], k.digests[i][:]) == 1 {
			found = i
		}
	}
	return found
}

type callerKey struct{}

// callerScope returns a stable, non-secret name for the API key that made
// the request, so that per-caller state (idempotency keys) is kept apart.
func callerScope(ctx context.Context) string {
	s, _ := ctx.Value(callerKey{}).(string)
	return s
}

// requireAPIKey guards /v1/*: a request needs Authorization: Bearer <key>
// with one of the configured keys. With no keys configured, everything is
// refused (and startup said why).
func (k apiKeys) requireAPIKey(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		auth := c.Request().Header.Get(echo.HeaderAuthorization)
		scheme, token, ok := strings.Cut(auth, " ")
		if !ok || !strings.EqualFold(scheme, "Bearer") || token == "" {
			c.Response().Header().Set(echo.HeaderWWWAuthenticate, `Bearer realm="herald"`)
			return &Error{Status: http.StatusUnauthorized, Code: "unauthorized",
				Message: "an API key is required: Authorization: Bearer <key>"}
		}
		i := k.match(strings.TrimSpace(token))
		if i < 0 {
			c.Response().Header().Set(echo.HeaderWWWAuthenticate, `Bearer realm="herald", error="invalid_token"`)
			return &Error{Status: http.StatusUnauthorized, Code: "unauthorized", Message: "the API key is not valid"}
		}
		scope := hex.EncodeToString(k.digests[i][:8])
		req := c.Request()
		c.SetRequest(req.WithContext(context.WithValue(req.Context(), callerKey{}, scope)))
		return next(c)
	}
}
