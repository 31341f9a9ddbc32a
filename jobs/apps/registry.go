package apps

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/heraldpush/herald/db"
	"github.com/heraldpush/herald/jobs/push"
)

// DefaultRefreshEvery is how often a Registry looks for changed apps and
// credentials: a rotation reaches every process within about that, plus
// the new client's warm-up.
const DefaultRefreshEvery = time.Second

// Sender sends one message to many devices of one channel; jobs.Sender is
// the same interface.
type Sender interface {
	Send(ctx context.Context, m *push.Message, targets []push.Target, results []push.Result, allow func() bool, answered func(i int))
}

// Provider is a provider client built from a credential: it sends, opens
// its connections ahead of traffic, and closes them.
type Provider interface {
	Sender
	Warm(ctx context.Context) error
	Close()
}

// Builder makes lane's provider client of a credential. cmd/herald's
// builds the real ones, with the process's settings (in-flight limits,
// rates, trusted CAs).
type Builder func(ctx context.Context, lane string, c *Credential) (Provider, error)

// RegistryConfig configures a Registry.
type RegistryConfig struct {
	Pool   *pgxpool.Pool
	Sealer *Sealer
	Logger *slog.Logger
	// Lanes are the lanes this process sends on, each with clients of its
	// own; none in a process that only serves the API.
	Lanes []string
	// Build makes the clients; nil builds none (an API process, which
	// needs the apps and their public keys only).
	Build Builder
	// Env are the default app's clients from the environment
	// (APNS_KEY_FILE, FCM_CREDENTIALS_FILE, VAPID_*), by lane and channel:
	// its sends on a channel use them while no credential is stored for
	// it. The caller closes them.
	Env map[string]map[string]Provider
	// EnvWebPush is the environment's VAPID pair (public key and subject
	// only), for the answer to a Web Push registration of the default app.
	EnvWebPush *WebPush
	// Every is the time between looks for changes; zero takes
	// DefaultRefreshEvery.
	Every time.Duration
}

// client is one lane's provider client of one credential, counted while
// sends use it, so that a client a rotation replaced is closed only once
// its last send is answered.
type client struct {
	p       Provider
	err     error
	refs    atomic.Int64
	retired atomic.Bool
	once    sync.Once
}

func (c *client) release() {
	if c.refs.Add(-1) == 0 && c.retired.Load() {
		c.close()
	}
}

func (c *client) retire() {
	c.retired.Store(true)
	if c.refs.Load() == 0 {
		c.close()
	}
}

func (c *client) close() {
	c.once.Do(func() {
		if c.p != nil {
			c.p.Close()
		}
	})
}

// live is a stored credential a process uses, with its lanes' clients.
type live struct {
	cred    *Credential
	clients map[string]*client
}

type appKey struct {
	app     int32
	channel string
}

type appState struct {
	name     string
	disabled bool
}

// Registry is a process's view of the apps and their credentials, read
// from the database (and again within a second of any change), with the
// provider clients each lane sends through. It is safe for concurrent use.
type Registry struct {
	cfg RegistryConfig

	mu      sync.RWMutex
	version int64
	loaded  bool
	apps    map[int32]appState
	byName  map[string]int32
	live    map[int64]*live
	active  map[appKey]int64
	env     map[string]map[string]*client
}

// NewRegistry returns a Registry; Refresh (or Run) loads it.
func NewRegistry(cfg RegistryConfig) *Registry {
	cfg.Every = cmp.Or(cfg.Every, DefaultRefreshEvery)
	r := &Registry{cfg: cfg, apps: map[int32]appState{DefaultID: {name: DefaultName}}, byName: map[string]int32{DefaultName: DefaultID},
		live: map[int64]*live{}, active: map[appKey]int64{}, env: map[string]map[string]*client{}}
	for lane, byChannel := range cfg.Env {
		r.env[lane] = map[string]*client{}
		for ch, p := range byChannel {
			if p != nil {
				r.env[lane][ch] = &client{p: p}
			}
		}
	}
	return r
}

// Run refreshes the registry every RegistryConfig.Every until ctx ends,
// then closes the clients it built.
func (r *Registry) Run(ctx context.Context) {
	t := time.NewTicker(r.cfg.Every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			r.Close()
			return
		case <-t.C:
		}
		if err := r.Refresh(ctx); err != nil && ctx.Err() == nil && !errors.Is(err, db.ErrUnavailable) {
			r.cfg.Logger.WarnContext(ctx, "read apps and credentials", "error", err)
		}
	}
}

// Close closes every client the registry built (not the environment's).
func (r *Registry) Close() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, l := range r.live {
		for _, c := range l.clients {
			c.retire()
		}
	}
	r.live = map[int64]*live{}
	r.active = map[appKey]int64{}
}

// Refresh reads the apps and their live credentials if anything of them
// changed since the last read, builds and warms the clients of new
// credentials, and retires those of credentials no longer live: a client
// is closed once the sends that took it before are answered.
func (r *Registry) Refresh(ctx context.Context) error {
	q := db.On(r.cfg.Pool)
	v, err := q.AppsVersion(ctx)
	if err != nil {
		return err
	}
	r.mu.RLock()
	same := r.loaded && v == r.version
	r.mu.RUnlock()
	if same {
		return nil
	}
	appRows, err := q.ListApps(ctx)
	if err != nil {
		return err
	}
	credRows, err := q.LiveCredentials(ctx)
	if err != nil {
		return err
	}
	apps := make(map[int32]appState, len(appRows))
	byName := make(map[string]int32, len(appRows))
	for _, a := range appRows {
		apps[a.ID] = appState{name: a.Name, disabled: a.DisabledAt != nil}
		byName[a.Name] = a.ID
	}
	r.mu.RLock()
	known := maps.Clone(r.live)
	r.mu.RUnlock()
	next := make(map[int64]*live, len(credRows))
	active := map[appKey]int64{}
	var fresh []*live
	for _, row := range credRows {
		if row.State == StateActive {
			active[appKey{row.AppID, row.Channel}] = row.ID
		}
		if l, ok := known[row.ID]; ok {
			l.cred.State = row.State
			next[row.ID] = l
			continue
		}
		l := &live{clients: map[string]*client{}}
		plain, err := r.cfg.Sealer.Open(row.AppID, row.Channel, row.Version, row.SealKey, row.Sealed)
		if err == nil {
			l.cred, err = join(row.Channel, row.Public, plain)
		}
		if l.cred == nil {
			l.cred = &Credential{Channel: row.Channel}
		}
		l.cred.ID, l.cred.AppID, l.cred.App, l.cred.Version, l.cred.State = row.ID, row.AppID, apps[row.AppID].name, row.Version, row.State
		if err != nil {
			r.cfg.Logger.ErrorContext(ctx, "an app's credential cannot be opened: its sends fail until it is stored again",
				"app", l.cred.App, "channel", row.Channel, "version", row.Version, "error", err)
			for _, lane := range r.cfg.Lanes {
				l.clients[lane] = &client{err: err}
			}
		}
		next[row.ID] = l
		if err == nil {
			fresh = append(fresh, l)
		}
	}
	r.build(ctx, fresh)

	r.mu.Lock()
	var gone []*live
	for id, l := range r.live {
		if _, ok := next[id]; !ok {
			gone = append(gone, l)
		}
	}
	r.version, r.loaded = v, true
	r.apps, r.byName, r.live, r.active = apps, byName, next, active
	r.mu.Unlock()
	// Retired outside the lock: a client whose last send is answered
	// closes now, the others when theirs is.
	for _, l := range gone {
		for _, c := range l.clients {
			c.retire()
		}
		r.cfg.Logger.InfoContext(ctx, "credential retired: its clients close once their sends are answered",
			"app", l.cred.App, "channel", l.cred.Channel, "version", l.cred.Version)
	}
	for _, l := range fresh {
		r.cfg.Logger.InfoContext(ctx, "credential in use", "app", l.cred.App, "channel", l.cred.Channel,
			"version", l.cred.Version, "state", l.cred.State)
	}
	return nil
}

// build makes every lane's client of the fresh credentials and warms them
// side by side, so that a rotation's first sends pay no handshake. A
// client that cannot be built keeps its error, which its sends fail with.
func (r *Registry) build(ctx context.Context, fresh []*live) {
	if r.cfg.Build == nil {
		return
	}
	var wg sync.WaitGroup
	for _, l := range fresh {
		for _, lane := range r.cfg.Lanes {
			p, err := r.cfg.Build(ctx, lane, l.cred)
			if err != nil {
				r.cfg.Logger.ErrorContext(ctx, "an app's credential cannot be used: its sends fail until it is replaced",
					"app", l.cred.App, "channel", l.cred.Channel, "version", l.cred.Version, "lane", lane, "error", err)
				l.clients[lane] = &client{err: err}
				continue
			}
			l.clients[lane] = &client{p: p}
			wg.Go(func() {
				wctx, cancel := context.WithTimeout(ctx, push.WarmTimeout)
				defer cancel()
				if err := p.Warm(wctx); err != nil {
					r.cfg.Logger.WarnContext(ctx, "provider connections could not be warmed; they will open on first use",
						"app", l.cred.App, "channel", l.cred.Channel, "version", l.cred.Version, "lane", lane, "error", err)
				}
			})
		}
	}
	wg.Wait()
}

// Lease is a send's hold on the client it took: the client is not closed
// until every lease on it is released. A nil Lease holds nothing.
type Lease struct{ c *client }

// Release gives the client back, once the sends that took it are answered.
func (l *Lease) Release() {
	if l != nil && l.c != nil {
		l.c.release()
	}
}

// Retired reports whether a rotation (or a retirement) replaced the client
// since it was taken: the requests not yet made should take the new one.
func (l *Lease) Retired() bool { return l != nil && l.c != nil && l.c.retired.Load() }

// Lookup is what a send to a device of app on channel goes through on
// lane: its client, and a lease to release once the send is answered, so
// that a client a rotation replaced meanwhile is closed only then.
// credential is the device's own (a Web Push subscription's; 0 for none).
// Without a client, why says what is missing and the sends fail with
// channel_disabled.
func (r *Registry) Lookup(lane string, app int32, channel string, credential int64) (s Sender, lease *Lease, why string) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	st, ok := r.apps[app]
	switch {
	case !ok:
		return nil, nil, fmt.Sprintf("app %d is not known here", app)
	case st.disabled:
		return nil, nil, "app " + st.name + " is disabled"
	}
	c := r.pick(lane, app, channel, credential)
	if c == nil {
		return nil, nil, fmt.Sprintf("%s is not configured for app %s", channel, st.name)
	}
	if c.p == nil {
		return nil, nil, fmt.Sprintf("%s credential of app %s cannot be used: %v", channel, st.name, c.err)
	}
	c.refs.Add(1)
	return c.p, &Lease{c: c}, ""
}

// pick is the client of a send, under the read lock: a Web Push
// subscription's own credential while it is live (or the environment's
// key for one made with it), else the app's active credential, else for
// the default app the environment's.
func (r *Registry) pick(lane string, app int32, channel string, credential int64) *client {
	if channel == ChannelWebPush {
		if l, ok := r.live[credential]; ok && credential != 0 && l.cred.AppID == app {
			return l.clients[lane]
		}
		if credential == 0 && app == DefaultID {
			if c := r.env[lane][channel]; c != nil {
				return c
			}
		}
	}
	if id, ok := r.active[appKey{app, channel}]; ok {
		return r.live[id].clients[lane]
	}
	if app == DefaultID {
		return r.env[lane][channel]
	}
	return nil
}

// LaneClient is one of a lane's clients of a stored credential.
type LaneClient struct {
	App, Channel string
	Version      int32
	Sender       Sender
}

// Clients are lane's clients of the stored credentials, live ones (active
// or retiring) that could be built, for the metrics of their pacing; the
// environment's are the caller's own.
func (r *Registry) Clients(lane string) []LaneClient {
	r.mu.RLock()
	defer r.mu.RUnlock()
	var out []LaneClient
	for _, l := range r.live {
		if c := l.clients[lane]; c != nil && c.p != nil {
			out = append(out, LaneClient{App: l.cred.App, Channel: l.cred.Channel, Version: l.cred.Version, Sender: c.p})
		}
	}
	return out
}

// Name is the name of app id ("" when unknown).
func (r *Registry) Name(id int32) string {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.apps[id].name
}

// ID is the id of the app named name.
func (r *Registry) ID(name string) (int32, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	id, ok := r.byName[name]
	return id, ok
}

// Names are every app's name by id.
func (r *Registry) Names() map[int32]string {
	r.mu.RLock()
	defer r.mu.RUnlock()
	out := make(map[int32]string, len(r.apps))
	for id, st := range r.apps {
		out[id] = st.name
	}
	return out
}

// Configured reports whether app has a client for channel on some lane.
func (r *Registry) Configured(app int32, channel string) bool {
	r.mu.RLock()
	defer r.mu.RUnlock()
	if st, ok := r.apps[app]; !ok || st.disabled {
		return false
	}
	for _, lane := range r.cfg.Lanes {
		if c := r.pick(lane, app, channel, 0); c != nil && c.p != nil {
			return true
		}
	}
	return false
}

// WebPushKey is the VAPID key a page of app subscribes with, and the
// credential a subscription made with it is recorded under (0 for the
// environment's): the app's active credential, else for the default app
// the environment's. ok is false when the app has no Web Push key.
func (r *Registry) WebPushKey(app int32) (publicKey string, credential int64, ok bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	if id, found := r.active[appKey{app, ChannelWebPush}]; found {
		if c := r.live[id].cred.WebPush; c != nil {
			return c.PublicKey, id, true
		}
	}
	if app == DefaultID && r.cfg.EnvWebPush != nil {
		return r.cfg.EnvWebPush.PublicKey, 0, true
	}
	return "", 0, false
}

// WebPushCredential is the live credential of app whose VAPID public key
// is publicKey: which one a subscription made with that key is recorded
// under (0 for the environment's). ok is false for a key of none.
func (r *Registry) WebPushCredential(app int32, publicKey string) (credential int64, ok bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	for id, l := range r.live {
		if l.cred.AppID == app && l.cred.WebPush != nil && l.cred.WebPush.PublicKey == publicKey {
			return id, true
		}
	}
	if app == DefaultID && r.cfg.EnvWebPush != nil && r.cfg.EnvWebPush.PublicKey == publicKey {
		return 0, true
	}
	return 0, false
}
