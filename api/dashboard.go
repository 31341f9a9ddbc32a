package api

import (
	"bytes"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/heraldpush/herald/db"
	"github.com/heraldpush/herald/jobs"
	"github.com/heraldpush/herald/web"
)

// dashboardCSP keeps the dashboard's pages to their own scripts and styles:
// nothing inline, nothing from elsewhere, no framing.
const dashboardCSP = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; " +
	"connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'"

// histogramBuckets is how many bars the dashboard's skew histogram has.
const histogramBuckets = 20

// dashboard holds the parsed pages of package web.
type dashboard struct {
	files fs.FS
	index []byte
	login *template.Template
}

func newDashboard() (*dashboard, error) {
	files := web.FS()
	index, err := fs.ReadFile(files, "index.html")
	if err != nil {
		return nil, fmt.Errorf("read dashboard: %w", err)
	}
	login, err := template.ParseFS(files, "login.html")
	if err != nil {
		return nil, fmt.Errorf("parse login page: %w", err)
	}
	return &dashboard{files: files, index: index, login: login}, nil
}

// page sends one of the dashboard's HTML pages, never cached, since it
// depends on the session.
func page(c echo.Context, status int, body []byte) error {
	h := c.Response().Header()
	h.Set("Content-Security-Policy", dashboardCSP)
	h.Set("Cache-Control", "no-store")
	h.Set("Referrer-Policy", "same-origin")
	return c.HTMLBlob(status, body)
}

func (s *Server) dashboardIndex(c echo.Context) error {
	return page(c, http.StatusOK, s.dashboard.index)
}

// assets serves the dashboard's scripts and styles. They hold no data, so
// the login page can use them before anyone has signed in.
func (s *Server) assets() echo.HandlerFunc {
	files := http.FileServerFS(s.dashboard.files)
	return func(c echo.Context) error {
		c.Response().Header().Set("Cache-Control", "no-cache")
		files.ServeHTTP(c.Response(), c.Request())
		return nil
	}
}

// safeNext keeps the post-login redirect on this site: next must be a path
// of this origin, else the operator goes to /. Browsers forgive a lot in a
// Location header (they drop tabs and newlines anywhere, trim leading spaces
// and control characters, and read a backslash as a slash), so anything a
// browser might rewrite into a scheme-relative or absolute URL is refused
// outright rather than cleaned: control characters, backslashes, and
// anything that does not start with exactly one slash or that parses with a
// scheme or a host.
func safeNext(next string) string {
	if !strings.HasPrefix(next, "/") || strings.HasPrefix(next, "//") || strings.HasPrefix(next, "/login") {
		return "/"
	}
	for _, r := range next {
		if r < 0x20 || r == 0x7f || r == '\\' || (r >= 0x80 && r <= 0x9f) {
			return "/"
		}
	}
	u, err := url.Parse(next)
	if err != nil || u.Scheme != "" || u.Host != "" || u.User != nil || u.Opaque != "" {
		return "/"
	}
	return next
}

// loginBodyLimit bounds the anonymous login form: a user, a password and a
// path fit in far less.
const loginBodyLimit = 4 << 10

func (s *Server) renderLogin(c echo.Context, status int, next, problem string) error {
	var buf bytes.Buffer
	if err := s.dashboard.login.Execute(&buf, map[string]string{"Next": safeNext(next), "Error": problem}); err != nil {
		return fmt.Errorf("render login page: %w", err)
	}
	return page(c, status, buf.Bytes())
}

func (s *Server) loginPage(c echo.Context) error {
	return s.renderLogin(c, http.StatusOK, c.QueryParam("next"), "")
}

// login checks the form's user and password and starts a session. A wrong
// password is logged (without it) so that guessing shows in the logs.
func (s *Server) login(c echo.Context) error {
	ctx := c.Request().Context()
	next := c.FormValue("next")
	// RealIP is the connection's address unless a trusted proxy forwarded
	// the request (proxy.go): a header the client sets never picks the
	// throttle's key.
	remote := throttleKey(c.RealIP())
	if wait := s.sessions.loginWait(remote); wait > 0 {
		c.Response().Header().Set("Retry-After", strconv.Itoa(int(wait.Seconds())+1))
		return s.renderLogin(c, http.StatusTooManyRequests, next,
			fmt.Sprintf("Too many failed sign-ins from here: try again in %s.", wait.Round(time.Second)))
	}
	user := c.FormValue("username")
	ok, err := s.sessions.checkPassword(ctx, user, c.FormValue("password"))
	if errors.Is(err, errBusy) {
		c.Response().Header().Set("Retry-After", "1")
		return s.renderLogin(c, http.StatusServiceUnavailable, next, "Too many sign-ins at once: try again in a second.")
	}
	if err != nil {
		return err
	}
	if !ok {
		s.sessions.loginFailed(remote)
		s.cfg.Logger.WarnContext(ctx, "dashboard login refused",
			"remote", remote, "request_id", c.Response().Header().Get(echo.HeaderXRequestID))
		return s.renderLogin(c, http.StatusUnauthorized, next, "The user or password is wrong.")
	}
	s.sessions.loginSucceeded(remote)
	token, expires, err := s.sessions.issue(ctx, user)
	if err != nil {
		return err
	}
	s.cfg.Logger.InfoContext(ctx, "dashboard sign-in", "operator", user, "remote", remote,
		"request_id", c.Response().Header().Get(echo.HeaderXRequestID))
	s.setSessionCookie(c, token, expires)
	return c.Redirect(http.StatusSeeOther, safeNext(next))
}

// logout ends the session on every process; without a valid session there
// is nothing to end and the cookie is just cleared. Ending one needs its
// CSRF token, so that another site cannot sign the operator out.
func (s *Server) logout(c echo.Context) error {
	token, _, ok, err := s.sessionOf(c)
	if err != nil {
		return err
	}
	if ok {
		if !s.sessions.checkCSRF(token, c.Request().Header.Get(csrfHeader)) {
			return &Error{Status: http.StatusForbidden, Code: "csrf_failed", Message: "signing out needs the session's " + csrfHeader + " header"}
		}
		if err := s.sessions.revoke(c.Request().Context(), token); err != nil {
			return err
		}
	}
	s.setSessionCookie(c, "", time.Time{})
	return c.NoContent(http.StatusNoContent)
}

// sessionInfo gives the dashboard its operator's name and CSRF token, which
// it cannot read from the HttpOnly cookie, and says whether River UI is
// there to link to.
func (s *Server) sessionInfo(c echo.Context) error {
	ctx := c.Request().Context()
	token, _ := ctx.Value(sessionKey{}).(string)
	return c.JSON(http.StatusOK, map[string]any{
		"user": callerOf(ctx).operator, "csrf_token": s.sessions.csrfToken(token), "river_ui": s.cfg.RiverUI != nil,
	})
}

type skewBucket struct {
	FromMs  float64 `json:"from_ms"`
	ToMs    float64 `json:"to_ms"`
	Devices int32   `json:"devices"`
}

type failureCount struct {
	Status  string `json:"status"`
	Reason  string `json:"reason"`
	Devices int32  `json:"devices"`
}

type messageBreakdown struct {
	SkewHistogram    []skewBucket   `json:"skew_histogram"`
	FailuresByReason []failureCount `json:"failures_by_reason"`
}

// messageBreakdown returns what the dashboard's message page draws beyond
// GET /v1/messages/{id}: the skew histogram (histogramBuckets equal-width
// buckets spanning the accepted deliveries' skews, empty ones included;
// none while nothing was accepted) and the failed and expired deliveries
// by reason. Both are computed in SQL, so a message of 25,000 devices
// costs the browser a few dozen numbers.
func (s *Server) messageBreakdown(c echo.Context) error {
	ctx := c.Request().Context()
	q := db.On(s.pool)
	m, err := readMessage(c, q)
	if err != nil {
		return err
	}
	rows, err := q.SkewHistogram(ctx, db.SkewHistogramParams{MessageID: m.ID, Buckets: histogramBuckets})
	if err != nil {
		return fmt.Errorf("skew histogram: %w", err)
	}
	out := messageBreakdown{SkewHistogram: []skewBucket{}, FailuresByReason: []failureCount{}}
	if len(rows) > 0 {
		lo, width := rows[0].Lo, (rows[0].Hi-rows[0].Lo)/histogramBuckets
		for i := range histogramBuckets {
			out.SkewHistogram = append(out.SkewHistogram, skewBucket{
				FromMs: round1(lo + float64(i)*width), ToMs: round1(lo + float64(i+1)*width),
			})
		}
		for _, r := range rows {
			if r.Bucket >= 1 && int(r.Bucket) <= histogramBuckets {
				out.SkewHistogram[r.Bucket-1].Devices = r.Devices
			}
		}
	}
	reasons, err := q.FailureReasons(ctx, m.ID)
	if err != nil {
		return fmt.Errorf("failure reasons: %w", err)
	}
	for _, r := range reasons {
		out.FailuresByReason = append(out.FailuresByReason, failureCount{Status: r.Status, Reason: r.Reason, Devices: r.Devices})
	}
	return c.JSON(http.StatusOK, out)
}

// sloWindow is how far back the dashboard's share of messages within the
// SLO looks.
const sloWindow = 24 * time.Hour

// sloLane is one priority's messages settled over sloWindow that were
// graded, and how many had their maximum skew within the SLO.
type sloLane struct {
	Priority  string `json:"priority"`
	Messages  int32  `json:"messages"`
	WithinSLO int32  `json:"within_slo"`
}

type sloShare struct {
	WindowHours int       `json:"window_hours"`
	SLOMs       float64   `json:"slo_ms"`
	Lanes       []sloLane `json:"lanes"`
}

// sloShare returns the share of messages settled over the last day whose
// maximum skew (slo_skew_ms, graded as they settled) was within the
// one-second SLO, by priority (lane): the figure the dashboard shows at the
// top of its messages.
func (s *Server) sloShare(c echo.Context) error {
	since := time.Now().Add(-sloWindow)
	rows, err := db.On(s.pool).SLOShare(c.Request().Context(), db.SLOShareParams{
		WithinMs: float64(jobs.SLOSkew.Milliseconds()), Since: since,
	})
	if err != nil {
		return fmt.Errorf("share of messages within the SLO: %w", err)
	}
	out := sloShare{WindowHours: int(sloWindow.Hours()), SLOMs: float64(jobs.SLOSkew.Milliseconds()), Lanes: []sloLane{}}
	for _, r := range rows {
		out.Lanes = append(out.Lanes, sloLane{Priority: r.Priority, Messages: r.Messages, WithinSLO: r.WithinSlo})
	}
	return c.JSON(http.StatusOK, out)
}

// riverUI passes a signed-in request to River UI, or says it is not running
// in this process.
func (s *Server) riverUI(c echo.Context) error {
	if s.cfg.RiverUI == nil {
		return &Error{Status: http.StatusServiceUnavailable, Code: "river_ui_unavailable",
			Message: "River UI is not running in this process"}
	}
	s.cfg.RiverUI.ServeHTTP(c.Response(), c.Request())
	return nil
}
