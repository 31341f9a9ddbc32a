package apps

import (
	"crypto/ecdh"
	"crypto/elliptic"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"net/mail"
	"net/url"
	"regexp"
	"strings"

	"github.com/sideshow/apns2/token"
)

// The channels an app has credentials for, as the API names them.
const (
	ChannelAPNs    = "apns"
	ChannelFCM     = "fcm"
	ChannelWebPush = "webpush"
)

// Channels are every channel, in the order Herald lists them.
var Channels = []string{ChannelAPNs, ChannelFCM, ChannelWebPush}

// Credential states (migration 0021): the active one of an app's channel
// is what its new sends use; a retiring Web Push one still serves the
// subscriptions made with its key; a retired one serves nothing.
const (
	StateActive   = "active"
	StateRetiring = "retiring"
	StateRetired  = "retired"
)

// APNs is an app's token-based APNs credential: the .p8 signing key of a
// key id and team id, and the app's bundle id (its topic). One key signs
// for both of Apple's environments; a device's environment picks the host.
type APNs struct {
	KeyID  string `json:"key_id"`
	TeamID string `json:"team_id"`
	Topic  string `json:"topic"`
	// Key is the .p8 file's PEM text: the secret part.
	Key string `json:"key,omitempty"`
}

// FCM is an app's Firebase service account; its JSON names the project.
type FCM struct {
	// ServiceAccount is the service account's JSON key file: the secret
	// part.
	ServiceAccount string `json:"service_account,omitempty"`
	// What the service account says of itself, shown.
	ProjectID    string `json:"project_id"`
	ClientEmail  string `json:"client_email"`
	PrivateKeyID string `json:"private_key_id"`
}

// WebPush is an app's VAPID key pair (RFC 8292) and contact.
type WebPush struct {
	// PublicKey is the uncompressed P-256 point in base64url: what a page
	// passes to pushManager.subscribe as its applicationServerKey.
	PublicKey string `json:"public_key"`
	// PrivateKey is the private scalar in base64url: the secret part.
	PrivateKey string `json:"private_key,omitempty"`
	Subject    string `json:"subject"`
}

// Credential is one of an app's credentials, opened: what a provider
// client is built from.
type Credential struct {
	// ID is the credential's row; 0 for the environment's credentials of
	// the default app.
	ID      int64
	AppID   int32
	App     string
	Channel string
	Version int32
	State   string
	APNs    *APNs
	FCM     *FCM
	WebPush *WebPush
}

// InvalidError is a credential that cannot be used, with the field to fix.
type InvalidError struct {
	Field, Problem string
}

func (e *InvalidError) Error() string { return e.Field + ": " + e.Problem }

func invalid(field, format string, args ...any) error {
	return &InvalidError{Field: field, Problem: fmt.Sprintf(format, args...)}
}

// appleID is a key id or team id: ten upper-case letters and digits.
var appleID = regexp.MustCompile(`^[A-Z0-9]{10}$`)

// bundleID is an app's bundle id, the APNs topic.
var bundleID = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9.-]{0,154}$`)

// Check holds an APNs credential to what Apple takes: a PKCS #8 P-256 key
// that signs a provider token, ids of Apple's shape and a bundle id.
func (c *APNs) Check() error {
	switch {
	case !appleID.MatchString(c.KeyID):
		return invalid("apns.key_id", "must be the key's ten-character id from Apple's developer account (upper-case letters and digits), got %q", c.KeyID)
	case !appleID.MatchString(c.TeamID):
		return invalid("apns.team_id", "must be the ten-character team id from Apple's developer account, got %q", c.TeamID)
	case !bundleID.MatchString(c.Topic):
		return invalid("apns.topic", "must be the app's bundle id (e.g. com.example.app), got %q", c.Topic)
	case strings.HasSuffix(c.Topic, ".voip") || strings.HasSuffix(c.Topic, ".complication"):
		return invalid("apns.topic", "is the app's bundle id alone: Herald adds a push type's suffix itself")
	}
	key, err := token.AuthKeyFromBytes([]byte(c.Key))
	if err != nil {
		return invalid("apns.key", "must be the .p8 file's text (-----BEGIN PRIVATE KEY-----...), a P-256 key: %v", err)
	}
	if key.Curve != elliptic.P256() {
		return invalid("apns.key", "must be a P-256 key, as Apple makes them; this one is %s", key.Curve.Params().Name)
	}
	tok := &token.Token{AuthKey: key, KeyID: c.KeyID, TeamID: c.TeamID}
	if _, err := tok.Generate(); err != nil {
		return invalid("apns.key", "cannot sign a provider token: %v", err)
	}
	return nil
}

// serviceAccount is the part of a service account's JSON Herald reads.
type serviceAccount struct {
	Type         string `json:"type"`
	ProjectID    string `json:"project_id"`
	PrivateKeyID string `json:"private_key_id"`
	PrivateKey   string `json:"private_key"`
	ClientEmail  string `json:"client_email"`
	TokenURI     string `json:"token_uri"`
}

// Check holds an FCM credential to what a service account is, and fills
// in what it says of itself.
func (c *FCM) Check() error {
	var sa serviceAccount
	if err := json.Unmarshal([]byte(c.ServiceAccount), &sa); err != nil {
		return invalid("fcm.service_account", "must be the service account's JSON key file (Firebase console, Project settings, Service accounts, Generate new private key): %v", err)
	}
	switch {
	case sa.Type != "service_account":
		return invalid("fcm.service_account", `must be a service account's key ("type": "service_account"), got type %q`, sa.Type)
	case sa.ProjectID == "":
		return invalid("fcm.service_account", "has no project_id")
	case sa.ClientEmail == "":
		return invalid("fcm.service_account", "has no client_email")
	case sa.PrivateKeyID == "":
		return invalid("fcm.service_account", "has no private_key_id")
	}
	if u, err := url.Parse(sa.TokenURI); sa.TokenURI != "" && (err != nil || u.Scheme != "https") {
		return invalid("fcm.service_account", "token_uri must be an https:// URL, got %q", sa.TokenURI)
	}
	block, _ := pem.Decode([]byte(sa.PrivateKey))
	if block == nil {
		return invalid("fcm.service_account", "private_key is not a PEM key")
	}
	if _, err := x509.ParsePKCS8PrivateKey(block.Bytes); err != nil {
		if _, err1 := x509.ParsePKCS1PrivateKey(block.Bytes); err1 != nil {
			return invalid("fcm.service_account", "private_key does not parse: %v", err)
		}
	}
	c.ProjectID, c.ClientEmail, c.PrivateKeyID = sa.ProjectID, sa.ClientEmail, sa.PrivateKeyID
	return nil
}

// Check holds a VAPID credential to RFC 8292: a P-256 pair whose halves
// match, and a contact.
func (c *WebPush) Check() error {
	pub, err := base64.RawURLEncoding.DecodeString(strings.TrimRight(c.PublicKey, "="))
	if err != nil || len(pub) != 65 || pub[0] != 4 {
		return invalid("webpush.public_key", "must be an uncompressed P-256 point (65 bytes) in base64url (herald vapid generate makes a pair)")
	}
	priv, err := base64.RawURLEncoding.DecodeString(strings.TrimRight(c.PrivateKey, "="))
	if err != nil || len(priv) != 32 {
		return invalid("webpush.private_key", "must be the 32-byte private scalar in base64url")
	}
	key, err := ecdh.P256().NewPrivateKey(priv)
	if err != nil {
		return invalid("webpush.private_key", "is not a P-256 private key: %v", err)
	}
	if string(key.PublicKey().Bytes()) != string(pub) {
		return invalid("webpush.private_key", "is not the private half of public_key")
	}
	if err := checkSubject(c.Subject); err != nil {
		return err
	}
	// Kept unpadded, as a page passes the key to pushManager.subscribe and
	// a registration names it back (application_server_key).
	c.PublicKey = strings.TrimRight(c.PublicKey, "=")
	c.PrivateKey = strings.TrimRight(c.PrivateKey, "=")
	return nil
}

// checkSubject holds a VAPID subject to a contact: a mailto: or https:
// URL, or an e-mail address, which the provider makes a mailto: one.
func checkSubject(s string) error {
	switch {
	case strings.HasPrefix(s, "mailto:"):
		if _, err := mail.ParseAddress(strings.TrimPrefix(s, "mailto:")); err != nil {
			return invalid("webpush.subject", "mailto: needs an e-mail address: %v", err)
		}
		return nil
	case strings.HasPrefix(s, "https://"):
		if u, err := url.Parse(s); err != nil || u.Host == "" {
			return invalid("webpush.subject", "is not an https:// URL")
		}
		return nil
	}
	if _, err := mail.ParseAddress(s); err != nil {
		return invalid("webpush.subject", "must be a mailto: or https: contact the push services can write to, got %q", s)
	}
	return nil
}

// Input is a credential as a caller gives it, for one channel: exactly
// one of the three is set.
type Input struct {
	APNs    *APNs    `json:"apns,omitempty"`
	FCM     *FCM     `json:"fcm,omitempty"`
	WebPush *WebPush `json:"webpush,omitempty"`
}

// Channel is the input's channel, or an error when it has none or more
// than one.
func (in *Input) Channel() (string, error) {
	var chans []string
	if in.APNs != nil {
		chans = append(chans, ChannelAPNs)
	}
	if in.FCM != nil {
		chans = append(chans, ChannelFCM)
	}
	if in.WebPush != nil {
		chans = append(chans, ChannelWebPush)
	}
	if len(chans) != 1 {
		return "", invalid("credentials", "give exactly one of apns, fcm and webpush, got %d", len(chans))
	}
	return chans[0], nil
}

// Check validates the input's credential and fills in what it says of
// itself (an FCM project).
func (in *Input) Check() error {
	if _, err := in.Channel(); err != nil {
		return err
	}
	switch {
	case in.APNs != nil:
		return in.APNs.Check()
	case in.FCM != nil:
		return in.FCM.Check()
	default:
		return in.WebPush.Check()
	}
}

// split cuts a checked input into its public part (JSON, stored in the
// clear and shown) and its secret (sealed).
func (in *Input) split() (public []byte, secret []byte, err error) {
	switch {
	case in.APNs != nil:
		p := *in.APNs
		secret, p.Key = []byte(p.Key), ""
		public, err = json.Marshal(p)
	case in.FCM != nil:
		p := *in.FCM
		secret, p.ServiceAccount = []byte(p.ServiceAccount), ""
		public, err = json.Marshal(p)
	case in.WebPush != nil:
		p := *in.WebPush
		secret, p.PrivateKey = []byte(p.PrivateKey), ""
		public, err = json.Marshal(p)
	default:
		err = errors.New("no credential")
	}
	return public, secret, err
}

// join is split's inverse: the credential of channel from its public part
// and its opened secret.
func join(channel string, public, secret []byte) (*Credential, error) {
	c := &Credential{Channel: channel}
	var err error
	switch channel {
	case ChannelAPNs:
		c.APNs = &APNs{}
		err = json.Unmarshal(public, c.APNs)
		c.APNs.Key = string(secret)
	case ChannelFCM:
		c.FCM = &FCM{}
		err = json.Unmarshal(public, c.FCM)
		c.FCM.ServiceAccount = string(secret)
	case ChannelWebPush:
		c.WebPush = &WebPush{}
		err = json.Unmarshal(public, c.WebPush)
		c.WebPush.PrivateKey = string(secret)
	default:
		err = fmt.Errorf("unknown channel %q", channel)
	}
	return c, err
}

// Public is what may be shown of a credential's public JSON: it as stored,
// which never holds a secret.
type Public = json.RawMessage
