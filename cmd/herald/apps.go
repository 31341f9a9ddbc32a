package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/heraldpush/herald/jobs/apps"
)

// appsEnv is what `herald apps` reads: the database, and the key that
// seals credentials.
var appsEnv = envOf("DATABASE_URL", "DATABASE_URL_FILE", "HERALD_DB_SCHEMA", "HERALD_SECRET_KEY", "HERALD_SECRET_KEY_FILE")

// runApps manages the apps and their credentials stored in the database:
// every process takes a change within a second or two, without a restart
// (docs/apps.md).
func runApps(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	const usage = "herald apps list | show APP | create APP | set-credentials APP --apns-key FILE --key-id ID --team-id ID --topic BUNDLE | " +
		"set-credentials APP --fcm-service-account FILE | set-credentials APP --vapid-public-key KEY --vapid-private-key-file FILE --vapid-subject CONTACT | " +
		"retire APP CHANNEL [--version N] | disable APP | enable APP | reseal"
	sub, rest := subcommand(args)
	switch sub {
	case "list":
		return appsList(ctx, rest, getenv, stdout, stderr)
	case "show":
		return appsShow(ctx, rest, getenv, stdout, stderr)
	case "create":
		return appsCreate(ctx, rest, getenv, stdout, stderr)
	case "set-credentials":
		return appsSetCredentials(ctx, rest, getenv, stdout, stderr)
	case "retire":
		return appsRetire(ctx, rest, getenv, stdout, stderr)
	case "disable", "enable":
		return appsDisable(ctx, sub, rest, getenv, stdout, stderr)
	case "reseal":
		return appsReseal(ctx, rest, getenv, stdout, stderr)
	case "help", "-h", "--help":
		fmt.Fprintf(stdout, "Usage: %s\n", usage)
		return nil
	}
	return fmt.Errorf("usage: %s", usage)
}

// withAppStore opens the database and runs f with a Store sealing with
// HERALD_SECRET_KEY.
func withAppStore(ctx context.Context, getenv func(string) string, f func(pool *pgxpool.Pool, s *apps.Store) error) error {
	return withAdminPool(ctx, getenv, func(pool *pgxpool.Pool) error {
		cfg, err := loadConfig(getenv)
		if err != nil {
			return err
		}
		return f(pool, &apps.Store{Pool: pool, Sealer: cfg.Sealer, EnvChannels: cfg.configuredChannels()})
	})
}

func appsList(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := newFlagSet("apps list", stderr)
	if help, err := parseFlags(fs, args, "herald apps list\n\nLists the apps and where each channel's sends take their credentials from; never a secret.", appsEnv, stdout); help || err != nil {
		return err
	}
	return withAppStore(ctx, getenv, func(pool *pgxpool.Pool, s *apps.Store) error {
		all, err := s.List(ctx, pool)
		if err != nil {
			return err
		}
		tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "APP\tSTATE\tAPNS\tFCM\tWEBPUSH\tCREATED")
		for _, a := range all {
			state := "enabled"
			if a.Disabled {
				state = "disabled"
			}
			cols := []string{a.Name, state}
			for _, c := range a.Channels {
				cols = append(cols, channelSummary(c))
			}
			cols = append(cols, a.CreatedAt.Format(time.RFC3339))
			fmt.Fprintln(tw, strings.Join(cols, "\t"))
		}
		return tw.Flush()
	})
}

// channelSummary is a channel's credentials in a word or two: where its
// sends take them from, and the active version.
func channelSummary(c apps.ChannelApp) string {
	for _, cred := range c.Credentials {
		if cred.State == apps.StateActive {
			return "stored v" + strconv.Itoa(int(cred.Version))
		}
	}
	return c.Source
}

func appsShow(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := newFlagSet("apps show", stderr)
	name, help, err := parseNamedIn(fs, args, "herald apps show APP\n\nPrints an app and its credentials' public parts as JSON; never a secret.", appsEnv, stdout)
	if help || err != nil {
		return err
	}
	return withAppStore(ctx, getenv, func(pool *pgxpool.Pool, s *apps.Store) error {
		a, err := s.Get(ctx, pool, name)
		if err != nil {
			return err
		}
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(a)
	})
}

func appsCreate(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := newFlagSet("apps create", stderr)
	name, help, err := parseNamedIn(fs, args, "herald apps create APP\n\nMakes an app (1 to 63 of a-z 0-9 . _ -); its devices are sent nothing until it has credentials.", appsEnv, stdout)
	if help || err != nil {
		return err
	}
	return withAppStore(ctx, getenv, func(_ *pgxpool.Pool, s *apps.Store) error {
		a, created, err := s.Create(ctx, name)
		if err != nil {
			return plain(err)
		}
		if created {
			fmt.Fprintf(stdout, "made app %q\n", a.Name)
		} else {
			fmt.Fprintf(stdout, "app %q exists already\n", a.Name)
		}
		return nil
	})
}

func appsSetCredentials(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := newFlagSet("apps set-credentials", stderr)
	apnsKey := fs.String("apns-key", "", "APNs: the .p8 signing key's file")
	keyID := fs.String("key-id", "", "APNs: the key's id (ten characters)")
	teamID := fs.String("team-id", "", "APNs: the team id (ten characters)")
	topic := fs.String("topic", "", "APNs: the app's bundle id")
	fcmFile := fs.String("fcm-service-account", "", "FCM: the service account's JSON key file")
	vapidPublic := fs.String("vapid-public-key", "", "Web Push: the VAPID public key (base64url)")
	vapidPrivate := fs.String("vapid-private-key-file", "", "Web Push: a file holding the VAPID private key (base64url)")
	subject := fs.String("vapid-subject", "", "Web Push: the contact, mailto: or https:")
	synopsis := "herald apps set-credentials APP (--apns-key FILE --key-id ID --team-id ID --topic BUNDLE | --fcm-service-account FILE | " +
		"--vapid-public-key KEY --vapid-private-key-file FILE --vapid-subject CONTACT)\n\n" +
		"Stores a new credential for one of APP's channels, sealed with HERALD_SECRET_KEY, and makes it the one its sends use on every process within a second or two; the one before is retired (for Web Push, kept for the subscriptions made with its key). Secrets are read from files, never from the command line."
	name, help, err := parseNamedIn(fs, args, synopsis, appsEnv, stdout)
	if help || err != nil {
		return err
	}
	var in apps.Input
	switch {
	case *apnsKey != "":
		key, err := readAtMost(*apnsKey, maxSecretFile)
		if err != nil {
			return fmt.Errorf("--apns-key: %w", err)
		}
		in.APNs = &apps.APNs{KeyID: *keyID, TeamID: *teamID, Topic: *topic, Key: string(key)}
	case *fcmFile != "":
		sa, err := readAtMost(*fcmFile, maxSecretFile)
		if err != nil {
			return fmt.Errorf("--fcm-service-account: %w", err)
		}
		in.FCM = &apps.FCM{ServiceAccount: string(sa)}
	case *vapidPublic != "":
		if *vapidPrivate == "" {
			return fmt.Errorf("--vapid-private-key-file is required with --vapid-public-key")
		}
		priv, err := readAtMost(*vapidPrivate, maxSecretFile)
		if err != nil {
			return fmt.Errorf("--vapid-private-key-file: %w", err)
		}
		in.WebPush = &apps.WebPush{PublicKey: *vapidPublic, PrivateKey: strings.TrimSpace(string(priv)), Subject: *subject}
	default:
		return fmt.Errorf("give one channel's credential: --apns-key, --fcm-service-account or --vapid-public-key")
	}
	if err := in.Check(); err != nil {
		return err
	}
	return withAppStore(ctx, getenv, func(_ *pgxpool.Pool, s *apps.Store) error {
		info, err := s.Rotate(ctx, name, in)
		if err != nil {
			return plain(err)
		}
		channel, _ := in.Channel()
		fmt.Fprintf(stdout, "app %q: %s credential version %d is active\n", name, channel, info.Version)
		return nil
	})
}

func appsRetire(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := newFlagSet("apps retire", stderr)
	version := fs.Int("version", 0, "retire this version alone (0: every live credential of the channel)")
	synopsis := "herald apps retire APP CHANNEL [--version N]\n\nRetires an app's credentials of a channel (apns, fcm or webpush): its sends on it then fail with channel_disabled unless another is active."
	if len(args) < 2 || strings.HasPrefix(args[1], "-") {
		if help, err := parseFlags(fs, args, synopsis, appsEnv, stdout); help || err != nil {
			return err
		}
		return fmt.Errorf("give the app's name and the channel: herald apps retire APP CHANNEL [--version N]")
	}
	name, channel := args[0], args[1]
	if help, err := parseFlags(fs, args[2:], synopsis, appsEnv, stdout); help || err != nil {
		return err
	}
	return withAppStore(ctx, getenv, func(_ *pgxpool.Pool, s *apps.Store) error {
		retired, err := s.Retire(ctx, name, channel, int32(*version))
		if err != nil {
			return plain(err)
		}
		fmt.Fprintf(stdout, "app %q: %d %s credential(s) retired\n", name, len(retired), channel)
		return nil
	})
}

func appsDisable(ctx context.Context, verb string, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := newFlagSet("apps "+verb, stderr)
	name, help, err := parseNamedIn(fs, args, "herald apps disable|enable APP\n\nA disabled app's devices are sent nothing: their deliveries fail with channel_disabled.", appsEnv, stdout)
	if help || err != nil {
		return err
	}
	return withAppStore(ctx, getenv, func(pool *pgxpool.Pool, s *apps.Store) error {
		if _, err := s.SetDisabled(ctx, pool, name, verb == "disable"); err != nil {
			return plain(err)
		}
		fmt.Fprintf(stdout, "app %q %sd\n", name, verb)
		return nil
	})
}

func appsReseal(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := newFlagSet("apps reseal", stderr)
	if help, err := parseFlags(fs, args, "herald apps reseal\n\nSeals every live credential again with HERALD_SECRET_KEY's first key, so that an older key can be dropped from it.", appsEnv, stdout); help || err != nil {
		return err
	}
	return withAppStore(ctx, getenv, func(_ *pgxpool.Pool, s *apps.Store) error {
		n, err := s.Reseal(ctx)
		if err != nil {
			return plain(err)
		}
		fmt.Fprintf(stdout, "%d credential(s) sealed again with key %s\n", n, s.Sealer.KeyID())
		return nil
	})
}
