package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/oauth2"
	"golang.org/x/oauth2/google"

	"github.com/heraldpush/herald/db"
	"github.com/heraldpush/herald/jobs/apps"
	"github.com/heraldpush/herald/jobs/push"
)

// credentialsEnv is what `herald credentials check` reads: the default
// app's credentials in the environment, the CA bundle its token requests
// trust, and the database and key of the stored ones.
var credentialsEnv = envOf("APNS_KEY_FILE", "APNS_KEY_ID", "APNS_TEAM_ID", "APNS_TOPIC", "FCM_CREDENTIALS_FILE",
	"VAPID_PUBLIC_KEY", "VAPID_PRIVATE_KEY", "VAPID_PRIVATE_KEY_FILE", "VAPID_SUBJECT", "SSL_CERT_FILE",
	"DATABASE_URL", "DATABASE_URL_FILE", "HERALD_DB_SCHEMA", "HERALD_SECRET_KEY", "HERALD_SECRET_KEY_FILE")

// fcmScope is the OAuth 2.0 scope FCM's send endpoint requires: the token
// a check mints is one a send could use.
const fcmScope = "https://www.googleapis.com/auth/firebase.messaging"

// runCredentials is `herald credentials check`: every configured credential
// held to what its provider takes, without sending a push, so that a bad
// key is found before the first delivery fails credentials_refused.
func runCredentials(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	const usage = "herald credentials check [--offline]"
	sub, rest := subcommand(args)
	switch sub {
	case "check":
	case "help", "-h", "--help":
		fmt.Fprintf(stdout, "Usage: %s\n", usage)
		return nil
	default:
		return fmt.Errorf("usage: %s", usage)
	}
	fs := newFlagSet("credentials check", stderr)
	offline := fs.Bool("offline", false, "check shapes alone: no FCM access token is minted, nothing is reached")
	synopsis := usage + "\n\nChecks each configured credential without sending a push: the default app's in the environment " +
		"(APNS_KEY_FILE..., FCM_CREDENTIALS_FILE, VAPID_PRIVATE_KEY...) and, with DATABASE_URL, every app's live stored one, " +
		"opened with HERALD_SECRET_KEY. An FCM service account must also mint an access token from its token_uri, unless --offline. " +
		"Prints a line a credential, never a secret, and fails when any fails."
	if help, err := parseFlags(fs, rest, synopsis, credentialsEnv, stdout); help || err != nil {
		return err
	}
	cfg, err := loadConfig(getenv)
	if err != nil {
		return err
	}
	c := &credentialChecker{offline: *offline, certFile: cfg.CertFile, out: stdout}
	defer c.close()
	c.checkEnvironment(ctx, cfg)
	if cfg.DatabaseURL != "" {
		if err := withAdminPool(ctx, getenv, func(pool *pgxpool.Pool) error {
			return c.checkStored(ctx, pool, cfg.Sealer)
		}); err != nil {
			return fmt.Errorf("stored credentials: %w", err)
		}
	}
	switch {
	case c.checked == 0 && cfg.DatabaseURL == "":
		return errors.New("no credentials to check: the environment has none (APNS_KEY_FILE, FCM_CREDENTIALS_FILE, VAPID_PRIVATE_KEY) and DATABASE_URL is not set to read the stored ones")
	case c.checked == 0:
		return errors.New("no credentials to check: the environment has none (APNS_KEY_FILE, FCM_CREDENTIALS_FILE, VAPID_PRIVATE_KEY) and no app has a live stored one")
	case c.failed > 0:
		return fmt.Errorf("%d of %d credentials failed", c.failed, c.checked)
	}
	return nil
}

// credentialChecker checks credentials one by one and prints a line for
// each: "ok" and its public part, or "FAIL" and what to fix.
type credentialChecker struct {
	offline  bool
	certFile string
	out      io.Writer
	// tokens is the client of the token endpoints, made on first use.
	tokens    *http.Client
	transport *http.Transport

	checked, failed int
}

// report prints one credential's line. An error's text is the provider
// package's or the token endpoint's, neither of which holds a secret; it
// is kept to one line.
func (c *credentialChecker) report(label, summary string, err error) {
	c.checked++
	if err != nil {
		c.failed++
		fmt.Fprintf(c.out, "FAIL %s: %s\n", label, strings.Join(strings.Fields(err.Error()), " "))
		return
	}
	fmt.Fprintf(c.out, "ok   %s %s\n", label, summary)
}

// close closes the token client's idle connections.
func (c *credentialChecker) close() {
	if c.transport != nil {
		c.transport.CloseIdleConnections()
	}
}

// envFields names, for each field a credential's Check may refuse, the
// variable that sets it in the environment.
var envFields = map[string]string{
	"apns.key": "APNS_KEY_FILE", "apns.key_id": "APNS_KEY_ID", "apns.team_id": "APNS_TEAM_ID", "apns.topic": "APNS_TOPIC",
	"fcm.service_account": "FCM_CREDENTIALS_FILE",
	"webpush.public_key":  "VAPID_PUBLIC_KEY", "webpush.private_key": "VAPID_PRIVATE_KEY", "webpush.subject": "VAPID_SUBJECT",
}

// checkEnvironment checks the default app's credentials of the
// environment, each channel that is configured, and says of a channel set
// in part that serve leaves it off.
func (c *credentialChecker) checkEnvironment(ctx context.Context, cfg config) {
	envErr := func(err error) error {
		var inv *apps.InvalidError
		if errors.As(err, &inv) {
			if name, ok := envFields[inv.Field]; ok {
				return fmt.Errorf("%s: %s", name, inv.Problem)
			}
		}
		return err
	}
	const label = apps.DefaultName + " %s (environment)"
	switch {
	case cfg.APNs.enabled():
		cred := &apps.APNs{KeyID: cfg.APNs.KeyID, TeamID: cfg.APNs.TeamID, Topic: cfg.APNs.Topic}
		key, err := readAtMost(cfg.APNs.KeyFile, maxSecretFile)
		if err != nil {
			c.report(fmt.Sprintf(label, apps.ChannelAPNs), "", fmt.Errorf("APNS_KEY_FILE: %w", err))
			break
		}
		cred.Key = string(key)
		summary, err := checkAPNs(cred)
		c.report(fmt.Sprintf(label, apps.ChannelAPNs), summary, envErr(err))
	case cfg.APNs.KeyID != "" || cfg.APNs.TeamID != "" || cfg.APNs.Topic != "":
		c.report(fmt.Sprintf(label, apps.ChannelAPNs), "", errors.New("APNS_KEY_ID, APNS_TEAM_ID or APNS_TOPIC is set but APNS_KEY_FILE is not, so APNs is off: set APNS_KEY_FILE to the .p8 key's file, or unset the others"))
	}
	if cfg.FCM.enabled() {
		sa, err := readAtMost(cfg.FCM.CredentialsFile, maxSecretFile)
		if err != nil {
			c.report(fmt.Sprintf(label, apps.ChannelFCM), "", fmt.Errorf("FCM_CREDENTIALS_FILE: %w", err))
		} else {
			summary, err := c.checkFCM(ctx, &apps.FCM{ServiceAccount: string(sa)})
			if errors.Is(err, errTokenRefused) {
				err = fmt.Errorf("%w, and set FCM_CREDENTIALS_FILE to its file", err)
			}
			c.report(fmt.Sprintf(label, apps.ChannelFCM), summary, envErr(err))
		}
	}
	switch {
	case cfg.WebPush.enabled():
		summary, err := checkWebPush(&apps.WebPush{PublicKey: cfg.WebPush.PublicKey, PrivateKey: cfg.WebPush.PrivateKey, Subject: cfg.WebPush.Subject})
		c.report(fmt.Sprintf(label, apps.ChannelWebPush), summary, envErr(err))
	case cfg.WebPush.PublicKey != "" || cfg.WebPush.Subject != "":
		c.report(fmt.Sprintf(label, apps.ChannelWebPush), "", errors.New("VAPID_PUBLIC_KEY or VAPID_SUBJECT is set but VAPID_PRIVATE_KEY is not, so Web Push is off: set VAPID_PRIVATE_KEY (or VAPID_PRIVATE_KEY_FILE) to the pair's private half, or unset the others"))
	}
}

// setCredentialsFlags are `herald apps set-credentials`'s flags of each
// channel, for a failed stored credential's fix.
var setCredentialsFlags = map[string]string{
	apps.ChannelAPNs:    "--apns-key FILE --key-id ID --team-id ID --topic BUNDLE",
	apps.ChannelFCM:     "--fcm-service-account FILE",
	apps.ChannelWebPush: "--vapid-public-key KEY --vapid-private-key-file FILE --vapid-subject CONTACT",
}

// checkStored checks every app's live stored credential, opened with
// sealer.
func (c *credentialChecker) checkStored(ctx context.Context, pool *pgxpool.Pool, sealer *apps.Sealer) error {
	ix, err := apps.ReadIndex(ctx, pool)
	if err != nil {
		return err
	}
	rows, err := db.On(pool).LiveCredentials(ctx)
	if err != nil {
		return fmt.Errorf("read credentials: %w", err)
	}
	for _, row := range rows {
		app := ix.ByID[row.AppID]
		label := fmt.Sprintf("%s %s v%d", app, row.Channel, row.Version)
		if row.State != apps.StateActive {
			label += " (" + row.State + ")"
		}
		summary, err := c.checkSealed(ctx, row, sealer)
		// A token endpoint out of reach says nothing of the credential.
		if err != nil && !errors.Is(err, errTokenUnreachable) {
			fix := fmt.Sprintf("store a working one: herald apps set-credentials %s %s", app, setCredentialsFlags[row.Channel])
			if row.State != apps.StateActive {
				fix = fmt.Sprintf("retire it: herald apps retire %s %s --version %d", app, row.Channel, row.Version)
			}
			if errors.Is(err, errCannotOpen) {
				err = fmt.Errorf("%w, or if that key is lost, %s", err, fix)
			} else {
				err = fmt.Errorf("%w; %s", err, fix)
			}
		}
		c.report(label, summary, err)
	}
	return nil
}

// checkSealed opens a stored credential and checks it.
func (c *credentialChecker) checkSealed(ctx context.Context, row db.LiveCredentialsRow, sealer *apps.Sealer) (string, error) {
	secret, err := sealer.Open(row.AppID, row.Channel, row.Version, row.SealKey, row.Sealed)
	if err != nil {
		if !sealer.CanSeal() {
			return "", fmt.Errorf("%w: it was sealed with key %s and HERALD_SECRET_KEY is not set; set it to that key", errCannotOpen, row.SealKey)
		}
		return "", fmt.Errorf("%w: %w; add that key to HERALD_SECRET_KEY (comma-separated, after the one that seals)", errCannotOpen, err)
	}
	// The public part is stored as the API shows it; the secret was sealed
	// apart (apps.Input's split).
	badPublic := func(err error) (string, error) { return "", fmt.Errorf("its public part does not parse: %w", err) }
	switch row.Channel {
	case apps.ChannelAPNs:
		cred := &apps.APNs{}
		if err := json.Unmarshal(row.Public, cred); err != nil {
			return badPublic(err)
		}
		cred.Key = string(secret)
		return checkAPNs(cred)
	case apps.ChannelFCM:
		cred := &apps.FCM{}
		if err := json.Unmarshal(row.Public, cred); err != nil {
			return badPublic(err)
		}
		cred.ServiceAccount = string(secret)
		return c.checkFCM(ctx, cred)
	case apps.ChannelWebPush:
		cred := &apps.WebPush{}
		if err := json.Unmarshal(row.Public, cred); err != nil {
			return badPublic(err)
		}
		cred.PrivateKey = string(secret)
		return checkWebPush(cred)
	}
	return "", fmt.Errorf("unknown channel %q", row.Channel)
}

// checkAPNs checks an APNs credential offline (the key parses, is P-256,
// signs a provider token; the ids and topic are shaped right): Apple
// answers nothing short of a push.
func checkAPNs(cred *apps.APNs) (string, error) {
	if err := cred.Check(); err != nil {
		return "", err
	}
	return fmt.Sprintf("key %s team %s topic %s", cred.KeyID, cred.TeamID, cred.Topic), nil
}

// checkWebPush checks a VAPID pair: its halves match and its subject is a
// contact. A push service answers nothing short of a push.
func checkWebPush(cred *apps.WebPush) (string, error) {
	if err := cred.Check(); err != nil {
		return "", err
	}
	return fmt.Sprintf("public key %s subject %s", cred.PublicKey, cred.Subject), nil
}

// checkFCM checks a service account's shape and, unless offline, that its
// token endpoint grants it an access token for FCM.
func (c *credentialChecker) checkFCM(ctx context.Context, cred *apps.FCM) (string, error) {
	if err := cred.Check(); err != nil {
		return "", err
	}
	summary := fmt.Sprintf("project %s as %s key %s", cred.ProjectID, cred.ClientEmail, cred.PrivateKeyID)
	if c.offline {
		return summary + " (no token minted: --offline)", nil
	}
	if err := c.mintFCMToken(ctx, cred.ServiceAccount); err != nil {
		return "", err
	}
	return summary + " (token minted)", nil
}

// mintFCMToken trades a JWT signed with the service account's key for an
// access token at its token_uri (RFC 7523's JWT-bearer grant), as a send
// does.
func (c *credentialChecker) mintFCMToken(ctx context.Context, serviceAccount string) error {
	conf, err := google.JWTConfigFromJSON([]byte(serviceAccount), fcmScope)
	if err != nil {
		return fmt.Errorf("read the service account: %w", err)
	}
	if c.tokens == nil {
		roots, err := rootCAs(c.certFile)
		if err != nil {
			return err
		}
		c.transport = http.DefaultTransport.(*http.Transport).Clone()
		c.transport.TLSClientConfig = &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}
		// oauth2 posts without the context: the client's timeout bounds it.
		c.tokens = &http.Client{Transport: c.transport, Timeout: push.WarmTimeout}
	}
	tok, err := conf.TokenSource(context.WithValue(ctx, oauth2.HTTPClient, c.tokens)).Token()
	var refused *oauth2.RetrieveError
	switch {
	case errors.As(err, &refused):
		return fmt.Errorf("%w: %s refused it (%s): its key was deleted or is not %s's, or the account may not use FCM; "+
			"make a new key (Firebase console, Project settings, Service accounts, Generate new private key)", errTokenRefused, conf.TokenURL, refusal(refused), conf.Email)
	case err != nil:
		return fmt.Errorf("%w %s: %w; check that it is reachable from here (and SSL_CERT_FILE for a private CA), or check shapes alone with --offline", errTokenUnreachable, conf.TokenURL, err)
	case tok.AccessToken == "":
		return fmt.Errorf("%w: %s answered without an access token", errTokenRefused, conf.TokenURL)
	}
	return nil
}

// errCannotOpen is a stored credential that HERALD_SECRET_KEY does not
// open.
var errCannotOpen = errors.New("cannot be opened")

// What minting an FCM token may end in besides a token: the endpoint
// refused the service account (it must be replaced), or it could not be
// asked (which says nothing of the credential).
var (
	errTokenRefused     = errors.New("no access token for the service account")
	errTokenUnreachable = errors.New("no access token: cannot reach the token endpoint")
)

// refusal is what a token endpoint's refusal says: its OAuth error and
// description (RFC 6749, section 5.2), else its status.
func refusal(e *oauth2.RetrieveError) string {
	var body struct {
		Error       string `json:"error"`
		Description string `json:"error_description"`
	}
	if json.Unmarshal(e.Body, &body) == nil && body.Error != "" {
		if body.Description != "" {
			return body.Error + ": " + body.Description
		}
		return body.Error
	}
	if e.ErrorCode != "" {
		return e.ErrorCode
	}
	if e.Response != nil {
		return e.Response.Status
	}
	return "refused"
}
