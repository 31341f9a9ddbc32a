package fcm

import (
	"crypto/x509"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/heraldpush/herald/jobs/push"
)

// Defaults filled in by Config.withDefaults, the one place they live.
const (
	// DefaultEndpoint is Google's FCM HTTP v1 base URL.
	DefaultEndpoint = "https://fcm.googleapis.com/v1"
	// DefaultMaxInFlight bounds concurrent requests per Provider. Sends are
	// bound by waiting for FCM, not by CPU, so more in flight carry
	// proportionally more sends a second (BenchmarkSend; docs/performance.md
	// has the figures). 500 takes five connections at Google's
	// 100 streams each, all opened by Warm.
	DefaultMaxInFlight = 500
	// DefaultRequestTimeout bounds one request, including the SDK's own
	// handling of it, so that a hung provider never holds a chunk.
	DefaultRequestTimeout = 5 * time.Second
	// DefaultRate is the sends a second a Provider keeps to, with bursts of
	// a minute's worth: FCM's default quota is 600,000 messages a minute a
	// project, counted per minute, and answered 429 QUOTA_EXCEEDED past it.
	DefaultRate = 10_000
)

// Config configures the FCM provider.
type Config struct {
	// CredentialsFile is the path of a Google service-account JSON file
	// (FCM_CREDENTIALS_FILE). Its project_id names the Firebase project and
	// its token_uri is where access tokens come from.
	CredentialsFile string
	// Credentials is the service account's JSON, in place of
	// CredentialsFile: an app's stored credential (jobs/apps).
	Credentials []byte
	// Endpoint is the FCM v1 base URL, ending in /v1 (FCM_ENDPOINT).
	// Default DefaultEndpoint.
	Endpoint string
	// RootCAs verifies FCM and the token endpoint; nil means the system pool,
	// which Go extends with SSL_CERT_FILE itself.
	RootCAs *x509.CertPool
	// MaxInFlight bounds the requests in flight across all concurrent Send
	// calls; it also sizes the connection pool, one connection per 100.
	// Default DefaultMaxInFlight.
	MaxInFlight int
	// RequestTimeout bounds one request. Default DefaultRequestTimeout.
	RequestTimeout time.Duration
	// Rate is the sends a second the Provider keeps to (HERALD_RATE_FCM).
	// Default DefaultRate; negative for none. It is the project's quota:
	// with Quota set, every process and lane sending for the project takes
	// its turns from the one quota; without, this client alone keeps to it,
	// in bursts of a minute's worth.
	Rate float64
	// Quota, when set, is the pacer of the project's quota at Rate, shared
	// with every other client sending for the project (package quota).
	Quota func(projectID string, perSecond float64) push.Pacer
}

// withDefaults returns a copy of c with every empty field filled in.
func (c Config) withDefaults() Config {
	if c.Endpoint == "" {
		c.Endpoint = DefaultEndpoint
	}
	// The SDK appends "/projects/..." itself.
	c.Endpoint = strings.TrimSuffix(c.Endpoint, "/")
	if c.MaxInFlight == 0 {
		c.MaxInFlight = DefaultMaxInFlight
	}
	if c.RequestTimeout == 0 {
		c.RequestTimeout = DefaultRequestTimeout
	}
	if c.Rate == 0 {
		c.Rate = DefaultRate
	}
	return c
}

// validate reports every invalid field of a defaulted config, each named with
// its environment variable where it has one.
func (c Config) validate() error {
	var errs []error
	if c.CredentialsFile == "" && len(c.Credentials) == 0 {
		errs = append(errs, errors.New("fcm config: CredentialsFile (FCM_CREDENTIALS_FILE) is required"))
	}
	if u, err := url.Parse(c.Endpoint); err != nil || u.Scheme != "https" || u.Host == "" || !strings.HasSuffix(u.Path, "/v1") {
		errs = append(errs, fmt.Errorf("fcm config: Endpoint (FCM_ENDPOINT) must be an https:// URL ending in /v1, got %q", c.Endpoint))
	}
	if c.MaxInFlight < 1 {
		errs = append(errs, fmt.Errorf("fcm config: MaxInFlight must be at least 1, got %d", c.MaxInFlight))
	}
	if c.RequestTimeout < 0 {
		errs = append(errs, fmt.Errorf("fcm config: RequestTimeout must not be negative, got %s", c.RequestTimeout))
	}
	return errors.Join(errs...)
}
