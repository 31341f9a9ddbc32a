package api

import (
	"context"
	"errors"
	"fmt"

	"github.com/labstack/echo/v4"

	"github.com/heraldpush/herald/db"
	"github.com/heraldpush/herald/jobs/push"
)

// fromPath is the prologue of a handler of one resource: it reads the id
// that the path parameter param names, checks it with parse, and reads the
// resource with fetch. A malformed id names nothing, so it is the same 404
// as an id that names nothing (db.ErrNotFound); both say what and the id as
// the caller wrote it. Any other error is wrapped with the read.
func fromPath[ID, T any](c echo.Context, param, what string, parse func(raw string) (ID, bool), fetch func(context.Context, ID) (T, error)) (T, error) {
	var zero T
	raw := c.Param(param)
	id, ok := parse(raw)
	if !ok {
		return zero, notFound(what, raw)
	}
	v, err := fetch(c.Request().Context(), id)
	if errors.Is(err, db.ErrNotFound) {
		return zero, notFound(what, raw)
	}
	if err != nil {
		return zero, fmt.Errorf("read %s: %w", what, err)
	}
	return v, nil
}

// The parsers of the ids paths carry: Herald's own, minted with a prefix
// (msg_, sch_), and the callers' (users, segments), which must be ids a
// caller could have chosen (checkID).
var (
	messageID  = push.ParseMessageID
	scheduleID = func(raw string) (int64, bool) { return parseID(schedulePrefix, raw) }
	callerID   = func(raw string) (string, bool) { return raw, checkID("id", raw) == nil }
)
