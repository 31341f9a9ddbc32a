package api

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/labstack/echo/v4"

	"github.com/heraldpush/herald/db"
	"github.com/heraldpush/herald/jobs/preferences"
	"github.com/heraldpush/herald/web"
)

// The user's own form: what the people reminded set for themselves, on
// their phone, with no API key. The caller's backend asks for a link to it
// (POST /v1/users/{id}/preferences/link, keyed); the app opens the link;
// the form Herald serves at /preferences reads the token from the link's
// fragment and reads and replaces the user's opt-outs and quiet hours
// through /v1/preferences, with the token as the only credential
// (preferences.LinkSigner). The fragment never reaches a server, so the
// token is in no access log.

// preferencesFormPath is where the form is served, on both listeners; the
// link's URL is it under the public base URL.
const preferencesFormPath = "/preferences"

// A link's life: a month unless the caller says, from five minutes (a
// link made for one tap) to a year and a day.
const (
	defaultLinkTTL = 30 * 24 * time.Hour
	minLinkTTL     = 5 * time.Minute
	maxLinkTTL     = 366 * 24 * time.Hour
)

// formCSP keeps the form to its own script and style, and its calls to
// its own origin: nothing inline, nothing from elsewhere.
const formCSP = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; " +
	"base-uri 'none'; form-action 'none'"

type linkRequest struct {
	TTLSeconds *int64 `json:"ttl_seconds"`
}

func (r *linkRequest) validate() error {
	if r.TTLSeconds != nil {
		if ttl := time.Duration(*r.TTLSeconds) * time.Second; *r.TTLSeconds < int64(minLinkTTL/time.Second) || ttl > maxLinkTTL {
			return invalid("ttl_seconds", "ttl_seconds must be %d to %d (five minutes to 366 days), not %d",
				int64(minLinkTTL/time.Second), int64(maxLinkTTL/time.Second), *r.TTLSeconds)
		}
	}
	return nil
}

type linkResponse struct {
	URL       string    `json:"url"`
	Token     string    `json:"token"`
	ExpiresAt time.Time `json:"expires_at"`
}

// createPreferencesLink makes a link to the user's own form, good for
// ttl_seconds (defaultLinkTTL without a body): the form's URL under the
// public base URL (Config.PublicURL, else the request's own), with the
// token in its fragment.
func (s *Server) createPreferencesLink(c echo.Context) error {
	signer := s.linkSigner.Load()
	if signer == nil {
		return &Error{Status: http.StatusServiceUnavailable, Code: "unavailable", RetryAfter: unavailableRetryAfter,
			Message: "links cannot be signed yet: the database has not answered; try again after Retry-After seconds"}
	}
	userID := c.Param("user_id")
	if checkID("user_id", userID) != nil {
		return notFound("user", userID)
	}
	var req linkRequest
	if c.Request().ContentLength != 0 {
		if err := decode(c, smallBodyLimit, &req); err != nil {
			return err
		}
	}
	ttl := defaultLinkTTL
	if req.TTLSeconds != nil {
		ttl = time.Duration(*req.TTLSeconds) * time.Second
	}
	since, err := db.On(s.pool).UserCreatedAt(c.Request().Context(), userID)
	if errors.Is(err, db.ErrNotFound) {
		return notFound("user", userID)
	}
	if err != nil {
		return fmt.Errorf("read user: %w", err)
	}
	expires := time.Now().Add(ttl).Truncate(time.Second).UTC()
	token := signer.Sign(preferences.Link{UserID: userID, UserSince: since}, expires)
	return c.JSON(http.StatusCreated, linkResponse{
		URL: s.publicBase(c) + preferencesFormPath + "#token=" + token, Token: token, ExpiresAt: expires,
	})
}

// publicBase is the base URL devices reach Herald at: HERALD_PUBLIC_URL,
// else the scheme and host the request came with (a trusted proxy's
// scheme).
func (s *Server) publicBase(c echo.Context) string {
	if s.cfg.PublicURL != "" {
		return s.cfg.PublicURL
	}
	return c.Scheme() + "://" + c.Request().Host
}

// formView is what the form shows: the user's settings, the zone their
// quiet hours are kept in, the installation's quiet hours (those of a user
// who sets none) and the declared categories. The form also shows the
// categories the user opted out of that are not declared.
type formView struct {
	preferences.Settings
	// Timezone is the zone the quiet hours are read in: the user's own,
	// else the installation's for users without one.
	Timezone          string                  `json:"timezone"`
	DefaultQuietHours *preferences.QuietHours `json:"default_quiet_hours"`
	Categories        []formCategory          `json:"categories"`
	UpdatedAt         *time.Time              `json:"updated_at"`
}

// formCategory is a declared category as the form shows it: a critical one
// is always sent, so it cannot be turned off there.
type formCategory struct {
	Name     string `json:"name"`
	Critical bool   `json:"critical"`
}

// getOwnPreferences answers the form's view of the link's user.
func (s *Server) getOwnPreferences(c echo.Context) error {
	ctx := c.Request().Context()
	link, err := s.formLink(c)
	if err != nil {
		return err
	}
	if err := checkLinkUser(ctx, db.On(s.pool).UserCreatedAt, link); err != nil {
		return err
	}
	return s.answerForm(c, link.UserID)
}

// putOwnPreferences replaces the link's user's opt-outs and quiet hours,
// and answers the form's view of them. The user's row is held while they
// are written, so that an erasure deletes them or finds them not yet
// there: a user erased since the link was made is answered 410, and
// nothing is written.
func (s *Server) putOwnPreferences(c echo.Context) error {
	ctx := c.Request().Context()
	link, err := s.formLink(c)
	if err != nil {
		return err
	}
	// The keyed route's body, under its rules.
	var req preferencesRequest
	if err := decode(c, smallBodyLimit, &req); err != nil {
		return err
	}
	err = db.InTx(ctx, s.pool, func(tx pgx.Tx) error {
		q := db.On(tx)
		if err := checkLinkUser(ctx, q.ShareUserCreatedAt, link); err != nil {
			return err
		}
		return putPreferences(ctx, q, link.UserID, preferences.Settings(req))
	})
	if err != nil {
		return err
	}
	return s.answerForm(c, link.UserID)
}

// formLink is the link whose token the request carries as its bearer
// token, checked: a missing, forged or expired one is 401.
func (s *Server) formLink(c echo.Context) (preferences.Link, error) {
	signer := s.linkSigner.Load()
	if signer == nil {
		return preferences.Link{}, &Error{Status: http.StatusServiceUnavailable, Code: "unavailable", RetryAfter: unavailableRetryAfter,
			Message: "links cannot be checked yet: the database has not answered; try again after Retry-After seconds"}
	}
	h := c.Response().Header()
	scheme, token, ok := strings.Cut(c.Request().Header.Get(echo.HeaderAuthorization), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") || strings.TrimSpace(token) == "" {
		h.Set(echo.HeaderWWWAuthenticate, `Bearer realm="herald-preferences"`)
		return preferences.Link{}, &Error{Status: http.StatusUnauthorized, Code: "invalid_token",
			Message: "this link has no token: open the whole link the app gave (Authorization: Bearer <token>)"}
	}
	link, expires, err := signer.Verify(strings.TrimSpace(token), time.Now())
	switch {
	case errors.Is(err, preferences.ErrLinkExpired):
		h.Set(echo.HeaderWWWAuthenticate, `Bearer realm="herald-preferences", error="invalid_token"`)
		return preferences.Link{}, &Error{Status: http.StatusUnauthorized, Code: "token_expired",
			Message: fmt.Sprintf("this link expired at %s: open the settings from the app again for a new one", expires.Format(time.RFC3339))}
	case err != nil:
		h.Set(echo.HeaderWWWAuthenticate, `Bearer realm="herald-preferences", error="invalid_token"`)
		return preferences.Link{}, &Error{Status: http.StatusUnauthorized, Code: "invalid_token",
			Message: "this link is not valid: it was changed, or not made by this Herald; open the settings from the app again"}
	}
	return link, nil
}

// checkLinkUser refuses, with 410, a link whose user is gone: erased, or
// erased and made again under the same id since the link was made.
func checkLinkUser(ctx context.Context, createdAt func(context.Context, string) (time.Time, error), link preferences.Link) error {
	since, err := createdAt(ctx, link.UserID)
	switch {
	case errors.Is(err, db.ErrNotFound):
		return userErased()
	case err != nil:
		return fmt.Errorf("read user: %w", err)
	case since.UnixMicro() != link.UserSince.UnixMicro():
		return userErased()
	}
	return nil
}

// userErased answers a link whose user is gone. Nothing is read or
// written for it: an erased user's preferences are not made again.
func userErased() *Error {
	return &Error{Status: http.StatusGone, Code: "user_erased",
		Message: "the user this link was made for has been erased: there are no preferences to show or set"}
}

// answerForm answers the form's view of userID's preferences, never to be
// cached: it is one person's.
func (s *Server) answerForm(c echo.Context, userID string) error {
	ctx := c.Request().Context()
	q := db.On(s.pool)
	user, err := q.GetUserPreferences(ctx, userID)
	if errors.Is(err, db.ErrNotFound) {
		return userErased() // since the link was checked
	}
	if err != nil {
		return fmt.Errorf("read preferences: %w", err)
	}
	categories, err := q.ListCategories(ctx)
	if err != nil {
		return fmt.Errorf("read categories: %w", err)
	}
	view := formView{
		Settings:   preferences.Settings{OptOuts: preferences.OptOutsOf(user.OptOuts), QuietHours: storedQuietHours(user.QuietStart, user.QuietEnd)},
		Timezone:   "UTC",
		Categories: make([]formCategory, len(categories)),
		UpdatedAt:  user.UpdatedAt,
	}
	for i, cat := range categories {
		view.Categories[i] = formCategory{Name: cat.Name, Critical: cat.Critical}
	}
	def, err := q.GetQuietHoursDefault(ctx)
	switch {
	case err == nil:
		view.DefaultQuietHours, view.Timezone = storedQuietHours(def.QuietStart, def.QuietEnd), def.Timezone
	case !errors.Is(err, db.ErrNotFound):
		return fmt.Errorf("read default quiet hours: %w", err)
	}
	if user.Timezone != nil {
		view.Timezone = *user.Timezone
	}
	if view.UpdatedAt != nil {
		at := view.UpdatedAt.UTC()
		view.UpdatedAt = &at
	}
	c.Response().Header().Set("Cache-Control", "no-store")
	return c.JSON(http.StatusOK, view)
}

// preferencesForm serves the form's page and, under preferencesFormPath,
// its script and style. They change with Herald's release, so a browser
// checks again before it uses a copy. The page may be framed (a site's
// own settings page): that gives nothing to a framer without the token.
func (s *Server) preferencesForm() (page, files echo.HandlerFunc) {
	form := web.PreferencesForm()
	headers := func(c echo.Context) {
		h := c.Response().Header()
		h.Set("Cache-Control", "no-cache")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
	}
	page = func(c echo.Context) error {
		index, err := fs.ReadFile(form, "preferences/index.html")
		if err != nil {
			return fmt.Errorf("read the preferences form: %w", err)
		}
		headers(c)
		c.Response().Header().Set("Content-Security-Policy", formCSP)
		http.ServeContent(c.Response(), c.Request(), "index.html", time.Time{}, bytes.NewReader(index))
		return nil
	}
	// The embedded files are under preferences/, as the request paths are.
	server := http.FileServerFS(form)
	files = func(c echo.Context) error {
		if name := c.Param("*"); name == "" || name == "index.html" || strings.HasSuffix(name, "/") {
			return echo.ErrNotFound // the page is preferencesFormPath; no directory listings
		}
		headers(c)
		server.ServeHTTP(c.Response(), c.Request())
		return nil
	}
	return page, files
}

// loadLinkKey reads the key links to the form are signed with, which every
// process shares, once.
func (s *Server) loadLinkKey(ctx context.Context) error {
	if s.linkSigner.Load() != nil {
		return nil
	}
	key, err := db.SharedKey(ctx, s.pool, preferences.LinkKeyPurpose, preferences.LinkKeySize)
	if err != nil {
		return fmt.Errorf("preferences link key: %w", err)
	}
	signer, err := preferences.NewLinkSigner(key)
	if err != nil {
		return err
	}
	s.linkSigner.Store(signer)
	return nil
}
