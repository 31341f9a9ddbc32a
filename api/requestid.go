package api

import (
	"github.com/labstack/echo/v4"
	"github.com/labstack/echo/v4/middleware"
)

// maxRequestID is the longest X-Request-Id taken from a caller: room for a
// UUID, a trace id or a caller's own prefix and counter.
const maxRequestID = 64

// requestID gives every request an id, echoed in X-Request-Id and logged
// with it. A caller's own id is kept, so that its logs and Herald's can be
// joined, but only when it is a short token (at most maxRequestID of
// A-Z a-z 0-9 . _ -): anything else, which a caller could use to write
// megabytes into the log with each request, or to forge log lines with
// spaces, quotes and line breaks, is replaced with a generated one.
//
// A caller may still give an id that another caller used: an id a caller
// chose names the request for that caller's own tracing, not for Herald's
// operators, who find a log line by its id together with its time and
// route, never by the id alone.
func requestID() echo.MiddlewareFunc {
	set := middleware.RequestIDWithConfig(middleware.RequestIDConfig{
		// The request's header is set to the id used, so that every reader
		// of the request (the request logger reads the request's header
		// before the response's) sees that one.
		RequestIDHandler: func(c echo.Context, id string) {
			c.Request().Header.Set(echo.HeaderXRequestID, id)
		},
	})
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		h := set(next)
		return func(c echo.Context) error {
			header := c.Request().Header
			if ids := header.Values(echo.HeaderXRequestID); len(ids) != 1 || !acceptableRequestID(ids[0]) {
				header.Del(echo.HeaderXRequestID)
			}
			return h(c)
		}
	}
}

// acceptableRequestID reports whether a caller's X-Request-Id is kept: 1 to
// maxRequestID characters from A-Z, a-z, 0-9, '.', '_' and '-'.
func acceptableRequestID(id string) bool {
	if id == "" || len(id) > maxRequestID {
		return false
	}
	for i := range len(id) {
		c := id[i]
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-'
		if !ok {
			return false
		}
	}
	return true
}
