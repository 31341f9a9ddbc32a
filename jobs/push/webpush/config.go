package webpush

import (
	"bytes"
	"crypto/ecdh"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/heraldpush/herald/jobs/push"
)

// Defaults filled in by Config.withDefaults, the one place they live.
const (
	// DefaultMaxInFlight bounds concurrent requests to one push service.
	// Web Push costs the client far more CPU than the other channels (an
	// ECDH agreement, a VAPID signature and an encryption per push), so
	// more in flight soon stops helping: past about 200 the cores are
	// saturated and 500 carry hardly more sends a second than 200
	// (BenchmarkSend; docs/performance.md has the figures).
	DefaultMaxInFlight = 200
	// DefaultHostRate is the sends a second to one push service, with
	// bursts of a minute's worth. No push service publishes a rate for Web
	// Push, so it is FCM's figure for its own API (600,000 a minute), far
	// above what one process sends: a service that wants less answers a
	// 429 or a 503 with a Retry-After, which the in-flight bound follows.
	DefaultHostRate = 10_000
	// DefaultRequestTimeout bounds one request, so that a hung push service
	// never holds a chunk.
	DefaultRequestTimeout = 5 * time.Second
)

// Config configures the Web Push provider.
type Config struct {
	// VAPIDPublicKey is the application server's public key, an
	// uncompressed P-256 point in base64url (VAPID_PUBLIC_KEY).
	VAPIDPublicKey string
	// VAPIDPrivateKey is its private scalar in base64url (VAPID_PRIVATE_KEY).
	VAPIDPrivateKey string
	// Subject is the contact push services may write to (VAPID_SUBJECT): a
	// mailto: or https: URL, or a bare e-mail address.
	Subject string
	// RootCAs verifies push services; nil means the system pool, which Go
	// extends with SSL_CERT_FILE itself.
	RootCAs *x509.CertPool
	// MaxInFlight bounds the requests in flight to one push service (the
	// endpoints' host) across all concurrent Send calls
	// (HERALD_MAX_IN_FLIGHT_WEBPUSH); the bound adapts below it while the
	// service pushes back (push.Limiter). Across every service at most
	// four times as many are in flight. Default DefaultMaxInFlight.
	MaxInFlight int
	// HostRate is the sends a second to one push service
	// (HERALD_RATE_WEBPUSH_HOST): with Quota set, the sender's at that
	// service, shared by every process and lane signing with the same
	// VAPID key; without, this client's alone, in bursts of a minute's
	// worth. Default DefaultHostRate; negative for no bound.
	HostRate float64
	// Quota, when set, is the pacer of the sender's quota at one push
	// service (its host) at HostRate, shared with every other client
	// signing with the same key (package quota).
	Quota func(host string, perSecond float64) push.Pacer
	// RequestTimeout bounds one request. Default DefaultRequestTimeout.
	RequestTimeout time.Duration
	// Egress says which endpoints may be posted to (HERALD_WEBPUSH_HOSTS).
	// Default push.DefaultEgressPolicy(): the browsers' push services.
	Egress *push.EgressPolicy
}

// withDefaults returns a copy of c with every empty field filled in.
func (c Config) withDefaults() Config {
	if c.MaxInFlight == 0 {
		c.MaxInFlight = DefaultMaxInFlight
	}
	if c.HostRate == 0 {
		c.HostRate = DefaultHostRate
	}
	if c.RequestTimeout == 0 {
		c.RequestTimeout = DefaultRequestTimeout
	}
	if c.Egress == nil {
		c.Egress = push.DefaultEgressPolicy()
	}
	return c
}

// validate reports every invalid field of a defaulted config, each named with
// its environment variable. The keys must be a pair: a public key that does
// not belong to the private one makes every push fail VAPID at the service.
func (c Config) validate() error {
	var errs []error
	pub, err := decodeKey(c.VAPIDPublicKey)
	switch {
	case c.VAPIDPublicKey == "":
		errs = append(errs, errors.New("webpush config: VAPIDPublicKey (VAPID_PUBLIC_KEY) is required"))
	case err != nil:
		errs = append(errs, fmt.Errorf("webpush config: VAPIDPublicKey (VAPID_PUBLIC_KEY) is not base64url: %w", err))
	}
	priv, err := decodeKey(c.VAPIDPrivateKey)
	switch {
	case c.VAPIDPrivateKey == "":
		errs = append(errs, errors.New("webpush config: VAPIDPrivateKey (VAPID_PRIVATE_KEY) is required"))
	case err != nil:
		errs = append(errs, fmt.Errorf("webpush config: VAPIDPrivateKey (VAPID_PRIVATE_KEY) is not base64url: %w", err))
	default:
		key, err := ecdh.P256().NewPrivateKey(priv)
		switch {
		case err != nil:
			errs = append(errs, fmt.Errorf("webpush config: VAPIDPrivateKey (VAPID_PRIVATE_KEY) is not a P-256 private key: %w", err))
		case pub != nil && !bytes.Equal(key.PublicKey().Bytes(), pub):
			errs = append(errs, errors.New("webpush config: VAPIDPublicKey (VAPID_PUBLIC_KEY) is not the public half of VAPIDPrivateKey (VAPID_PRIVATE_KEY)"))
		}
	}
	if subscriber(c.Subject) == "" {
		errs = append(errs, fmt.Errorf("webpush config: Subject (VAPID_SUBJECT) must be a mailto: or https: contact, got %q", c.Subject))
	}
	if c.MaxInFlight < 1 {
		errs = append(errs, fmt.Errorf("webpush config: MaxInFlight must be at least 1, got %d", c.MaxInFlight))
	}
	if c.RequestTimeout < 0 {
		errs = append(errs, fmt.Errorf("webpush config: RequestTimeout must not be negative, got %s", c.RequestTimeout))
	}
	return errors.Join(errs...)
}

// decodeKey reads a key in base64url, padded or not, as webpush-go does.
func decodeKey(s string) ([]byte, error) {
	return base64.RawURLEncoding.DecodeString(strings.TrimRight(s, "="))
}

// subscriber is the Subscriber webpush-go wants for subject: it prefixes
// "mailto:" to anything that is not an https: URL itself, so a mailto:
// subject loses its prefix here. It is empty when subject is no contact.
func subscriber(subject string) string {
	switch {
	case strings.HasPrefix(subject, "https://") && len(subject) > len("https://"):
		return subject
	case strings.HasPrefix(subject, "mailto:"):
		subject = strings.TrimPrefix(subject, "mailto:")
	}
	if at := strings.IndexByte(subject, '@'); at <= 0 || at == len(subject)-1 || strings.ContainsAny(subject, " \t\r\n:/") {
		return ""
	}
	return subject
}
