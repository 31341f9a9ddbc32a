package api

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"path"
	"regexp"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/labstack/echo/v4"

	"github.com/heraldpush/herald/db"
)

// auditTargetKey is where a handler names what it made (c.Set), for a
// call whose target is in neither its path nor its Location header.
const auditTargetKey = "audit_target"

// setAuditTarget names the resource a call made, for the audit log.
func setAuditTarget(c echo.Context, id string) { c.Set(auditTargetKey, id) }

// auditAppKey is where a handler leaves the app (or apps, comma-separated)
// its call acted on, for the audit log.
const auditAppKey = "herald.audit_app"

// setAuditApp names the app a call acted on in its audit entry.
func setAuditApp(c echo.Context, app string) { c.Set(auditAppKey, app) }

// auditWriteTimeout bounds writing one entry, which goes on after the caller
// has gone: a call that changed something is recorded even if its caller
// hung up.
const auditWriteTimeout = 5 * time.Second

// audit records every state-changing call (POST, PUT, PATCH, DELETE) in the
// audit log: when, by which key or operator, the method, the route, the
// target's id and the status, with the request id. It runs after
// authentication and the rate limit, so a call refused for its key (401) or
// its rate (429) is not recorded (the request log has it), while one refused
// for its scope (403) is. The entry is written just before the answer's
// status goes out, so that a caller who has its answer finds its entry.
func (s *Server) audit(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		switch c.Request().Method {
		case http.MethodGet, http.MethodHead, http.MethodOptions:
			return next(c)
		}
		recorded := false
		record := func() {
			if !recorded {
				recorded = true
				s.recordAudit(c)
			}
		}
		c.Response().Before(record)
		err := next(c)
		if err == nil && !c.Response().Committed {
			// A handler that wrote nothing: net/http will answer 200.
			record()
		}
		return err
	}
}

// recordAudit writes c's entry; a failure is logged with the whole entry,
// so that the log keeps what the table could not.
func (s *Server) recordAudit(c echo.Context) {
	who := callerOf(c.Request().Context())
	entry := db.InsertAuditEntryParams{
		Method: auditText(c.Request().Method), Route: auditText(auditRoute(c)), TargetID: auditTarget(c),
		Status: int32(c.Response().Status), RequestID: c.Response().Header().Get(echo.HeaderXRequestID),
	}
	if who.operator != "" {
		entry.Operator = &who.operator
	} else {
		entry.KeyName = &who.key
	}
	if app, ok := c.Get(auditAppKey).(string); ok && app != "" {
		app = auditText(app)
		entry.App = &app
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(c.Request().Context()), auditWriteTimeout)
	defer cancel()
	if err := db.On(s.pool).InsertAuditEntry(ctx, entry); err != nil {
		target := ""
		if entry.TargetID != nil {
			target = *entry.TargetID
		}
		s.cfg.Logger.ErrorContext(ctx, "audit entry not recorded", "error", err,
			"key", who.key, "operator", who.operator, "method", entry.Method, "route", entry.Route,
			"target_id", target, "status", entry.Status, "request_id", entry.RequestID)
	}
}

// maxAuditText bounds what an entry keeps of a caller's text (an id, a
// path): far more than an id, far less than a path may be.
const maxAuditText = 256

// auditText is s as PostgreSQL can store it and an entry keeps it: valid
// UTF-8 without NUL, at most maxAuditText bytes. A caller's ids and paths
// are the caller's to choose, and one that could not be stored would leave
// its call unrecorded.
func auditText(s string) string {
	s = strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", "\uFFFD")
	if len(s) <= maxAuditText {
		return s
	}
	cut := maxAuditText
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut]
}

var routeParam = regexp.MustCompile(`:([a-z_]+)`)

// auditRoute is the call's route as openapi.yaml writes it
// (/v1/users/{user_id}); a catch-all route's (River UI's) is the path
// itself.
func auditRoute(c echo.Context) string {
	route := c.Path()
	if strings.HasSuffix(route, "*") {
		return c.Request().URL.Path
	}
	return routeParam.ReplaceAllString(route, "{$1}")
}

// auditTarget is the id of what the call acted on: what the handler named,
// else the route's id (the user erased, the message cancelled), else what
// the Location header points at (the message made).
func auditTarget(c echo.Context) *string {
	id, ok := c.Get(auditTargetKey).(string)
	for i, name := range c.ParamNames() {
		if !ok && name != "*" && i < len(c.ParamValues()) {
			id, ok = c.ParamValues()[i], true
		}
	}
	if loc := c.Response().Header().Get(echo.HeaderLocation); !ok && strings.HasPrefix(loc, "/v1/") {
		id, ok = path.Base(loc), true
	}
	if !ok || id == "" {
		return nil
	}
	id = auditText(id)
	return &id
}

// auditEntry is one entry as GET /v1/audit shows it.
type auditEntry struct {
	At        time.Time `json:"at"`
	KeyName   *string   `json:"key_name"`
	Operator  *string   `json:"operator"`
	Method    string    `json:"method"`
	Route     string    `json:"route"`
	TargetID  *string   `json:"target_id"`
	Status    int32     `json:"status"`
	RequestID string    `json:"request_id"`
	// App is the app (or apps, comma-separated) the call acted on, when
	// it acted on one.
	App *string `json:"app,omitempty"`
}

type auditPage struct {
	Items      []auditEntry `json:"items"`
	NextCursor *string      `json:"next_cursor"`
}

// listAudit returns the audit log, newest first, a page at a time; key_name
// or operator keeps one caller's entries.
func (s *Server) listAudit(c echo.Context) error {
	params := db.ListAuditEntriesParams{}
	if v := c.QueryParam("key_name"); v != "" {
		if !keyName.MatchString(v) && !bootstrapName.MatchString(v) {
			return invalid("key_name", "key_name %q is no key's name", v)
		}
		params.KeyName = &v
	}
	if v := c.QueryParam("operator"); v != "" {
		if !operatorName.MatchString(v) {
			return invalid("operator", "operator %q is no operator's name", v)
		}
		params.Operator = &v
	}
	filter := "audit"
	if params.KeyName != nil {
		filter += fmt.Sprintf(";key=%s", *params.KeyName)
	}
	if params.Operator != nil {
		filter += fmt.Sprintf(";operator=%s", *params.Operator)
	}
	page, err := readPage(c, filter)
	if err != nil {
		return err
	}
	params.BeforeID, params.PageSize = page.afterOr(math.MaxInt64), page.fetch()
	rows, err := db.On(s.pool).ListAuditEntries(c.Request().Context(), params)
	if err != nil {
		return fmt.Errorf("list audit log: %w", err)
	}
	rows, next := paginate(page, rows, func(r db.AuditLog) int64 { return r.ID })
	out := auditPage{Items: make([]auditEntry, 0, len(rows)), NextCursor: next}
	for _, r := range rows {
		out.Items = append(out.Items, auditEntry{
			At: r.At.UTC(), KeyName: r.KeyName, Operator: r.Operator, Method: r.Method, Route: r.Route,
			TargetID: r.TargetID, Status: r.Status, RequestID: r.RequestID, App: r.App,
		})
	}
	return c.JSON(http.StatusOK, out)
}
