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
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

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
	if err := admitBody(c, limit); err != nil {
		return err
	}
	body, err := io.ReadAll(http.MaxBytesReader(c.Response(), req.Body, limit))
	if err != nil {
		return bodyReadError(err, limit)
	}
	if err := checkText(body, ""); err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(dst); err != nil {
		return decodeError(err, limit)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return &Error{Status: http.StatusBadRequest, Code: "malformed_json", Message: "the body holds data after its JSON value"}
	}
	return dst.validate()
}

// admitBody checks, before a byte of c's body is read, that it is JSON
// and not over limit by its declared length, and takes its part of the
// process's body budget.
func admitBody(c echo.Context, limit int64) error {
	req := c.Request()
	mediaType, _, err := mime.ParseMediaType(req.Header.Get(echo.HeaderContentType))
	if err != nil || (mediaType != echo.MIMEApplicationJSON && !strings.HasSuffix(mediaType, "+json")) {
		return &Error{Status: http.StatusUnsupportedMediaType, Code: "unsupported_media_type",
			Message: "the request body must be JSON, sent with Content-Type: application/json"}
	}
	if req.ContentLength > limit {
		return tooLarge(limit)
	}
	return takeBody(c, declaredLength(req, limit))
}

// declaredLength is how many bytes req's body will take at most: its
// Content-Length, or the route's limit when the body's length is unknown.
func declaredLength(req *http.Request, limit int64) int64 {
	if req.ContentLength >= 0 {
		return req.ContentLength
	}
	return limit
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

// checkText refuses a body whose strings (values or keys) PostgreSQL cannot
// store or Herald cannot give back as they came: a NUL character, which
// text and jsonb columns refuse, and bytes that are not UTF-8, which
// encoding/json would silently replace with U+FFFD. It is the one place
// where every string of every request is checked, so that no handler has
// to remember it; the error names the string by its JSON path, such as
// payload.data.room or devices[3].user_id.
//
// Almost every body is clean, which two scans of its raw bytes prove; only a
// body that fails them is walked token by token to find the culprit. A NUL
// can reach a JSON string only as the escape \u0000, since a raw control
// byte is a syntax error there.
//
// prefix is the path of body within the request, "" for the whole body.
func checkText(body []byte, prefix string) error {
	if utf8.Valid(body) && !bytes.Contains(body, []byte(`\u0000`)) {
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	// The path to the current value: object keys and array indexes.
	type level struct {
		key    string
		index  int
		array  bool
		keyNow bool // in an object, the next string is a key
	}
	var stack []level
	path := func() string {
		var b strings.Builder
		b.WriteString(prefix)
		for _, l := range stack {
			if l.array {
				fmt.Fprintf(&b, "[%d]", l.index)
				continue
			}
			if b.Len() > 0 {
				b.WriteByte('.')
			}
			b.WriteString(l.key)
		}
		return b.String()
	}
	// value moves past one complete value: the next key of an object, the
	// next index of an array.
	value := func() {
		if len(stack) == 0 {
			return
		}
		top := &stack[len(stack)-1]
		if top.array {
			top.index++
		} else {
			top.keyNow = true
		}
	}
	for {
		start := dec.InputOffset()
		tok, err := dec.Token()
		if err != nil {
			// Not JSON, or the end: the strict decode that follows says
			// what is wrong, if anything.
			return nil //nolint:nilerr // reported by the strict decode
		}
		switch v := tok.(type) {
		case json.Delim:
			switch v {
			case '{':
				stack = append(stack, level{keyNow: true})
			case '[':
				stack = append(stack, level{array: true})
			default:
				stack = stack[:len(stack)-1]
				value()
			}
			continue
		case string:
			raw := body[start:dec.InputOffset()]
			isKey := len(stack) > 0 && !stack[len(stack)-1].array && stack[len(stack)-1].keyNow
			if isKey {
				top := &stack[len(stack)-1]
				top.key, top.keyNow = printableKey(v, raw), false
				if problem := textProblem(v, raw); problem != "" {
					field := path()
					return invalid(field, "the key %s %s", field, problem)
				}
				continue
			}
			if problem := textProblem(v, raw); problem != "" {
				field := path()
				if field == "" {
					field = "body"
				}
				return invalid(field, "%s %s", field, problem)
			}
		}
		value()
	}
}

// textProblem says what is wrong with a decoded string s whose raw JSON
// (with the punctuation before it) is raw, or "" when nothing is.
func textProblem(s string, raw []byte) string {
	switch {
	case !utf8.Valid(raw):
		return "must be valid UTF-8"
	case strings.ContainsRune(s, 0):
		return "must not contain the NUL character (\\u0000)"
	}
	return ""
}

// printableKey is an object key as a field path shows it: as it is, unless
// it holds a NUL or bytes that are not UTF-8, which are escaped (k\x00,
// \xff) so that the error can name the key it blames. Bytes that are not
// UTF-8 are taken from the raw literal, since decoding replaced them.
func printableKey(key string, raw []byte) string {
	switch {
	case !utf8.Valid(raw):
		key = string(raw[bytes.IndexByte(raw, '"')+1 : len(raw)-1])
	case !strings.ContainsRune(key, 0):
		return key
	}
	q := strconv.QuoteToASCII(key)
	return q[1 : len(q)-1]
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

// storedHeader reads a request header whose value Herald stores (the
// Idempotency-Key): at most max bytes of UTF-8 text without control
// characters, so that it can be stored, shown and logged as it came.
// net/http lets through bytes that are not UTF-8 and tabs.
func storedHeader(c echo.Context, name string, max int) (string, error) {
	v := c.Request().Header.Get(name)
	switch {
	case len(v) > max:
		return "", invalid(name, "the %s header is longer than %d bytes", name, max)
	case !utf8.ValidString(v):
		return "", invalid(name, "the %s header must be valid UTF-8", name)
	case strings.IndexFunc(v, unicode.IsControl) >= 0:
		return "", invalid(name, "the %s header must not contain control characters", name)
	}
	return v, nil
}
