package fake

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"time"
)

// Defaults used by Config.withDefaults. They are what `herald fakepush` runs with
// when no flag says otherwise.
const (
	DefaultAddr                 = "127.0.0.1:8443"
	DefaultTLSDir               = ".fakepush"
	DefaultAPNsTopic            = "com.heraldpush.app"
	DefaultFCMProjectID         = "herald-fake"
	DefaultVAPIDSubject         = "mailto:fakepush@herald.localhost"
	DefaultMaxConcurrentStreams = 1000
	DefaultDetails              = 1024
)

// Config describes one fakepush server. The zero value is usable: every empty field
// is filled from the defaults above by withDefaults, the one place defaults live.
type Config struct {
	// Addr is the TCP address to listen on. Use "127.0.0.1:0" in tests to get a
	// free port; the real port then appears in URL and Env.
	Addr string

	// SandboxAddr is the address of the APNs sandbox host, a second listener
	// that serves APNs alone and knows only the tokens declared sandbox ones
	// (POST /_apns/sandbox-tokens), as Apple's sandbox knows only debug
	// builds' tokens. Its URL goes to the env file as APNS_SANDBOX_HOST.
	// Empty means any free port on the host of Addr.
	SandboxAddr string

	// Hostname is the host name clients use to reach the server. It goes into the
	// server certificate and every URL fakepush hands out (APNS_HOST, FCM_ENDPOINT,
	// the token_uri, Web Push endpoints). Empty means the host of Addr, or
	// 127.0.0.1 when Addr listens on all interfaces.
	Hostname string

	// TLSDir holds the CA, the provider credentials and the env file. Existing keys
	// in it are reused so that a restarted fakepush keeps every credential valid.
	TLSDir string

	// Latency is added to every provider response, per channel adjustable at run
	// time through /_control. Zero means answer at once.
	Latency time.Duration

	// DecryptOneIn makes fakepush decrypt only one Web Push body in N, which saves
	// CPU in benchmarks. Zero or one decrypts every body, which is what tests want.
	DecryptOneIn int

	// Details is how many of the most recent accepted pushes keep their
	// request headers and decoded body for GET /_receipts?detail=1: a ring
	// of fixed size, so that memory stays bounded however many pushes a
	// benchmark sends. Zero means DefaultDetails; negative keeps none.
	Details int

	// Devices is how fakepush plays the devices its pushes reach: which
	// share of them send receipts back to Herald, and when. The zero value
	// plays none; POST /_devices changes it at run time.
	Devices Devices

	// APNsTopic is the only apns-topic the APNs endpoint accepts with the
	// default app's keys, like an app's bundle id bound to a team's key.
	APNsTopic string

	// FCMProjectID is the Firebase project of the service account fakepush writes.
	FCMProjectID string

	// APNsTopic and FCMProjectID are the default app's, the one whose
	// credentials go to DIR/env. Apps names more apps, each with its own
	// APNs key and team, topic com.heraldpush.NAME, Firebase project
	// herald-fake-NAME and its service account, and VAPID key pair, kept
	// under TLSDir/apps/NAME. Apps made before, in TLSDir or through POST
	// /_apps, are there whether named here or not.
	Apps []string

	// VAPIDSubject is the contact written to VAPID_SUBJECT.
	VAPIDSubject string

	// MaxConcurrentStreams is the HTTP/2 stream limit per connection advertised to
	// clients. Apple advertises 1000, so that is the default.
	MaxConcurrentStreams int

	// Logger receives the few things worth saying (server errors); requests are
	// never logged. Nil discards.
	Logger *slog.Logger

	// Now is the clock used for token ages, expiries and receipt times. Tests
	// inject a shifted clock to exercise expiry; nil means time.Now.
	Now func() time.Time
}

// withDefaults returns a copy of c with every empty field filled in.
func (c Config) withDefaults() Config {
	if c.Addr == "" {
		c.Addr = DefaultAddr
	}
	if c.SandboxAddr == "" {
		host, _, _ := net.SplitHostPort(c.Addr)
		c.SandboxAddr = net.JoinHostPort(host, "0")
	}
	if c.TLSDir == "" {
		c.TLSDir = DefaultTLSDir
	}
	if c.DecryptOneIn == 0 {
		c.DecryptOneIn = 1
	}
	if c.Details == 0 {
		c.Details = DefaultDetails
	}
	if c.APNsTopic == "" {
		c.APNsTopic = DefaultAPNsTopic
	}
	if c.FCMProjectID == "" {
		c.FCMProjectID = DefaultFCMProjectID
	}
	if c.VAPIDSubject == "" {
		c.VAPIDSubject = DefaultVAPIDSubject
	}
	if c.MaxConcurrentStreams == 0 {
		c.MaxConcurrentStreams = DefaultMaxConcurrentStreams
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return c
}

// validate reports the first invalid field of a defaulted config, naming it.
func (c Config) validate() error {
	if _, _, err := net.SplitHostPort(c.Addr); err != nil {
		return fmt.Errorf("fakepush config: Addr %q: %w", c.Addr, err)
	}
	if _, _, err := net.SplitHostPort(c.SandboxAddr); err != nil {
		return fmt.Errorf("fakepush config: SandboxAddr %q: %w", c.SandboxAddr, err)
	}
	if c.Latency < 0 {
		return fmt.Errorf("fakepush config: Latency must not be negative, got %s", c.Latency)
	}
	if c.DecryptOneIn < 1 {
		return fmt.Errorf("fakepush config: DecryptOneIn must be at least 1, got %d", c.DecryptOneIn)
	}
	if err := c.Devices.withDefaults().validate(); err != nil {
		return fmt.Errorf("fakepush config: Devices: %w", err)
	}
	if c.MaxConcurrentStreams < 1 {
		return fmt.Errorf("fakepush config: MaxConcurrentStreams must be at least 1, got %d", c.MaxConcurrentStreams)
	}
	for _, name := range c.Apps {
		if err := checkAppName(name); err != nil {
			return fmt.Errorf("fakepush config: Apps: %w", err)
		}
	}
	for _, r := range c.FCMProjectID {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-') {
			return errors.New("fakepush config: FCMProjectID may hold only lower-case letters, digits and '-'")
		}
	}
	return nil
}
