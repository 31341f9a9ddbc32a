package api

import (
	"encoding/json"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/labstack/echo/v4"

	"github.com/heraldpush/herald/db"
)

// inTx runs fn in one transaction and encodes the answer it returns before
// the commit, so that nothing is committed that cannot be shown: an answer
// that fails to encode rolls the change back, rather than leaving a change
// made behind a 500 that every later read of it fails on too.
func (s *Server) inTx(c echo.Context, fn func(tx pgx.Tx) (status int, answer any, err error)) error {
	var (
		status int
		body   []byte
	)
	err := db.InTx(c.Request().Context(), s.pool, func(tx pgx.Tx) error {
		st, answer, err := fn(tx)
		if err != nil {
			return err
		}
		if body, err = json.Marshal(answer); err != nil {
			return fmt.Errorf("encode response: %w", err)
		}
		status = st
		return nil
	})
	if err != nil {
		return err
	}
	return c.JSONBlob(status, body)
}

// listed encodes one item of a listing on its own, or reports false when it
// cannot be shown (made is the error of making it). One stored row that
// cannot be shown, such as an instant past year 9999 stored before such
// input was refused, then costs the listing that row, logged with its id
// for an operator to mend, and not the whole page for every caller.
func (s *Server) listed(c echo.Context, what, id string, item any, made error) (json.RawMessage, bool) {
	raw, err := json.Marshal(item)
	if made != nil {
		err = made
	}
	if err != nil {
		s.cfg.Logger.ErrorContext(c.Request().Context(), "listing leaves out a row that cannot be shown",
			"request_id", c.Response().Header().Get(echo.HeaderXRequestID), what, id, "error", err)
		return nil, false
	}
	return raw, true
}
