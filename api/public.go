package api

import (
	"fmt"
	"net/http"
	"strings"

	"github.com/labstack/echo/v4"

	"github.com/heraldpush/herald/jobs/apps"
	"github.com/heraldpush/herald/web"
)

// deviceRoutes are the routes a phone, a browser or a service worker may
// call, and the form a user opens on one: they take no API key, which a
// device must never hold. The main
// listener serves them beside everything else; the public one
// (PublicHandler) serves them alone.
func (s *Server) deviceRoutes(e *echo.Echo) {
	// Receipts: the token in each is the credential. They are limited by
	// client address before the body is read, and a service worker may
	// post them from any origin (receipts.go).
	e.POST("/v1/receipts", s.postReceipts, anyOrigin,
		s.receiptLimiter.limitBy(receiptAddress, "each client address", s.receiptMetrics.rateLimited))
	e.OPTIONS("/v1/receipts", receiptsPreflight)

	// The VAPID public key a page subscribes with, per app: public by
	// nature (every subscription carries it), read from any origin, and
	// limited by client address as receipts are, in the same buckets (its
	// refusals are counted by the HTTP metrics, not as receipts').
	e.GET("/v1/vapid-public-key", s.vapidPublicKey, anyOrigin,
		s.receiptLimiter.limitBy(receiptAddress, "each client address", nil))

	// The web kit (web/sdk): the service worker, the page script and an
	// example page that uses them.
	sdk := s.sdk()
	e.GET("/sdk/*", sdk)
	e.HEAD("/sdk/*", sdk)

	// A user's own preferences form (preferenceform.go, web/preferences):
	// the page, its script and style, and what it reads and writes with
	// the token of the link it was opened from, which is the credential.
	// Those are limited by client address with the receipts; only the
	// form's own origin may read them (no CORS).
	page, files := s.preferencesForm()
	e.GET(preferencesFormPath, page)
	e.HEAD(preferencesFormPath, page)
	e.GET(preferencesFormPath+"/*", files)
	e.HEAD(preferencesFormPath+"/*", files)
	byAddress := s.receiptLimiter.limitBy(receiptAddress, "each client address", nil)
	e.GET("/v1/preferences", s.getOwnPreferences, byAddress)
	e.PUT("/v1/preferences", s.putOwnPreferences, byAddress)
}

// publicRoutes are the public listener's: the device routes, and nothing
// else, so that whatever is not one of them is a 404 there.
func (s *Server) publicRoutes() {
	if s.cfg.WorkerOnly {
		return
	}
	s.deviceRoutes(s.public)
}

// PublicHandler serves what a device may call and 404s every other route:
// the handler of HERALD_PUBLIC_ADDR, the one listener to expose to the
// internet while the keyed API, the dashboard, River UI and the metrics
// stay private.
func (s *Server) PublicHandler() http.Handler { return s.public }

type vapidKeyResponse struct {
	App            string `json:"app"`
	VAPIDPublicKey string `json:"vapid_public_key"`
}

// vapidPublicKey answers the VAPID public key of ?app= (the default app
// when absent): the active one, which a new subscription is made with.
func (s *Server) vapidPublicKey(c echo.Context) error {
	name := c.QueryParam("app")
	if name == "" {
		name = apps.DefaultName
	}
	if s.cfg.Apps == nil {
		return notFound("app", name)
	}
	id, ok := s.cfg.Apps.ID(name)
	if !ok {
		return notFound("app", name)
	}
	key, _, ok := s.cfg.Apps.WebPushKey(id)
	if !ok {
		return &Error{Status: http.StatusNotFound, Code: "not_found", Field: "app",
			Message: fmt.Sprintf("app %q has no Web Push key: store a VAPID credential for it (POST /v1/apps/%s/credentials)", name, name)}
	}
	// A rotation changes the key within seconds; a page should not keep an
	// old one for long.
	c.Response().Header().Set("Cache-Control", "public, max-age=60")
	return c.JSON(http.StatusOK, vapidKeyResponse{App: name, VAPIDPublicKey: key})
}

// sdk serves the web kit's files. They change with Herald's release, so a
// browser checks again before it uses a copy; a service worker's script is
// checked on every registration anyway.
func (s *Server) sdk() echo.HandlerFunc {
	// The embedded files are under sdk/, as the request paths are.
	files := http.FileServerFS(web.SDK())
	return func(c echo.Context) error {
		if name := c.Param("*"); name == "" || strings.HasSuffix(name, "/") {
			return echo.ErrNotFound // no directory listings
		}
		h := c.Response().Header()
		h.Set("Cache-Control", "no-cache")
		h.Set("X-Content-Type-Options", "nosniff")
		files.ServeHTTP(c.Response(), c.Request())
		return nil
	}
}
