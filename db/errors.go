package db

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"syscall"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// ErrNotFound is returned for a row that does not exist.
var ErrNotFound = errors.New("not found")

// ErrConflict is returned when a write breaks a unique constraint.
var ErrConflict = errors.New("conflict")

// ErrUnavailable is returned when the database cannot be reached or is
// shutting down or starting up: the same request may succeed once it is
// back, so callers wait and retry rather than fail for good.
var ErrUnavailable = errors.New("database unavailable")

// On returns the queries run on dbtx (a pool, a connection or a
// transaction) with their errors interpreted: a missing row is ErrNotFound
// and a unique violation ErrConflict for errors.Is, each keeping the
// driver's error as its cause. It is the one way code outside this package
// gets Queries: sqlc's generated New hands the driver's errors up as they
// are, and sqlc cannot be told to leave it out.
func On(dbtx DBTX) *Queries {
	return New(interpreting{dbtx})
}

// interpretError maps driver errors onto the package's errors, so that
// callers above the database never inspect pgx or SQLSTATE codes and can
// use errors.Is. Other errors pass through unchanged.
func interpretError(err error) error {
	switch {
	case err == nil, errors.Is(err, ErrNotFound), errors.Is(err, ErrConflict), errors.Is(err, ErrUnavailable):
		return err
	case errors.Is(err, pgx.ErrNoRows):
		return &interpreted{kind: ErrNotFound, cause: err}
	case unavailable(err):
		return &interpreted{kind: ErrUnavailable, cause: err}
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "23505" {
		return &interpreted{kind: ErrConflict, cause: err}
	}
	return err
}

// unavailable reports whether err says the database was out of reach
// rather than that the statement was wrong: no connection could be made or
// it broke, or the server is shutting down, starting up or full.
func unavailable(err error) bool {
	var (
		pgErr      *pgconn.PgError
		connectErr *pgconn.ConnectError
		netErr     net.Error
	)
	switch {
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		// The caller's own deadline or cancellation, whatever the
		// driver was doing at the time.
		return false
	case errors.As(err, &pgErr):
		// Class 08: connection exceptions. 57P01-57P03: the server is
		// shutting down or not yet accepting connections. 53300: too many
		// connections.
		return strings.HasPrefix(pgErr.Code, "08") || pgErr.Code == "57P01" || pgErr.Code == "57P02" ||
			pgErr.Code == "57P03" || pgErr.Code == "53300"
	case errors.As(err, &connectErr), errors.As(err, &netErr),
		errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, net.ErrClosed),
		errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE):
		return true
	}
	// A query that never reached the server (its connection was found
	// closed) is safe to send again, and says the server went away.
	return pgconn.SafeToRetry(err)
}

// interpreted is a driver error with the package error it stands for: it
// is both for errors.Is and errors.As, so the SQLSTATE stays at hand for a
// log line.
type interpreted struct {
	kind, cause error
}

func (e *interpreted) Error() string   { return e.kind.Error() + ": " + e.cause.Error() }
func (e *interpreted) Unwrap() []error { return []error{e.kind, e.cause} }

// interpreting is a DBTX whose every error, including those its rows and
// row report when scanned, has been through interpretError.
type interpreting struct {
	DBTX
}

func (t interpreting) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	tag, err := t.DBTX.Exec(ctx, sql, args...)
	return tag, interpretError(err)
}

func (t interpreting) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	rows, err := t.DBTX.Query(ctx, sql, args...)
	if err != nil {
		return nil, interpretError(err)
	}
	return interpretingRows{rows}, nil
}

func (t interpreting) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return interpretingRow{t.DBTX.QueryRow(ctx, sql, args...)}
}

type interpretingRows struct {
	pgx.Rows
}

func (r interpretingRows) Scan(dest ...any) error { return interpretError(r.Rows.Scan(dest...)) }
func (r interpretingRows) Err() error             { return interpretError(r.Rows.Err()) }

type interpretingRow struct {
	row pgx.Row
}

func (r interpretingRow) Scan(dest ...any) error { return interpretError(r.row.Scan(dest...)) }
