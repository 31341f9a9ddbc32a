package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/heraldpush/herald/api"
	"github.com/heraldpush/herald/db"
)

// adminEnv is what `herald keys` and `herald operators` read.
var adminEnv = envOf("DATABASE_URL", "DATABASE_URL_FILE", "HERALD_DB_SCHEMA")

// runKeys manages the API keys stored in the database: every process takes
// a change within about a second, without a restart.
func runKeys(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	const usage = "herald keys create --name NAME --scope send|read|apps|admin [--apps A,B] [--expires-in DURATION] | list | revoke NAME"
	sub, rest := subcommand(args)
	switch sub {
	case "create":
		return createKey(ctx, rest, getenv, stdout, stderr)
	case "list":
		return listKeys(ctx, rest, getenv, stdout, stderr)
	case "revoke":
		return revokeKey(ctx, rest, getenv, stdout, stderr)
	case "help", "-h", "--help":
		fmt.Fprintf(stdout, "Usage: %s\n", usage)
		return nil
	}
	return fmt.Errorf("usage: %s", usage)
}

func createKey(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := newFlagSet("keys create", stderr)
	name := fs.String("name", "", "the key's name, unique among all keys ever made (letters, digits and . _ -)")
	scope := fs.String("scope", "", "what the key may do: read (GET only), send (what an application does), apps (manage apps and their credentials) or admin (also erase, keys, audit)")
	expiresIn := fs.Duration("expires-in", 0, "how long the key works, as 720h; 0: until revoked")
	appList := fs.String("apps", "", "the apps the key may act for, comma-separated (docs/apps.md); empty: every app")
	if help, err := parseFlags(fs, args, "herald keys create --name NAME --scope send|read|apps|admin [--apps A,B] [--expires-in DURATION]\n\nMakes an API key and prints its secret, once, on stdout: only its digest is stored.", adminEnv, stdout); help || err != nil {
		return err
	}
	if *expiresIn < 0 {
		return fmt.Errorf("--expires-in %s: give a positive duration, or 0 for a key that does not expire", *expiresIn)
	}
	return withAdminPool(ctx, getenv, func(pool *pgxpool.Pool) error {
		k := api.NewKey{Name: *name, Scope: api.Scope(*scope)}
		for _, a := range strings.Split(*appList, ",") {
			if a = strings.TrimSpace(a); a != "" {
				k.Apps = append(k.Apps, a)
			}
		}
		if *expiresIn > 0 {
			at := time.Now().Add(*expiresIn).Truncate(time.Second)
			k.ExpiresAt = &at
		}
		key, secret, err := api.CreateKey(ctx, pool, k)
		if err != nil {
			return plain(err)
		}
		// The secret alone on stdout, so that a script can take it; the rest
		// is for the person who ran the command.
		expires := "never expires"
		if key.ExpiresAt != nil {
			expires = "expires " + key.ExpiresAt.Format(time.RFC3339)
		}
		fmt.Fprintf(stderr, "herald keys: made key %q, scope %s, %s; its secret is below and is shown only this once\n", key.Name, key.Scope, expires)
		fmt.Fprintln(stdout, secret)
		return nil
	})
}

func listKeys(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := newFlagSet("keys list", stderr)
	if help, err := parseFlags(fs, args, "herald keys list\n\nLists the stored API keys, revoked ones too; never their secrets. HERALD_API_KEYS's keys are not stored, so not listed.", adminEnv, stdout); help || err != nil {
		return err
	}
	return withAdminPool(ctx, getenv, func(pool *pgxpool.Pool) error {
		keys, err := api.ListKeys(ctx, pool)
		if err != nil {
			return err
		}
		tw := tabwriter.NewWriter(stdout, 2, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "NAME\tSCOPE\tCREATED\tEXPIRES\tLAST USED\tREVOKED")
		for _, k := range keys {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", k.Name, k.Scope, k.CreatedAt.Format(time.RFC3339),
				instantOr(k.ExpiresAt, "never"), instantOr(k.LastUsedAt, "-"), instantOr(k.RevokedAt, "-"))
		}
		return tw.Flush()
	})
}

func revokeKey(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := newFlagSet("keys revoke", stderr)
	name, help, err := parseNamed(fs, args, "herald keys revoke NAME\n\nRevokes a key: every process refuses it within about a second.", stdout)
	if help || err != nil {
		return err
	}
	return withAdminPool(ctx, getenv, func(pool *pgxpool.Pool) error {
		key, err := api.RevokeKey(ctx, pool, name)
		if err != nil {
			return plain(err)
		}
		fmt.Fprintf(stdout, "herald keys: revoked key %q at %s\n", key.Name, key.RevokedAt.Format(time.RFC3339))
		return nil
	})
}

// subcommand splits args into their first word and the rest.
func subcommand(args []string) (string, []string) {
	if len(args) == 0 {
		return "", nil
	}
	return args[0], args[1:]
}

// parseNamed parses args, which name one thing (a key, an operator) before
// or after any flags.
func parseNamed(fs *flag.FlagSet, args []string, synopsis string, stdout io.Writer) (string, bool, error) {
	return parseNamedIn(fs, args, synopsis, adminEnv, stdout)
}

// parseNamedIn is parseNamed for a command that reads env.
func parseNamedIn(fs *flag.FlagSet, args []string, synopsis string, env []envVar, stdout io.Writer) (string, bool, error) {
	var name string
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		name, args = args[0], args[1:]
	}
	if help, err := parseFlags(fs, args, synopsis, env, stdout); help || err != nil {
		return "", help, err
	}
	if name == "" {
		first, _, _ := strings.Cut(synopsis, "\n")
		return "", false, fmt.Errorf("give the name: %s", first)
	}
	return name, false, nil
}

// withAdminPool runs f with a small pool on the migrated database, for the
// commands that manage keys and operators.
func withAdminPool(ctx context.Context, getenv func(string) string, f func(pool *pgxpool.Pool) error) error {
	pool, _, err := openDatabase(ctx, getenv)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := db.CheckMigrated(ctx, pool); err != nil {
		if errors.Is(err, db.ErrNotMigrated) {
			return fmt.Errorf("%w; run `herald migrate` first", err)
		}
		return err
	}
	return f(pool)
}

// openDatabase reads the configuration and opens a pool of two connections
// on its database.
func openDatabase(ctx context.Context, getenv func(string) string) (*pgxpool.Pool, config, error) {
	cfg, err := loadConfig(getenv)
	if err != nil {
		return nil, cfg, err
	}
	if err := cfg.requireDatabase(); err != nil {
		return nil, cfg, err
	}
	pool, err := db.Open(ctx, cfg.DatabaseURL, db.PoolConfig{MaxConns: 2, Schema: cfg.DBSchema})
	return pool, cfg, err
}

// plain is err with an API error's message alone: at a terminal the code
// and the field add nothing to the sentence.
func plain(err error) error {
	var apiErr *api.Error
	if errors.As(err, &apiErr) {
		return errors.New(apiErr.Message)
	}
	return err
}

// instantOr formats t in RFC 3339, or says none when it is nil.
func instantOr(t *time.Time, none string) string {
	if t == nil {
		return none
	}
	return t.Format(time.RFC3339)
}
