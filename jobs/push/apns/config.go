package apns

import (
	"crypto/x509"
	"errors"
	"fmt"
	"net/url"
	"time"
)

// Defaults filled in by Config.withDefaults, the one place they live.
const (
	// DefaultHost is Apple's production endpoint.
	DefaultHost = "https://api.push.apple.com"
	// DefaultSandboxHost is Apple's development endpoint, which knows the
	// tokens of apps built for debugging.
	DefaultSandboxHost = "https://api.sandbox.push.apple.com"
	// DefaultConnections is the size of the connection pool. Apple serves up
	// to 1000 streams on one connection, so two are enough for throughput;
	// the second keeps sends flowing while the first is being replaced.
	DefaultConnections = 2
	// DefaultMaxInFlight bounds concurrent requests per Provider. Sends are
	// bound by waiting for Apple, not by CPU, so more in flight carry
	// proportionally more sends a second (BenchmarkSend; docs/performance.md
	// has the figures). 500 is 250 streams on each of the two
	// connections, a quarter of the 1000 Apple allows on one.
	DefaultMaxInFlight = 500
	// DefaultRequestTimeout bounds one request, so that a hung provider never
	// holds a chunk.
	DefaultRequestTimeout = 5 * time.Second
)

// maxStreamsPerConnection is the HTTP/2 concurrency Apple advertises per
// connection. MaxInFlight may not exceed Connections times this: beyond it
// the transport would open connections outside the warm pool.
const maxStreamsPerConnection = 1000

// Config configures the APNs provider with token-based authentication.
type Config struct {
	// KeyFile is the path of the .p8 signing key (APNS_KEY_FILE).
	KeyFile string
	// Key is the .p8 signing key's PEM text, in place of KeyFile: an
	// app's stored credential (jobs/apps).
	Key []byte
	// KeyID is the key's id (APNS_KEY_ID).
	KeyID string
	// TeamID is the developer team id (APNS_TEAM_ID).
	TeamID string
	// Topic is the app's bundle id (APNS_TOPIC).
	Topic string
	// Host is the APNs base URL (APNS_HOST). Default DefaultHost.
	Host string
	// SandboxHost is the base URL for sandbox tokens (APNS_SANDBOX_HOST).
	// Default DefaultSandboxHost.
	SandboxHost string
	// RootCAs verifies the server; nil means the system pool, which Go
	// extends with SSL_CERT_FILE itself.
	RootCAs *x509.CertPool
	// Connections is the number of HTTP/2 connections kept warm. Default
	// DefaultConnections.
	Connections int
	// MaxInFlight bounds the requests in flight across all concurrent Send
	// calls. Default DefaultMaxInFlight.
	MaxInFlight int
	// RequestTimeout bounds one request. Default DefaultRequestTimeout.
	RequestTimeout time.Duration
}

// withDefaults returns a copy of c with every empty field filled in.
func (c Config) withDefaults() Config {
	if c.Host == "" {
		c.Host = DefaultHost
	}
	if c.SandboxHost == "" {
		c.SandboxHost = DefaultSandboxHost
	}
	if c.Connections == 0 {
		c.Connections = DefaultConnections
	}
	if c.MaxInFlight == 0 {
		c.MaxInFlight = DefaultMaxInFlight
	}
	if c.RequestTimeout == 0 {
		c.RequestTimeout = DefaultRequestTimeout
	}
	return c
}

// validate reports every invalid field of a defaulted config, each named with
// its environment variable where it has one.
func (c Config) validate() error {
	var errs []error
	if c.KeyFile == "" && len(c.Key) == 0 {
		errs = append(errs, errors.New("apns config: KeyFile (APNS_KEY_FILE) is required"))
	}
	required := []struct{ name, value string }{
		{"KeyID (APNS_KEY_ID)", c.KeyID},
		{"TeamID (APNS_TEAM_ID)", c.TeamID},
		{"Topic (APNS_TOPIC)", c.Topic},
	}
	for _, r := range required {
		if r.value == "" {
			errs = append(errs, fmt.Errorf("apns config: %s is required", r.name))
		}
	}
	if u, err := url.Parse(c.Host); err != nil || u.Scheme != "https" || u.Host == "" {
		errs = append(errs, fmt.Errorf("apns config: Host (APNS_HOST) must be an https:// URL, got %q", c.Host))
	}
	if u, err := url.Parse(c.SandboxHost); err != nil || u.Scheme != "https" || u.Host == "" {
		errs = append(errs, fmt.Errorf("apns config: SandboxHost (APNS_SANDBOX_HOST) must be an https:// URL, got %q", c.SandboxHost))
	}
	if c.Connections < 1 {
		errs = append(errs, fmt.Errorf("apns config: Connections must be at least 1, got %d", c.Connections))
	}
	if c.MaxInFlight < 1 {
		errs = append(errs, fmt.Errorf("apns config: MaxInFlight must be at least 1, got %d", c.MaxInFlight))
	} else if c.Connections >= 1 && c.MaxInFlight > c.Connections*maxStreamsPerConnection {
		errs = append(errs, fmt.Errorf("apns config: MaxInFlight %d exceeds Connections × %d streams (%d)",
			c.MaxInFlight, maxStreamsPerConnection, c.Connections*maxStreamsPerConnection))
	}
	if c.RequestTimeout < 0 {
		errs = append(errs, fmt.Errorf("apns config: RequestTimeout must not be negative, got %s", c.RequestTimeout))
	}
	return errors.Join(errs...)
}
