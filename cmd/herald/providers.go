package main

import (
	"context"
	"crypto/x509"
	"fmt"
	"log/slog"
	"os"

	"github.com/heraldpush/herald/db"
	"github.com/heraldpush/herald/jobs"
	"github.com/heraldpush/herald/jobs/apps"
	"github.com/heraldpush/herald/jobs/push/apns"
	"github.com/heraldpush/herald/jobs/push/fcm"
	"github.com/heraldpush/herald/jobs/push/webpush"
)

// lanes are the lanes a worker process serves, with what must be closed at
// shutdown.
type lanes struct {
	lanes   []jobs.Lane
	closers []func()
	// env are each lane's clients of the environment's credentials (the
	// default app's), by lane and channel.
	env map[string]map[string]apps.Provider
}

// buildLanes makes each lane the process serves (HERALD_LANES), each with
// provider clients of its own. The urgent lane also gets connections of its
// own, kept open: at a bulk message's due instant its chunks take every
// shared connection.
func buildLanes(ctx context.Context, cfg config, logger *slog.Logger) (*lanes, error) {
	roots, err := rootCAs(cfg.CertFile)
	if err != nil {
		return nil, err
	}
	l := &lanes{env: map[string]map[string]apps.Provider{}}
	for _, queue := range cfg.Lanes {
		lane := jobs.Lane{Queue: queue, Workers: cfg.laneWorkers(queue)}
		p, err := buildProviders(ctx, cfg, roots, logger, queue)
		if err != nil {
			l.close()
			return nil, err
		}
		lane.Providers, l.closers = p.byChannel, append(l.closers, p.close)
		l.env[queue] = p.clients
		if queue == jobs.QueueUrgent {
			if lane.Pool, err = db.Open(ctx, cfg.DatabaseURL, db.PoolConfig{MaxConns: cfg.urgentPoolSize(), MinConns: 2, Schema: cfg.DBSchema}); err != nil {
				l.close()
				return nil, err
			}
			l.closers = append(l.closers, lane.Pool.Close)
		}
		l.lanes = append(l.lanes, lane)
	}
	return l, nil
}

// close closes what the lanes opened, last first.
func (l *lanes) close() {
	for i := len(l.closers) - 1; i >= 0; i-- {
		l.closers[i]()
	}
	l.closers = nil
}

// providers are the configured push providers of a lane, keyed by channel,
// with what must be closed at shutdown.
type providers struct {
	byChannel map[string]jobs.Sender
	// clients are the same clients, as the app registry takes the
	// default app's from the environment.
	clients map[string]apps.Provider
	closers []func()
}

func (p *providers) close() {
	for _, c := range p.closers {
		c()
	}
}

// rootCAs is the system's CA pool plus SSL_CERT_FILE's certificates, read
// through getenv so that in-process tests can point Herald at a fakepush.
func rootCAs(certFile string) (*x509.CertPool, error) {
	pool, err := x509.SystemCertPool()
	if err != nil {
		pool = x509.NewCertPool()
	}
	if certFile == "" {
		return pool, nil
	}
	pem, err := os.ReadFile(certFile)
	if err != nil {
		return nil, fmt.Errorf("SSL_CERT_FILE: %w", err)
	}
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("SSL_CERT_FILE: %s holds no PEM certificate", certFile)
	}
	return pool, nil
}

// logDisabledChannels says at startup which channels have no credentials: their
// deliveries fail with channel_disabled, never silently.
func logDisabledChannels(ctx context.Context, cfg config, logger *slog.Logger) {
	if !cfg.APNs.enabled() {
		logger.WarnContext(ctx, "APNs is not configured (APNS_KEY_FILE): APNs deliveries will fail with channel_disabled")
	}
	if !cfg.FCM.enabled() {
		logger.WarnContext(ctx, "FCM is not configured (FCM_CREDENTIALS_FILE): FCM deliveries will fail with channel_disabled")
	}
	if !cfg.WebPush.enabled() {
		logger.WarnContext(ctx, "Web Push is not configured (VAPID_PRIVATE_KEY): Web Push deliveries will fail with channel_disabled")
	}
}

// warmer is a provider that can open its connections ahead of traffic.
type warmer interface {
	jobs.Sender
	Warm(ctx context.Context) error
	Close()
}

// buildProviders makes a provider client for every configured channel and
// warms its connections, so that the first push of the first message pays
// no handshake. Each lane gets its own set (see jobs.Lane).
func buildProviders(ctx context.Context, cfg config, roots *x509.CertPool, logger *slog.Logger, lane string) (*providers, error) {
	p := &providers{byChannel: map[string]jobs.Sender{}, clients: map[string]apps.Provider{}}
	add := func(channel string, w warmer, err error) error {
		if err != nil {
			return fmt.Errorf("%s: %w", channel, err)
		}
		p.byChannel[channel], p.clients[channel], p.closers = w, w, append(p.closers, w.Close)
		if err := w.Warm(ctx); err != nil {
			logger.WarnContext(ctx, "provider connections could not be warmed; they will open on first use",
				"channel", channel, "lane", lane, "error", err)
		}
		return nil
	}
	var err error
	if cfg.APNs.enabled() {
		a, e := apns.New(apns.Config{
			KeyFile: cfg.APNs.KeyFile, KeyID: cfg.APNs.KeyID, TeamID: cfg.APNs.TeamID,
			Topic: cfg.APNs.Topic, Host: cfg.APNs.Host, SandboxHost: cfg.APNs.SandboxHost, RootCAs: roots, MaxInFlight: cfg.MaxInFlight[jobs.ChannelAPNs],
		})
		err = add(jobs.ChannelAPNs, a, e)
	}
	if err == nil && cfg.FCM.enabled() {
		f, e := fcm.New(ctx, fcm.Config{
			CredentialsFile: cfg.FCM.CredentialsFile, Endpoint: cfg.FCM.Endpoint, RootCAs: roots,
			MaxInFlight: cfg.MaxInFlight[jobs.ChannelFCM], Rate: float64(cfg.FCMRate),
		})
		err = add(jobs.ChannelFCM, f, e)
	}
	if err == nil && cfg.WebPush.enabled() {
		w, e := webpush.New(webpush.Config{
			VAPIDPublicKey: cfg.WebPush.PublicKey, VAPIDPrivateKey: cfg.WebPush.PrivateKey,
			Subject: cfg.WebPush.Subject, RootCAs: roots, MaxInFlight: cfg.MaxInFlight[jobs.ChannelWebPush],
			HostRate: float64(cfg.WebPushHostRate), Egress: cfg.WebPushEgress,
		})
		err = add(jobs.ChannelWebPush, w, e)
	}
	if err != nil {
		p.close()
		return nil, err
	}
	return p, nil
}

// credentialClients builds the clients of apps' stored credentials (the
// app registry's Builder), each with this process's settings, as
// buildProviders builds the environment's: the same hosts, trusted CAs,
// in-flight limits and rates.
func credentialClients(cfg config, roots *x509.CertPool) apps.Builder {
	return func(ctx context.Context, lane string, c *apps.Credential) (apps.Provider, error) {
		switch {
		case c.APNs != nil:
			p, err := apns.New(apns.Config{
				Key: []byte(c.APNs.Key), KeyID: c.APNs.KeyID, TeamID: c.APNs.TeamID, Topic: c.APNs.Topic,
				Host: cfg.APNs.Host, SandboxHost: cfg.APNs.SandboxHost, RootCAs: roots, MaxInFlight: cfg.MaxInFlight[jobs.ChannelAPNs],
			})
			if err != nil {
				return nil, err
			}
			return p, nil
		case c.FCM != nil:
			p, err := fcm.New(ctx, fcm.Config{
				Credentials: []byte(c.FCM.ServiceAccount), Endpoint: cfg.FCM.Endpoint, RootCAs: roots,
				MaxInFlight: cfg.MaxInFlight[jobs.ChannelFCM], Rate: float64(cfg.FCMRate),
			})
			if err != nil {
				return nil, err
			}
			return p, nil
		case c.WebPush != nil:
			p, err := webpush.New(webpush.Config{
				VAPIDPublicKey: c.WebPush.PublicKey, VAPIDPrivateKey: c.WebPush.PrivateKey, Subject: c.WebPush.Subject,
				RootCAs: roots, MaxInFlight: cfg.MaxInFlight[jobs.ChannelWebPush],
				HostRate: float64(cfg.WebPushHostRate), Egress: cfg.WebPushEgress,
			})
			if err != nil {
				return nil, err
			}
			return p, nil
		}
		return nil, fmt.Errorf("credential of app %s has no %s part", c.App, c.Channel)
	}
}
