package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"strings"

	"github.com/labstack/echo/v4"
)

// Body size limits. A body over its limit is refused with 413 before it is
// read in full.
const (
	smallBodyLimit = 64 << 10
	// batchBodyLimit fits 10,000 Web Push subscriptions with room to spare.
	batchBodyLimit = 16 << 20
)

// validator is implemented by request types, which check themselves after
// decoding.
type validator interface {
	validate() error
}

// decode reads a JSON request body of at most limit bytes into dst, strictly:
// the media type must be JSON, unknown fields and trailing data are errors,
// and every failure names what is wrong (and the field, where there is one).
func decode(c echo.Context, limit int64, dst validator) error {
	req := c.Request()
	mediaType, _, err := mime.ParseMediaType(req.Header.Get(echo.HeaderContentType))
	if err != nil || (mediaType != echo.MIMEApplicationJSON && !strings.HasSuffix(mediaType, "+json")) {
		return &Error{Status: http.StatusUnsupportedMediaType, Code: "unsupported_media_type",
			Message: "the request body must be JSON, sent with Content-Type: application/json"}
	}
	if req.ContentLength > limit {
		return tooLarge(limit)
	}
	dec := json.NewDecoder(http.MaxBytesReader(c.Response(), req.Body, limit))
	dec.DisallowUnknownFields()
	if err := dec.Decode(dst); err != nil {
		return decodeError(err, limit)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return &Error{Status: http.StatusBadRequest, Code: "malformed_json", Message: "the body holds data after its JSON value"}
	}
	return dst.validate()
}

// limitBody reads a request body of at most limit bytes before the handler
// parses it, so that a handler using Echo's form helpers (which would read
// a multipart body of any size into memory and temporary files) sees at
// most limit bytes. A larger body is refused with 413 as soon as its
// Content-Length, or its limit'th byte, says so.
func limitBody(limit int64) echo.MiddlewareFunc {
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			req := c.Request()
			if req.ContentLength > limit {
				return tooLarge(limit)
			}
			body, err := io.ReadAll(http.MaxBytesReader(c.Response(), req.Body, limit))
			if err != nil {
				return bodyReadError(err, limit)
			}
			req.Body = io.NopCloser(bytes.NewReader(body))
			return next(c)
		}
	}
}

// bodyReadError explains why a request body could not be read: too large,
// not there in time (the server's read timeout; the text of the network
// error would describe the server's connection), or cut off.
func bodyReadError(err error, limit int64) *Error {
	var (
		maxErr *http.MaxBytesError
		netErr net.Error
	)
	switch {
	case errors.As(err, &maxErr):
		return tooLarge(limit)
	case errors.As(err, &netErr) && netErr.Timeout():
		return &Error{Status: http.StatusRequestTimeout, Code: "request_timeout", Message: "the request body did not arrive in time"}
	}
	return &Error{Status: http.StatusBadRequest, Code: "bad_request", Message: "the request body could not be read"}
}

func tooLarge(limit int64) *Error {
	return &Error{Status: http.StatusRequestEntityTooLarge, Code: "too_large",
		Message: fmt.Sprintf("the request body is larger than %d bytes", limit)}
}

func decodeError(err error, limit int64) error {
	var (
		syntaxErr *json.SyntaxError
		typeErr   *json.UnmarshalTypeError
		maxErr    *http.MaxBytesError
	)
	var netErr net.Error
	switch {
	case errors.As(err, &maxErr), errors.As(err, &netErr):
		return bodyReadError(err, limit)
	case errors.Is(err, io.EOF):
		return &Error{Status: http.StatusBadRequest, Code: "malformed_json", Message: "the request body is empty"}
	case errors.Is(err, io.ErrUnexpectedEOF):
		return &Error{Status: http.StatusBadRequest, Code: "malformed_json", Message: "the request body ends in the middle of its JSON"}
	case errors.As(err, &syntaxErr):
		return &Error{Status: http.StatusBadRequest, Code: "malformed_json",
			Message: fmt.Sprintf("the request body is not valid JSON (at byte %d): %v", syntaxErr.Offset, syntaxErr)}
	case errors.As(err, &typeErr):
		field := typeErr.Field
		if field == "" {
			return &Error{Status: http.StatusBadRequest, Code: "invalid_type",
				Message: fmt.Sprintf("the request body must be a JSON object, not %s", typeErr.Value)}
		}
		return &Error{Status: http.StatusBadRequest, Code: "invalid_type", Field: field,
			Message: fmt.Sprintf("%s must be %s, not %s", field, jsonTypeName(typeErr.Type.Kind().String()), typeErr.Value)}
	}
	if name, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
		name = strings.Trim(name, `"`)
		return &Error{Status: http.StatusBadRequest, Code: "unknown_field", Field: name,
			Message: fmt.Sprintf("unknown field %q", name)}
	}
	return &Error{Status: http.StatusBadRequest, Code: "malformed_json", Message: err.Error()}
}

// jsonTypeName names a Go kind the way a JSON caller thinks of it.
func jsonTypeName(kind string) string {
	switch kind {
	case "string":
		return "a string"
	case "bool":
		return "a boolean"
	case "slice", "array":
		return "an array"
	case "map", "struct", "ptr":
		return "an object"
	case "int", "int8", "int16", "int32", "int64", "uint", "uint8", "uint16", "uint32", "uint64", "float32", "float64":
		return "a number"
	}
	return "of another type"
}
