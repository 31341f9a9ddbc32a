package api

import (
	"encoding/base64"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/labstack/echo/v4"
)

// Every listing pages the same way: keyset pagination on an id, a page
// starting after the last row of the previous one, so pages never repeat or
// skip a row whatever changes in between. limit is the page size and
// cursor, opaque to the caller, the previous page's position.
const (
	defaultPageSize = 100
	maxPageSize     = 1000
)

// pageRequest is a listing's page as the caller asked for it.
type pageRequest struct {
	// limit is the page's size.
	limit int32
	// after is the key of the previous page's last row, 0 on the first
	// page (ids start at 1).
	after int64
	// afterKey is the same for a listing keyed by a caller's text id (users,
	// segments): empty on the first page, as no id is empty.
	afterKey string
	// filter names the listing and its filters; a cursor carries it so
	// that it is never used with another listing or other filters.
	filter string
}

// readPage reads the limit and cursor query parameters of a listing whose
// listing and filters filter names.
func readPage(c echo.Context, filter string) (pageRequest, error) {
	p := pageRequest{limit: defaultPageSize, filter: filter}
	if s := c.QueryParam("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > maxPageSize {
			return pageRequest{}, invalid("limit", "limit must be a whole number from 1 to %d", maxPageSize)
		}
		p.limit = int32(n)
	}
	if s := c.QueryParam("cursor"); s != "" {
		cur, err := decodeCursor(s, filter)
		if err != nil {
			return pageRequest{}, err
		}
		p.after, p.afterKey = cur.After, cur.Key
	}
	return p, nil
}

// afterOr is the key the page starts after, or first on the first page: 0
// for a listing in ascending id order, the largest id for a descending one.
func (p pageRequest) afterOr(first int64) int64 {
	if p.after == 0 {
		return first
	}
	return p.after
}

// fetch is how many rows to ask the database for: one more than the page,
// which tells whether another page follows without counting.
func (p pageRequest) fetch() int32 { return p.limit + 1 }

// paginate cuts rows, fetched with p.fetch(), to the page, and returns the
// cursor of the next page (nil when this is the last one); key is a row's
// id.
func paginate[R any](p pageRequest, rows []R, key func(R) int64) ([]R, *string) {
	return cutPage(p, rows, func(r R) cursor { return cursor{After: key(r)} })
}

// paginateByKey is paginate for a listing keyed by a caller's text id.
func paginateByKey[R any](p pageRequest, rows []R, key func(R) string) ([]R, *string) {
	return cutPage(p, rows, func(r R) cursor { return cursor{Key: key(r)} })
}

// cutPage is paginate with the cursor of a row given by at.
func cutPage[R any](p pageRequest, rows []R, at func(R) cursor) ([]R, *string) {
	if len(rows) <= int(p.limit) {
		return rows, nil
	}
	rows = rows[:p.limit]
	c := at(rows[len(rows)-1])
	c.Filter = p.filter
	return rows, encodeCursor(c)
}

// cursor is the opaque position of a page: the last row's key (a number, or
// a text id) and the filter it was made under.
type cursor struct {
	After  int64  `json:"a,omitempty"`
	Key    string `json:"k,omitempty"`
	Filter string `json:"f,omitempty"`
}

func encodeCursor(c cursor) *string {
	raw, _ := json.Marshal(c)
	s := base64.RawURLEncoding.EncodeToString(raw)
	return &s
}

// maxCursor bounds a cursor's length: a key is at most 128 characters and a
// filter names a listing and its ids, so Herald's cursors are far shorter.
const maxCursor = 1024

// decodeCursor reads a cursor of the listing filter names. A cursor is
// opaque but forgeable (base64 of JSON), and what it holds reaches the
// database's queries, so anything but a cursor Herald made is refused as
// invalid_cursor: it must decode, hold text PostgreSQL can take (UTF-8, no
// NUL, no control characters) and a key of an id's length, and encode back
// to itself, which refuses unknown, reordered or repeated members and
// every other spelling of the same JSON.
func decodeCursor(s, filter string) (cursor, error) {
	bad := &Error{Status: http.StatusBadRequest, Code: "invalid_cursor", Field: "cursor",
		Message: "cursor is not one this listing returned; start again from the first page"}
	if len(s) > maxCursor {
		return cursor{}, bad
	}
	raw, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil || !utf8.Valid(raw) {
		return cursor{}, bad
	}
	var c cursor
	if err := json.Unmarshal(raw, &c); err != nil {
		return cursor{}, bad
	}
	switch {
	case (c.After <= 0) == (c.Key == ""), c.Filter != filter, len(c.Key) > maxCursorKey,
		strings.IndexFunc(c.Key, unicode.IsControl) >= 0, *encodeCursor(c) != s:
		return cursor{}, bad
	}
	return c, nil
}

// maxCursorKey is the longest key a cursor holds: a caller's id.
const maxCursorKey = 128
