package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/labstack/echo/v4"

	"github.com/heraldpush/herald/db"
	"github.com/heraldpush/herald/jobs/preferences"
)

// What the people reminded are owed (docs/preferences.md), as the API sets
// it: categories, each user's opt-outs and quiet hours, and the
// installation's default quiet hours. All of it is decided when a delivery
// is sent (jobs/preferences), so a change counts for every delivery sent
// after it, of messages scheduled before it too.

// A category's cap: at most count messages to a user in any period of
// period_seconds (migration 0024 holds the same bounds).
const (
	maxCapCount       = 10000
	minCapPeriodS     = 60
	maxCapPeriodS     = 366 * 24 * 3600
	categoryPathParam = "category"
)

// unlessDefault is a message's category and quiet-hours mode as its
// request's canonical form holds them: empty for the defaults, so that a
// request that says them and one that does not are the same request to an
// idempotency key, and to one used before either existed.
func unlessDefault(category, mode string) (string, string) {
	if category == preferences.DefaultCategory {
		category = ""
	}
	if mode == preferences.QuietHold {
		mode = ""
	}
	return category, mode
}

// categoryName reads a category's name from a path: a name no category
// could have names nothing (404).
var categoryName = func(raw string) (string, bool) { return raw, preferences.CheckCategory(raw) == nil }

// categoryCap is a category's frequency cap as the API spells it.
type categoryCap struct {
	Count         int `json:"count"`
	PeriodSeconds int `json:"period_seconds"`
}

// categoryRequest is PUT /v1/categories/{category}'s body: the whole rule,
// which replaces the category's.
type categoryRequest struct {
	Critical bool         `json:"critical"`
	Cap      *categoryCap `json:"cap"`
}

func (r *categoryRequest) validate() error {
	if r.Cap == nil {
		return nil
	}
	if r.Critical {
		return invalid("cap", "a critical category is never capped: give cap null, or critical false")
	}
	if r.Cap.Count < 1 || r.Cap.Count > maxCapCount {
		return invalid("cap.count", "cap.count must be from 1 to %d", maxCapCount)
	}
	if r.Cap.PeriodSeconds < minCapPeriodS || r.Cap.PeriodSeconds > maxCapPeriodS {
		return invalid("cap.period_seconds", "cap.period_seconds must be from %d to %d (366 days)", minCapPeriodS, maxCapPeriodS)
	}
	return nil
}

// categoryView is a category as the API shows it.
type categoryView struct {
	Name      string       `json:"name"`
	Critical  bool         `json:"critical"`
	Cap       *categoryCap `json:"cap"`
	CreatedAt time.Time    `json:"created_at"`
	UpdatedAt time.Time    `json:"updated_at"`
}

func newCategoryView(c db.Category) categoryView {
	v := categoryView{Name: c.Name, Critical: c.Critical, CreatedAt: c.CreatedAt.UTC(), UpdatedAt: c.UpdatedAt.UTC()}
	if c.CapCount != nil && c.CapPeriodS != nil {
		v.Cap = &categoryCap{Count: int(*c.CapCount), PeriodSeconds: int(*c.CapPeriodS)}
	}
	return v
}

type categoryList struct {
	Items []categoryView `json:"items"`
}

// listCategories lists the declared categories by name. A name no
// category declares is an ordinary category all the same.
func (s *Server) listCategories(c echo.Context) error {
	rows, err := db.On(s.pool).ListCategories(c.Request().Context())
	if err != nil {
		return fmt.Errorf("list categories: %w", err)
	}
	out := categoryList{Items: make([]categoryView, 0, len(rows))}
	for _, r := range rows {
		out.Items = append(out.Items, newCategoryView(r))
	}
	return c.JSON(http.StatusOK, out)
}

func (s *Server) getCategory(c echo.Context) error {
	cat, err := fromPath(c, categoryPathParam, "category", categoryName, db.On(s.pool).GetCategory)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, newCategoryView(cat))
}

// putCategory declares a category (201) or replaces its rule (200).
func (s *Server) putCategory(c echo.Context) error {
	name := c.Param(categoryPathParam)
	if err := preferences.CheckCategory(name); err != nil {
		return invalid(categoryPathParam, "category %q %s", name, err)
	}
	var req categoryRequest
	if err := decode(c, smallBodyLimit, &req); err != nil {
		return err
	}
	params := db.PutCategoryParams{Name: name, Critical: req.Critical}
	if req.Cap != nil {
		count, period := int32(req.Cap.Count), int32(req.Cap.PeriodSeconds)
		params.CapCount, params.CapPeriodS = &count, &period
	}
	row, err := db.On(s.pool).PutCategory(c.Request().Context(), params)
	if err != nil {
		return fmt.Errorf("put category: %w", err)
	}
	status := http.StatusOK
	if row.Created {
		status = http.StatusCreated
	}
	return c.JSON(status, newCategoryView(db.Category{
		Name: row.Name, Critical: row.Critical, CapCount: row.CapCount, CapPeriodS: row.CapPeriodS,
		CreatedAt: row.CreatedAt, UpdatedAt: row.UpdatedAt,
	}))
}

// deleteCategory makes a category an ordinary one again: the messages
// that name it keep its name, and are neither critical nor capped from
// then on.
func (s *Server) deleteCategory(c echo.Context) error {
	name := c.Param(categoryPathParam)
	if _, ok := categoryName(name); !ok {
		return notFound("category", name)
	}
	n, err := db.On(s.pool).DeleteCategory(c.Request().Context(), name)
	if err != nil {
		return fmt.Errorf("delete category: %w", err)
	}
	if n == 0 {
		return notFound("category", name)
	}
	return c.NoContent(http.StatusNoContent)
}

// everyApp refuses a key limited to some apps a call whose change applies
// to every app's messages (categories, the installation's quiet hours).
func everyApp(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		if who := callerOf(c.Request().Context()); who.apps != nil {
			return &Error{Status: http.StatusForbidden, Code: "forbidden",
				Message: "key " + strconv.Quote(who.key) + " is limited to some apps and cannot change what applies to every app"}
		}
		return next(c)
	}
}

// userPreferences is a user's preferences as the API shows them: its
// opt-outs, its quiet hours (null: the installation's), its zone (null:
// the installation's quiet hours' zone), and when they were last set (null:
// never).
type userPreferences struct {
	UserID     string                  `json:"user_id"`
	OptOuts    []preferences.OptOut    `json:"opt_outs"`
	QuietHours *preferences.QuietHours `json:"quiet_hours"`
	Timezone   *string                 `json:"timezone"`
	UpdatedAt  *time.Time              `json:"updated_at"`
}

// preferencesRequest is PUT /v1/users/{user_id}/preferences's body: the
// user's settings, checked by their own rules (preferences.Settings).
type preferencesRequest preferences.Settings

func (r *preferencesRequest) validate() error { return (*preferences.Settings)(r).Check() }

// readPreferences reads user's preferences through q: db.ErrNotFound when
// the user does not exist.
func readPreferences(ctx context.Context, q *db.Queries, user string) (userPreferences, error) {
	row, err := q.GetUserPreferences(ctx, user)
	if err != nil {
		return userPreferences{}, err
	}
	return userPreferences{UserID: row.UserID, OptOuts: preferences.OptOutsOf(row.OptOuts), QuietHours: storedQuietHours(row.QuietStart, row.QuietEnd),
		Timezone: row.Timezone, UpdatedAt: utcPtr(row.UpdatedAt)}, nil
}

// storedQuietHours reads quiet hours as user_preferences and
// quiet_hours_default keep them: nil when there are none.
func storedQuietHours(start, end pgtype.Time) *preferences.QuietHours {
	w, ok := preferences.WindowOf(start, end)
	if !ok {
		return nil
	}
	q := preferences.QuietHoursOf(w)
	return &q
}

// putPreferences stores set (checked) as user's preferences through q:
// the one write of them, by the keyed route and the user's own form.
func putPreferences(ctx context.Context, q *db.Queries, user string, set preferences.Settings) error {
	start, end, err := set.StoredQuietHours()
	if err != nil {
		return err
	}
	if err := q.PutUserPreferences(ctx, db.PutUserPreferencesParams{UserID: user, OptOuts: set.Stored(), QuietStart: start, QuietEnd: end}); err != nil {
		return fmt.Errorf("put preferences: %w", err)
	}
	return nil
}

// writePreferences replaces user's preferences with set (checked) in tx,
// and reads them back. The user's row is locked first, as its erasure
// locks it, so an erasure either waits for the write and deletes what it
// wrote, or has committed and the user is not found (db.ErrNotFound).
func writePreferences(ctx context.Context, tx pgx.Tx, user string, set preferences.Settings) (userPreferences, error) {
	q := db.On(tx)
	if _, err := q.LockUser(ctx, user); err != nil {
		return userPreferences{}, err
	}
	if err := putPreferences(ctx, q, user, set); err != nil {
		return userPreferences{}, err
	}
	return readPreferences(ctx, q, user)
}

func (s *Server) getUserPreferences(c echo.Context) error {
	p, err := fromPath(c, "user_id", "user", callerID, func(ctx context.Context, user string) (userPreferences, error) {
		return readPreferences(ctx, db.On(s.pool), user)
	})
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, p)
}

// putUserPreferences replaces a user's opt-outs and quiet hours, as the
// caller's backend knows them. The user must exist (404 otherwise).
func (s *Server) putUserPreferences(c echo.Context) error {
	user := c.Param("user_id")
	if _, ok := callerID(user); !ok {
		return notFound("user", user)
	}
	var req preferencesRequest
	if err := decode(c, smallBodyLimit, &req); err != nil {
		return err
	}
	return s.inTx(c, func(tx pgx.Tx) (int, any, error) {
		p, err := writePreferences(c.Request().Context(), tx, user, preferences.Settings(req))
		if errors.Is(err, db.ErrNotFound) {
			return 0, nil, notFound("user", user)
		}
		return http.StatusOK, p, err
	})
}

// quietHoursRequest is PUT /v1/quiet-hours's body: the installation's
// default quiet hours, wall times in the zone of users who have none.
type quietHoursRequest struct {
	Start    string  `json:"start"`
	End      string  `json:"end"`
	Timezone *string `json:"timezone"`

	window preferences.Window
	zone   string
}

func (r *quietHoursRequest) validate() error {
	var err error
	if r.window.Start, err = preferences.ParseClock(r.Start); err != nil {
		return invalid("start", "start: %v", err)
	}
	if r.window.End, err = preferences.ParseClock(r.End); err != nil {
		return invalid("end", "end: %v", err)
	}
	if r.window.Empty() {
		return invalid("end", "end equals start, which leaves no quiet hours: DELETE /v1/quiet-hours to have none")
	}
	r.zone = "UTC"
	if r.Timezone != nil {
		r.zone = *r.Timezone
	}
	return checkTimezone("timezone", r.zone)
}

// quietHoursView is the installation's default quiet hours as the API
// shows them.
type quietHoursView struct {
	Start     string    `json:"start"`
	End       string    `json:"end"`
	Timezone  string    `json:"timezone"`
	UpdatedAt time.Time `json:"updated_at"`
}

func newQuietHoursView(start, end pgtype.Time, zone string, updated time.Time) quietHoursView {
	w, _ := preferences.WindowOf(start, end)
	return quietHoursView{Start: w.Start.String(), End: w.End.String(), Timezone: zone, UpdatedAt: updated.UTC()}
}

// getQuietHours answers the installation's default quiet hours, 404 when
// it has none.
func (s *Server) getQuietHours(c echo.Context) error {
	row, err := db.On(s.pool).GetQuietHoursDefault(c.Request().Context())
	if errors.Is(err, db.ErrNotFound) {
		return noQuietHours()
	}
	if err != nil {
		return fmt.Errorf("read quiet hours: %w", err)
	}
	return c.JSON(http.StatusOK, newQuietHoursView(row.QuietStart, row.QuietEnd, row.Timezone, row.UpdatedAt))
}

// putQuietHours sets the installation's default quiet hours: those of
// every user who set none of their own.
func (s *Server) putQuietHours(c echo.Context) error {
	var req quietHoursRequest
	if err := decode(c, smallBodyLimit, &req); err != nil {
		return err
	}
	start, end := req.window.PG()
	row, err := db.On(s.pool).PutQuietHoursDefault(c.Request().Context(), db.PutQuietHoursDefaultParams{
		QuietStart: start, QuietEnd: end, Timezone: req.zone,
	})
	if err != nil {
		return fmt.Errorf("put quiet hours: %w", err)
	}
	return c.JSON(http.StatusOK, newQuietHoursView(row.QuietStart, row.QuietEnd, row.Timezone, row.UpdatedAt))
}

// deleteQuietHours leaves the installation without default quiet hours:
// only users' own count.
func (s *Server) deleteQuietHours(c echo.Context) error {
	n, err := db.On(s.pool).DeleteQuietHoursDefault(c.Request().Context())
	if err != nil {
		return fmt.Errorf("delete quiet hours: %w", err)
	}
	if n == 0 {
		return noQuietHours()
	}
	return c.NoContent(http.StatusNoContent)
}

func noQuietHours() *Error {
	return &Error{Status: http.StatusNotFound, Code: "not_found", Message: "the installation has no default quiet hours"}
}
