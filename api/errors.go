package api

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"

	"github.com/labstack/echo/v4"

	"github.com/heraldpush/herald/db"
	"github.com/heraldpush/herald/jobs"
	"github.com/heraldpush/herald/jobs/apps"
	"github.com/heraldpush/herald/jobs/preferences"
	"github.com/heraldpush/herald/jobs/push"
)

// Error is an API error as the caller sees it:
// {"error": {"code": ..., "message": ..., "field": ...}}.
type Error struct {
	Status  int
	Code    string
	Message string
	// Field names the one input field to blame, when there is one.
	Field string
	// Extra carries additional members of the error object, such as the
	// delivery counts of a message that can no longer be cancelled.
	Extra map[string]any
	// RetryAfter, when positive, is sent as the Retry-After header, in
	// whole seconds.
	RetryAfter int
}

func (e *Error) Error() string {
	if e.Field != "" {
		return fmt.Sprintf("%s (%s): %s", e.Code, e.Field, e.Message)
	}
	return e.Code + ": " + e.Message
}

// invalid is a 400 that blames one field.
func invalid(field, format string, args ...any) *Error {
	return &Error{Status: http.StatusBadRequest, Code: "invalid_field", Field: field, Message: fmt.Sprintf(format, args...)}
}

// notFound is a 404 for an unknown id.
func notFound(what, id string) *Error {
	return &Error{Status: http.StatusNotFound, Code: "not_found", Message: fmt.Sprintf("%s %q does not exist", what, id)}
}

// errorHandler is the one place where errors become HTTP responses. Expected
// errors keep their status and message; anything else is a 500 whose detail
// goes to the log with the request id, never to the caller.
func errorHandler(logger *slog.Logger) echo.HTTPErrorHandler {
	return func(err error, c echo.Context) {
		if c.Response().Committed {
			return
		}
		apiErr := toAPIError(err)
		if apiErr.Status >= 500 {
			logger.ErrorContext(c.Request().Context(), "request failed",
				"request_id", c.Response().Header().Get(echo.HeaderXRequestID),
				"method", c.Request().Method, "path", c.Path(), "error", err)
		}
		if apiErr.RetryAfter > 0 {
			c.Response().Header().Set("Retry-After", strconv.Itoa(apiErr.RetryAfter))
		}
		body := map[string]any{"code": apiErr.Code, "message": apiErr.Message}
		if apiErr.Field != "" {
			body["field"] = apiErr.Field
		}
		for k, v := range apiErr.Extra {
			body[k] = v
		}
		var werr error
		if c.Request().Method == http.MethodHead {
			werr = c.NoContent(apiErr.Status)
		} else {
			werr = c.JSON(apiErr.Status, map[string]any{"error": body})
		}
		if werr != nil {
			logger.WarnContext(c.Request().Context(), "write error response", "error", werr)
		}
	}
}

// unavailableRetryAfter is the Retry-After of a 503 for an unreachable
// database, in seconds: about what a restart takes.
const unavailableRetryAfter = 2

func toAPIError(err error) *Error {
	var apiErr *Error
	if errors.As(err, &apiErr) {
		return apiErr
	}
	var invalidErr *jobs.InvalidError
	if errors.As(err, &invalidErr) {
		var sizeErr *push.SizeError
		if errors.As(invalidErr, &sizeErr) {
			return &Error{Status: http.StatusRequestEntityTooLarge, Code: "payload_too_large", Field: invalidErr.Field, Message: invalidErr.Message,
				Extra: map[string]any{"channel": sizeErr.Channel}}
		}
		return invalid(invalidErr.Field, "%s", invalidErr.Message)
	}
	var appErr *apps.InvalidError
	if errors.As(err, &appErr) {
		return invalid(appErr.Field, "%s", appErr.Problem)
	}
	var settingErr *preferences.FieldError
	if errors.As(err, &settingErr) {
		return invalid(settingErr.Field, "%s", settingErr.Error())
	}
	switch {
	case errors.Is(err, apps.ErrNotFound):
		return &Error{Status: http.StatusNotFound, Code: "not_found", Message: err.Error()}
	case errors.Is(err, apps.ErrOldRelease):
		return &Error{Status: http.StatusConflict, Code: "upgrade_in_progress", Message: err.Error() +
			": it would send the new app's devices with the environment's credentials"}
	case errors.Is(err, apps.ErrTooMany):
		return &Error{Status: http.StatusConflict, Code: "too_many_apps", Message: err.Error()}
	case errors.Is(err, apps.ErrNoSealKey):
		return &Error{Status: http.StatusConflict, Code: "no_secret_key", Message: err.Error()}
	}
	var httpErr *echo.HTTPError
	if errors.As(err, &httpErr) {
		switch httpErr.Code {
		case http.StatusNotFound:
			return &Error{Status: http.StatusNotFound, Code: "not_found", Message: "no such route"}
		case http.StatusMethodNotAllowed:
			return &Error{Status: http.StatusMethodNotAllowed, Code: "method_not_allowed", Message: "method not allowed on this route"}
		case http.StatusRequestEntityTooLarge:
			return &Error{Status: http.StatusRequestEntityTooLarge, Code: "too_large", Message: "request body too large"}
		case http.StatusUnauthorized:
			return &Error{Status: http.StatusUnauthorized, Code: "unauthorized", Message: "authentication required"}
		}
		if httpErr.Code < 500 {
			return &Error{Status: httpErr.Code, Code: "bad_request", Message: fmt.Sprint(httpErr.Message)}
		}
	}
	switch {
	case errors.Is(err, jobs.ErrIdempotencyKeyReused):
		return &Error{Status: http.StatusConflict, Code: "idempotency_key_reused",
			Message: "this Idempotency-Key was used with a different request body"}
	case errors.Is(err, db.ErrNotFound):
		return &Error{Status: http.StatusNotFound, Code: "not_found", Message: "not found"}
	case errors.Is(err, db.ErrConflict):
		return &Error{Status: http.StatusConflict, Code: "conflict", Message: "conflicts with an existing resource"}
	case errors.Is(err, db.ErrUnavailable):
		// The database restarting or failing over: the same request will
		// do once it is back (an Idempotency-Key makes a message's or a
		// schedule's safe).
		return &Error{Status: http.StatusServiceUnavailable, Code: "unavailable", RetryAfter: unavailableRetryAfter,
			Message: "the database is unavailable; try again after Retry-After seconds"}
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return &Error{Status: http.StatusServiceUnavailable, Code: "unavailable", Message: "the request was cancelled or timed out"}
	}
	return &Error{Status: http.StatusInternalServerError, Code: "internal", Message: "internal error; the server log has the details under this request's id"}
}
