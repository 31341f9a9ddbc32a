package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/heraldpush/herald/api"
)

// passwordFileVar names a file holding the new operator's password, for
// `herald operators create` run where nothing can be piped in.
const passwordFileVar = "HERALD_OPERATOR_PASSWORD_FILE"

// operatorsEnv is what `herald operators create` reads.
var operatorsEnv = append(adminEnv[:len(adminEnv):len(adminEnv)],
	envVar{passwordFileVar, "a file holding the new operator's password, instead of stdin", nil, "none (stdin)"})

// runOperators manages the dashboard's named operators. stdin carries a new
// operator's password.
func runOperators(ctx context.Context, args []string, getenv func(string) string, stdin io.Reader, stdout, stderr io.Writer) error {
	const usage = "herald operators create --name NAME (password on stdin or in HERALD_OPERATOR_PASSWORD_FILE) | list | remove NAME"
	sub, rest := subcommand(args)
	switch sub {
	case "create":
		return createOperator(ctx, rest, getenv, stdin, stdout, stderr)
	case "list":
		return listOperators(ctx, rest, getenv, stdout, stderr)
	case "remove":
		return removeOperator(ctx, rest, getenv, stdout, stderr)
	case "help", "-h", "--help":
		fmt.Fprintf(stdout, "Usage: %s\n", usage)
		return nil
	}
	return fmt.Errorf("usage: %s", usage)
}

func createOperator(ctx context.Context, args []string, getenv func(string) string, stdin io.Reader, stdout, stderr io.Writer) error {
	fs := newFlagSet("operators create", stderr)
	name := fs.String("name", "", "the operator's name, with which it signs in (letters, digits and . _ @ -)")
	synopsis := "herald operators create --name NAME < password-file\n\n" +
		"Makes a dashboard operator. Its password, at least 12 characters, is read from stdin, or from\n" +
		"the file HERALD_OPERATOR_PASSWORD_FILE names; only its argon2id hash is stored."
	if help, err := parseFlags(fs, args, synopsis, operatorsEnv, stdout); help || err != nil {
		return err
	}
	password, err := readPassword(getenv, stdin)
	if err != nil {
		return err
	}
	return withAdminPool(ctx, getenv, func(pool *pgxpool.Pool) error {
		op, err := api.CreateOperator(ctx, pool, *name, password)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "herald operators: made operator %q; it signs in at /login\n", op.Name)
		return nil
	})
}

// maxPasswordInput bounds what is read as a password: a line.
const maxPasswordInput = 4 << 10

// readPassword reads a new operator's password from the file
// HERALD_OPERATOR_PASSWORD_FILE names, else from stdin, less the trailing
// line break. A terminal is refused: it would show the password as it is
// typed.
func readPassword(getenv func(string) string, stdin io.Reader) (string, error) {
	var (
		raw []byte
		err error
	)
	if path := getenv(passwordFileVar); path != "" {
		if raw, err = readAtMost(path, maxPasswordInput); err != nil {
			return "", fmt.Errorf("%s: %w", passwordFileVar, err)
		}
	} else {
		if f, ok := stdin.(*os.File); ok {
			if info, err := f.Stat(); err == nil && info.Mode()&os.ModeCharDevice != 0 {
				return "", fmt.Errorf("the password is read from stdin, which is a terminal that would show it: pipe it in (read -rs PW; printf '%%s' \"$PW\" | herald operators create ...), or name a file in %s", passwordFileVar)
			}
		}
		if raw, err = io.ReadAll(io.LimitReader(stdin, maxPasswordInput+1)); err != nil {
			return "", fmt.Errorf("read the password from stdin: %w", err)
		}
		if len(raw) > maxPasswordInput {
			return "", fmt.Errorf("stdin holds more than a password (%d bytes at most)", maxPasswordInput)
		}
	}
	password := strings.TrimRight(string(raw), "\r\n")
	if strings.ContainsAny(password, "\r\n") {
		return "", errors.New("the password is more than one line")
	}
	return password, api.CheckPassword(password)
}

func listOperators(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := newFlagSet("operators list", stderr)
	if help, err := parseFlags(fs, args, "herald operators list\n\nLists the named operators (HERALD_ADMIN_PASSWORD's admin is not stored, so not listed).", adminEnv, stdout); help || err != nil {
		return err
	}
	return withAdminPool(ctx, getenv, func(pool *pgxpool.Pool) error {
		ops, err := api.ListOperators(ctx, pool)
		if err != nil {
			return err
		}
		tw := tabwriter.NewWriter(stdout, 2, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "NAME\tCREATED")
		for _, op := range ops {
			fmt.Fprintf(tw, "%s\t%s\n", op.Name, op.CreatedAt.UTC().Format(time.RFC3339))
		}
		return tw.Flush()
	})
}

func removeOperator(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := newFlagSet("operators remove", stderr)
	name, help, err := parseNamed(fs, args, "herald operators remove NAME\n\nRemoves an operator and ends its sessions on every process.", stdout)
	if help || err != nil {
		return err
	}
	return withAdminPool(ctx, getenv, func(pool *pgxpool.Pool) error {
		if err := api.RemoveOperator(ctx, pool, name); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "herald operators: removed operator %q and ended its sessions\n", name)
		return nil
	})
}
