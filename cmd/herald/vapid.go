package main

import (
	"crypto/ecdh"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"io"
	"strings"

	"github.com/heraldpush/herald/jobs/apps"
)

// runVAPID is `herald vapid generate`: a new VAPID key pair (RFC 8292) in
// the form Herald reads, VAPID_PUBLIC_KEY and VAPID_PRIVATE_KEY's (and
// POST /v1/apps/{app}/credentials's webpush.public_key and private_key),
// checked as a stored credential is.
func runVAPID(args []string, stdout, stderr io.Writer) error {
	const usage = "herald vapid generate [--subject CONTACT]"
	sub, rest := subcommand(args)
	switch sub {
	case "generate":
	case "help", "-h", "--help":
		fmt.Fprintf(stdout, "Usage: %s\n", usage)
		return nil
	default:
		return fmt.Errorf("usage: %s", usage)
	}
	fs := newFlagSet("vapid generate", stderr)
	subject := fs.String("subject", "mailto:push@example.com", "the contact push services may write to: mailto: or https:")
	synopsis := usage + "\n\nPrints a new VAPID key pair as environment lines (VAPID_PUBLIC_KEY, VAPID_PRIVATE_KEY, VAPID_SUBJECT): " +
		"the public key is what a page passes to pushManager.subscribe; keep the private one as a secret (VAPID_PRIVATE_KEY_FILE)."
	if help, err := parseFlags(fs, rest, synopsis, nil, stdout); help || err != nil {
		return err
	}
	key, err := ecdh.P256().GenerateKey(rand.Reader)
	if err != nil {
		return err
	}
	pair := apps.WebPush{
		PublicKey:  base64.RawURLEncoding.EncodeToString(key.PublicKey().Bytes()),
		PrivateKey: base64.RawURLEncoding.EncodeToString(key.Bytes()),
		Subject:    *subject,
	}
	if strings.ContainsAny(pair.Subject, " \t\n'\"`$\\") {
		return fmt.Errorf("--subject %q: a contact has no spaces, quotes or shell characters", pair.Subject)
	}
	if err := pair.Check(); err != nil {
		return fmt.Errorf("--subject: %w", err)
	}
	fmt.Fprintf(stdout, "VAPID_PUBLIC_KEY=%s\nVAPID_PRIVATE_KEY=%s\nVAPID_SUBJECT=%s\n", pair.PublicKey, pair.PrivateKey, pair.Subject)
	return nil
}
