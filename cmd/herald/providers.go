package main

import (
	"cmp"
	"context"
	"crypto/x509"
	"fmt"
	"log/slog"
	"os"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/heraldpush/herald/db"
	"github.com/heraldpush/herald/jobs"
	"github.com/heraldpush/herald/jobs/apps"
	"github.com/heraldpush/herald/jobs/push"
	"github.com/heraldpush/herald/jobs/push/apns"
	"github.com/heraldpush/herald/jobs/push/fcm"
	"github.com/heraldpush/herald/jobs/push/webpush"
	"github.com/heraldpush/herald/jobs/quota"
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

// quotas paces the FCM and Web Push clients under the quotas every process
// shares (HERALD_RATE_FCM, HERALD_RATE_WEBPUSH_HOST, package quota), each
// lane claiming through its own connections. A nil *quotas paces each
// client alone (the bench's blast).
type quotas struct {
	store *quota.Store
	// pools are the connections each lane claims through: the urgent
	// lane's own, the process's for the bulk lane.
	pools map[string]*pgxpool.Pool
}

// fcm paces a lane's FCM client under its project's quota, which every
// process and lane sending for the project shares.
func (q *quotas) fcm(cfg config, lane string) func(string, float64) push.Pacer {
	if q == nil {
		return nil
	}
	return func(project string, perSecond float64) push.Pacer {
		return q.store.Bucket("fcm:"+project, perSecond, cfg.RateWindow).Pacer(lane == jobs.QueueUrgent, q.pools[lane])
	}
}

// webPush paces a lane's Web Push client at each push service under the
// quota of the VAPID key it signs with there, which every process and lane
// signing with the key shares.
func (q *quotas) webPush(cfg config, lane, vapidPublicKey string) func(string, float64) push.Pacer {
	if q == nil {
		return nil
	}
	return func(host string, perSecond float64) push.Pacer {
		return q.store.Bucket("webpush:"+vapidPublicKey+"@"+host, perSecond, cfg.RateWindow).Pacer(lane == jobs.QueueUrgent, q.pools[lane])
	}
}

// buildLanes makes each lane the process serves (HERALD_LANES), each with
// provider clients of its own. The urgent lane also gets connections of its
// own, kept open: at a bulk message's due instant its chunks take every
// shared connection. With a pool, the clients keep to the quotas every
// process shares, claimed through it (the bulk lane) or the urgent lane's
// connections; without, each client keeps to its rate alone.
func buildLanes(ctx context.Context, cfg config, logger *slog.Logger, pool *pgxpool.Pool) (*lanes, *quotas, error) {
	roots, err := rootCAs(cfg.CertFile)
	if err != nil {
		return nil, nil, err
	}
	l := &lanes{env: map[string]map[string]apps.Provider{}}
	var q *quotas
	if pool != nil {
		q = &quotas{store: quota.NewStore(logger), pools: map[string]*pgxpool.Pool{}}
	}
	for _, queue := range cfg.Lanes {
		lane := jobs.Lane{Queue: queue, Workers: cfg.laneWorkers(queue)}
		if queue == jobs.QueueUrgent {
			if lane.Pool, err = db.Open(ctx, cfg.DatabaseURL, db.PoolConfig{MaxConns: cfg.urgentPoolSize(), MinConns: 2, Schema: cfg.DBSchema}); err != nil {
				l.close()
				return nil, nil, err
			}
			l.closers = append(l.closers, lane.Pool.Close)
		}
		if q != nil {
			q.pools[queue] = cmp.Or(lane.Pool, pool)
		}
		p, err := buildProviders(ctx, cfg, roots, logger, queue, q)
		if err != nil {
			l.close()
			return nil, nil, err
		}
		lane.Providers, l.closers = p.byChannel, append(l.closers, p.close)
		l.env[queue] = p.clients
		l.lanes = append(l.lanes, lane)
	}
	return l, q, nil
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
func buildProviders(ctx context.Context, cfg config, roots *x509.CertPool, logger *slog.Logger, lane string, quotas *quotas) (*providers, error) {
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
			MaxInFlight: cfg.MaxInFlight[jobs.ChannelFCM], Rate: float64(cfg.FCMRate), Quota: quotas.fcm(cfg, lane),
		})
		err = add(jobs.ChannelFCM, f, e)
	}
	if err == nil && cfg.WebPush.enabled() {
		w, e := webpush.New(webpush.Config{
			VAPIDPublicKey: cfg.WebPush.PublicKey, VAPIDPrivateKey: cfg.WebPush.PrivateKey,
			Subject: cfg.WebPush.Subject, RootCAs: roots, MaxInFlight: cfg.MaxInFlight[jobs.ChannelWebPush],
			HostRate: float64(cfg.WebPushHostRate), Egress: cfg.WebPushEgress, Quota: quotas.webPush(cfg, lane, cfg.WebPush.PublicKey),
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
func credentialClients(cfg config, roots *x509.CertPool, quotas *quotas) apps.Builder {
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
				MaxInFlight: cfg.MaxInFlight[jobs.ChannelFCM], Rate: float64(cfg.FCMRate), Quota: quotas.fcm(cfg, lane),
			})
			if err != nil {
				return nil, err
			}
			return p, nil
		case c.WebPush != nil:
			p, err := webpush.New(webpush.Config{
				VAPIDPublicKey: c.WebPush.PublicKey, VAPIDPrivateKey: c.WebPush.PrivateKey, Subject: c.WebPush.Subject,
				RootCAs: roots, MaxInFlight: cfg.MaxInFlight[jobs.ChannelWebPush],
				HostRate: float64(cfg.WebPushHostRate), Egress: cfg.WebPushEgress, Quota: quotas.webPush(cfg, lane, c.WebPush.PublicKey),
			})
			if err != nil {
				return nil, err
			}
			return p, nil
		}
		return nil, fmt.Errorf("credential of app %s has no %s part", c.App, c.Channel)
	}
}
