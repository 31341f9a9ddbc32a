package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/labstack/echo/v4"
)

// decodeArray reads a body of at most limit bytes that is a JSON object
// with one field, name, holding an array of 1 to max elements, element by
// element as it arrives: each is checked as decode checks a whole body
// (checkText) and handed to each with its index, which decodes it (with
// decodeElement) and keeps what it needs. So a batch is never held whole,
// as bytes or decoded, and a bad element is answered without reading the
// rest: sixteen refused 16 MB batches at once took a process to 1.6 GB
// when each was read whole and then decoded whole.
func decodeArray(c echo.Context, limit int64, name string, max int, each func(i int, raw json.RawMessage) error) error {
	if err := admitBody(c, limit); err != nil {
		return err
	}
	dec := json.NewDecoder(http.MaxBytesReader(c.Response(), c.Request().Body, limit))
	tokenErr := func(err error) error { return decodeError(err, limit) }
	tok, err := dec.Token()
	if err != nil {
		return tokenErr(err)
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return &Error{Status: http.StatusBadRequest, Code: "invalid_type", Message: "the request body must be a JSON object"}
	}
	n := -1
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return tokenErr(err)
		}
		key, _ := tok.(string)
		switch {
		case key != name:
			return &Error{Status: http.StatusBadRequest, Code: "unknown_field", Field: key, Message: fmt.Sprintf("unknown field %q", key)}
		case n >= 0:
			return invalid(name, "%s is given twice", name)
		}
		if tok, err = dec.Token(); err != nil {
			return tokenErr(err)
		}
		if d, ok := tok.(json.Delim); !ok || d != '[' {
			return &Error{Status: http.StatusBadRequest, Code: "invalid_type", Field: name, Message: fmt.Sprintf("%s must be an array", name)}
		}
		for n = 0; dec.More(); n++ {
			if n == max {
				return invalid(name, "%s must hold 1 to %d elements, not more", name, max)
			}
			var raw json.RawMessage
			if err := dec.Decode(&raw); err != nil {
				return tokenErr(err)
			}
			if err := checkText(raw, fmt.Sprintf("%s[%d]", name, n)); err != nil {
				return err
			}
			if err := each(n, raw); err != nil {
				return err
			}
		}
		if _, err := dec.Token(); err != nil {
			return tokenErr(err)
		}
	}
	if _, err := dec.Token(); err != nil {
		return tokenErr(err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return &Error{Status: http.StatusBadRequest, Code: "malformed_json", Message: "the body holds data after its JSON value"}
	}
	if n <= 0 {
		return invalid(name, "%s must hold 1 to %d elements, not 0", name, max)
	}
	return nil
}

// decodeElement decodes one element of a batch strictly (unknown fields are
// errors) into dst, naming what is wrong by the element's path, such as
// devices[3].token.
func decodeElement(raw json.RawMessage, dst any, path string) error {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	err := dec.Decode(dst)
	if err == nil {
		return nil
	}
	var e *Error
	if !errors.As(decodeError(err, int64(len(raw))), &e) {
		return err
	}
	if e.Field == "" {
		if e.Code == "invalid_type" {
			return &Error{Status: http.StatusBadRequest, Code: "invalid_type", Field: path, Message: fmt.Sprintf("%s must be an object", path)}
		}
		return e
	}
	field := path + "." + e.Field
	return &Error{Status: e.Status, Code: e.Code, Field: field, Message: strings.Replace(e.Message, e.Field, field, 1)}
}
