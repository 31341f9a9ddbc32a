package db

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// CreateDatabase creates an empty database named name on the server conn
// is connected to. A database name is an identifier, which sqlc cannot
// take as a parameter, so the statement is written here.
func CreateDatabase(ctx context.Context, conn DBTX, name string) error {
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		return fmt.Errorf("create database %s: %w", name, err)
	}
	return nil
}

// DropDatabase drops database name, if it exists, disconnecting whoever is
// still connected to it.
func DropDatabase(ctx context.Context, conn DBTX, name string) error {
	if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
		return fmt.Errorf("drop database %s: %w", name, err)
	}
	return nil
}
