package db

import (
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// ErrNotFound is returned for a row that does not exist.
var ErrNotFound = errors.New("not found")

// ErrConflict is returned when a write breaks a unique constraint.
var ErrConflict = errors.New("conflict")

// Translate maps driver errors onto the package's errors, so that callers
// above the database never inspect pgx or SQLSTATE codes. Other errors pass
// through unchanged.
func Translate(err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, pgx.ErrNoRows) {
		return ErrNotFound
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "23505" {
		return errors.Join(ErrConflict, err)
	}
	return err
}
