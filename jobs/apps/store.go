package apps

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/heraldpush/herald/db"
)

// The default app: every device registered without naming an app is its,
// and its credentials are the environment's unless some are stored for it.
const (
	DefaultID   int32 = 1
	DefaultName       = "default"
)

// MaxApps is how many apps an installation may have: each costs every
// worker process provider connections of its own, and the metrics carry
// an app label, whose values must stay few.
const MaxApps = 100

var nameShape = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,62}$`)

// CheckName holds an app's name to its shape: 1 to 63 lower-case letters,
// digits, '.', '_' and '-', starting with a letter or digit.
func CheckName(name string) error {
	if !nameShape.MatchString(name) {
		return invalid("name", "must be 1 to 63 lower-case letters, digits, '.', '_' or '-', starting with a letter or digit, got %q", name)
	}
	return nil
}

// App is an app as the API shows it: never a secret.
type App struct {
	ID         int32        `json:"-"`
	Name       string       `json:"name"`
	Disabled   bool         `json:"disabled"`
	DisabledAt *time.Time   `json:"disabled_at,omitempty"`
	CreatedAt  time.Time    `json:"created_at"`
	Channels   []ChannelApp `json:"channels"`
}

// ChannelApp is one channel of an app: its credentials, live and retired,
// newest first, with what may be shown of them.
type ChannelApp struct {
	Channel string `json:"channel"`
	// Source is where the channel's sends take their credential from:
	// "stored" (the API's), "environment" (the default app's
	// APNS_KEY_FILE and the like, in the process that answered) or
	// "none", when the app's deliveries on it fail with channel_disabled.
	Source      string           `json:"source"`
	Credentials []CredentialInfo `json:"credentials"`
}

// CredentialInfo is what may be shown of a stored credential.
type CredentialInfo struct {
	Version   int32      `json:"version"`
	State     string     `json:"state"`
	Public    Public     `json:"public"`
	CreatedAt time.Time  `json:"created_at"`
	RetiredAt *time.Time `json:"retired_at,omitempty"`
	// Subscriptions counts the active Web Push devices subscribed with
	// this credential's key.
	Subscriptions *int64 `json:"subscriptions,omitempty"`
}

// Errors of the store, for the API to map.
var (
	ErrNotFound = errors.New("no such app")
	// ErrOldRelease: a worker process of a release without apps is alive,
	// and would send a new app's devices with the environment's
	// credentials.
	ErrOldRelease = errors.New("a worker of a release without apps is running")
	ErrTooMany    = fmt.Errorf("an installation has at most %d apps", MaxApps)
)

// Store reads and changes the apps and their credentials in the database;
// what it writes, every process's Registry reads within a second or two.
type Store struct {
	Pool   db.TxBeginner
	Sealer *Sealer
	// EnvChannels are the channels the default app has credentials for in
	// this process's environment, to say where its sends take them from.
	EnvChannels []string
}

func appOf(a db.App) App {
	return App{ID: a.ID, Name: a.Name, Disabled: a.DisabledAt != nil, DisabledAt: a.DisabledAt, CreatedAt: a.CreatedAt.UTC()}
}

// List returns every app with its channels.
func (s *Store) List(ctx context.Context, q db.DBTX) ([]App, error) {
	rows, err := db.On(q).ListApps(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]App, 0, len(rows))
	for _, r := range rows {
		a := appOf(r)
		if err := s.fill(ctx, q, &a); err != nil {
			return nil, err
		}
		out = append(out, a)
	}
	return out, nil
}

// Get returns the app named name, or ErrNotFound.
func (s *Store) Get(ctx context.Context, q db.DBTX, name string) (App, error) {
	r, err := db.On(q).GetApp(ctx, name)
	return s.found(ctx, q, r, err)
}

// found is the app of a row read, with its channels, or ErrNotFound.
func (s *Store) found(ctx context.Context, q db.DBTX, r db.App, err error) (App, error) {
	if errors.Is(err, db.ErrNotFound) {
		return App{}, ErrNotFound
	}
	if err != nil {
		return App{}, err
	}
	a := appOf(r)
	return a, s.fill(ctx, q, &a)
}

// fill adds an app's channels and credentials.
func (s *Store) fill(ctx context.Context, q db.DBTX, a *App) error {
	creds, err := db.On(q).ListAppCredentials(ctx, a.ID)
	if err != nil {
		return err
	}
	subs, err := db.On(q).CredentialSubscriptions(ctx, a.ID)
	if err != nil {
		return err
	}
	counts := map[int64]int64{}
	for _, r := range subs {
		counts[r.ID] = r.Devices
	}
	a.Channels = nil
	for _, ch := range Channels {
		c := ChannelApp{Channel: ch, Source: "none", Credentials: []CredentialInfo{}}
		for _, r := range creds {
			if r.Channel != ch {
				continue
			}
			info := CredentialInfo{Version: r.Version, State: r.State, Public: r.Public, CreatedAt: r.CreatedAt.UTC(), RetiredAt: r.RetiredAt}
			if n, ok := counts[r.ID]; ok {
				info.Subscriptions = &n
			}
			if r.State == StateActive {
				c.Source = "stored"
			}
			c.Credentials = append(c.Credentials, info)
		}
		if c.Source == "none" && a.ID == DefaultID && slices.Contains(s.EnvChannels, ch) {
			c.Source = "environment"
		}
		a.Channels = append(a.Channels, c)
	}
	return nil
}

// Create makes an app named name (created false when it was there). An app
// other than the default is refused while a worker of a release without
// apps is alive (ErrOldRelease), which would send its devices with the
// environment's credentials.
func (s *Store) Create(ctx context.Context, name string) (app App, created bool, err error) {
	if err := CheckName(name); err != nil {
		return App{}, false, err
	}
	err = db.InTx(ctx, s.Pool, func(tx pgx.Tx) error {
		q := db.On(tx)
		all, err := q.ListApps(ctx)
		if err != nil {
			return err
		}
		if !slices.ContainsFunc(all, func(a db.App) bool { return a.Name == name }) {
			old, err := q.ProcessesWithoutApps(ctx)
			if err != nil {
				return err
			}
			if len(old) > 0 {
				return fmt.Errorf("%w (%s): finish the upgrade of every worker first", ErrOldRelease, strings.Join(old, ", "))
			}
		}
		if len(all) >= MaxApps && !slices.ContainsFunc(all, func(a db.App) bool { return a.Name == name }) {
			return ErrTooMany
		}
		r, err := q.CreateApp(ctx, name)
		if err != nil {
			return err
		}
		app, created = App{ID: r.ID, Name: r.Name, Disabled: r.DisabledAt != nil, DisabledAt: r.DisabledAt, CreatedAt: r.CreatedAt.UTC()}, r.Created
		return s.fill(ctx, tx, &app)
	})
	return app, created, err
}

// SetDisabled disables the app named name, or enables it again.
func (s *Store) SetDisabled(ctx context.Context, q db.DBTX, name string, disabled bool) (App, error) {
	if disabled && name == DefaultName {
		// The default app can be left without credentials, but not
		// disabled: every device of a release without apps is its.
		return App{}, invalid("disabled", "the default app cannot be disabled; retire its credentials instead")
	}
	r, err := db.On(q).SetAppDisabled(ctx, db.SetAppDisabledParams{Name: name, Disabled: disabled})
	return s.found(ctx, q, r, err)
}

// appRow reads the app named name, or ErrNotFound.
func appRow(ctx context.Context, q *db.Queries, name string) (db.App, error) {
	app, err := q.GetApp(ctx, name)
	if errors.Is(err, db.ErrNotFound) {
		return db.App{}, ErrNotFound
	}
	return app, err
}

// channelLockKey names the advisory lock of an app's channel.
func channelLockKey(appID int32, channel string) string {
	return fmt.Sprintf("%d/%s", appID, channel)
}

// Rotate stores a new credential for an app's channel and makes it the
// active one: every process's new sends use it within a second or two,
// sends in flight finish with the one they began with, and the credential
// before it is retired (for Web Push kept as retiring, for the
// subscriptions made with its key). in must have been checked.
func (s *Store) Rotate(ctx context.Context, name string, in Input) (CredentialInfo, error) {
	channel, err := in.Channel()
	if err != nil {
		return CredentialInfo{}, err
	}
	if !s.Sealer.CanSeal() {
		return CredentialInfo{}, ErrNoSealKey
	}
	public, secret, err := in.split()
	if err != nil {
		return CredentialInfo{}, err
	}
	var out CredentialInfo
	err = db.InTx(ctx, s.Pool, func(tx pgx.Tx) error {
		q := db.On(tx)
		app, err := appRow(ctx, q, name)
		if err != nil {
			return err
		}
		if err := q.LockAppChannel(ctx, channelLockKey(app.ID, channel)); err != nil {
			return err
		}
		version, err := q.NextCredentialVersion(ctx, db.NextCredentialVersionParams{AppID: app.ID, Channel: channel})
		if err != nil {
			return err
		}
		sealed, keyID, err := s.Sealer.Seal(app.ID, channel, version, secret)
		if err != nil {
			return err
		}
		if err := q.StepDownCredential(ctx, db.StepDownCredentialParams{AppID: app.ID, Channel: channel}); err != nil {
			return err
		}
		r, err := q.InsertCredential(ctx, db.InsertCredentialParams{AppID: app.ID, Channel: channel, Version: version, Public: public, Sealed: sealed, SealKey: keyID})
		if err != nil {
			return err
		}
		out = CredentialInfo{Version: r.Version, State: r.State, Public: r.Public, CreatedAt: r.CreatedAt.UTC()}
		return nil
	})
	return out, err
}

// Retire retires an app's credentials of channel: the one of version, or
// every live one when version is 0. An app's channel left without a live
// credential is disabled (for the default app, its sends fall back on the
// environment's credentials, where the process has some).
func (s *Store) Retire(ctx context.Context, name, channel string, version int32) ([]CredentialInfo, error) {
	if !slices.Contains(Channels, channel) {
		return nil, invalid("channel", "must be one of apns, fcm and webpush, got %q", channel)
	}
	var out []CredentialInfo
	err := db.InTx(ctx, s.Pool, func(tx pgx.Tx) error {
		q := db.On(tx)
		app, err := appRow(ctx, q, name)
		if err != nil {
			return err
		}
		rows, err := q.RetireCredentials(ctx, db.RetireCredentialsParams{AppID: app.ID, Channel: channel, Version: version})
		if err != nil {
			return err
		}
		for _, r := range rows {
			out = append(out, CredentialInfo{Version: r.Version, State: r.State, Public: r.Public, CreatedAt: r.CreatedAt.UTC(), RetiredAt: r.RetiredAt})
		}
		return nil
	})
	return out, err
}

// Reseal seals every live credential again with the Sealer's first key,
// so that an older sealing key can be dropped from HERALD_SECRET_KEY. It
// returns how many it sealed again.
func (s *Store) Reseal(ctx context.Context) (int, error) {
	if !s.Sealer.CanSeal() {
		return 0, ErrNoSealKey
	}
	n := 0
	err := db.InTx(ctx, s.Pool, func(tx pgx.Tx) error {
		q := db.On(tx)
		rows, err := q.LiveCredentials(ctx)
		if err != nil {
			return err
		}
		n = 0
		for _, r := range rows {
			if r.SealKey == s.Sealer.KeyID() {
				continue
			}
			plain, err := s.Sealer.Open(r.AppID, r.Channel, r.Version, r.SealKey, r.Sealed)
			if err != nil {
				return fmt.Errorf("app %d %s credential version %d: %w", r.AppID, r.Channel, r.Version, err)
			}
			sealed, keyID, err := s.Sealer.Seal(r.AppID, r.Channel, r.Version, plain)
			if err != nil {
				return err
			}
			if err := q.ResealCredential(ctx, db.ResealCredentialParams{ID: r.ID, Sealed: sealed, SealKey: keyID}); err != nil {
				return err
			}
			n++
		}
		return nil
	})
	return n, err
}

// Index is the apps' names and ids both ways, as read at once.
type Index struct {
	ByName map[string]int32
	ByID   map[int32]string
}

// ReadIndex reads the apps' names and ids.
func ReadIndex(ctx context.Context, q db.DBTX) (Index, error) {
	rows, err := db.On(q).ListApps(ctx)
	if err != nil {
		return Index{}, fmt.Errorf("read apps: %w", err)
	}
	ix := Index{ByName: make(map[string]int32, len(rows)), ByID: make(map[int32]string, len(rows))}
	for _, r := range rows {
		ix.ByName[r.Name], ix.ByID[r.ID] = r.ID, r.Name
	}
	return ix, nil
}

// Resolve maps app names to their ids, in order, each once; an unknown
// name is an *InvalidError naming field.
func Resolve(ctx context.Context, q db.DBTX, field string, names []string) ([]int32, error) {
	if len(names) == 0 {
		return nil, nil
	}
	ix, err := ReadIndex(ctx, q)
	if err != nil {
		return nil, err
	}
	var ids []int32
	for _, n := range names {
		id, ok := ix.ByName[n]
		if !ok {
			return nil, invalid(field, "no app is named %q", n)
		}
		if !slices.Contains(ids, id) {
			ids = append(ids, id)
		}
	}
	return ids, nil
}
