package fake

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
)

// DefaultApp is the name of the app whose credentials fakepush writes to
// DIR/env. Every device token not declared another app's belongs to it.
const DefaultApp = "default"

// File names of the apps, under Config.TLSDir. Each app has a directory
// apps/NAME holding its keys (one file a key, named by its id), keys.json (which
// keys it has, in the order they were made, and which are revoked) and, for the
// apps beside the default one, service-account.json and app.json. The default
// app's first keys are the files fakepush wrote before it had apps; its
// directory appears once one of its keys is rotated or revoked.
const (
	dirApps         = "apps"
	fileAppKeys     = "keys.json"
	fileAppJSON     = "app.json"
	fileAppAccount  = "service-account.json"
	fileAppTokens   = "tokens" // under apps/: the token bindings, one a line
	appTopicPrefix  = "com.heraldpush."
	appProjectStart = "herald-fake-"
	maxAppName      = 63
	vapidKeyIDChars = 16 // a VAPID key's id: the first characters of its base64url public key
)

// errNoApp is wrapped by every error about an app name fakepush does not
// know, which the control endpoints answer 404.
var errNoApp = errors.New("no such app")

// checkAppName enforces what an app name may be: 1 to 63 characters of a-z,
// 0-9, '.', '_' and '-', starting with a letter or a digit, so that it is a
// directory name and fits in a bundle id and a project id.
func checkAppName(name string) error {
	if name == "" || len(name) > maxAppName {
		return fmt.Errorf("app name %q: want 1 to %d characters", name, maxAppName)
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		alnum := c >= 'a' && c <= 'z' || c >= '0' && c <= '9'
		switch {
		case i == 0 && !alnum:
			return fmt.Errorf("app name %q must start with a lower-case letter or a digit", name)
		case !alnum && c != '.' && c != '_' && c != '-':
			return fmt.Errorf("app name %q may hold only a-z, 0-9, '.', '_' and '-'", name)
		}
	}
	return nil
}

// appProject is the Firebase project of an app beside the default one: its
// name after "herald-fake-", with '.' and '_' made '-', since a project id
// holds only lower-case letters, digits and '-'.
func appProject(name string) string {
	return appProjectStart + strings.Map(func(r rune) rune {
		if r == '.' || r == '_' {
			return '-'
		}
		return r
	}, name)
}

// app is one app as the providers know it: an APNs team and bundle id, a
// Firebase project and its service account, and the VAPID keys its
// subscriptions are made with. Its fields never change; its keys are in the
// appSet, since they do.
type app struct {
	name    string
	dir     string // absolute TLSDir/apps/NAME
	topic   string
	project string
	email   string // the service account's client_email
	teamID  string
	// counts are the push requests fakepush attributed to the app, per
	// channel, since start or the last Reset.
	counts [numChannels]appCounters
}

// appCounters are one app's tallies of one channel, behind AppChannelStats.
type appCounters struct {
	received, accepted, rejected atomic.Int64
}

// appKey is one key of an app on one channel: an APNs signing key, a
// service-account key, a VAPID key pair. It never changes: revoking a key
// replaces it, in a new appSet, by a copy marked revoked.
type appKey struct {
	app     *app
	ch      Channel
	id      string // APNs key id, private_key_id, or the VAPID key's first 16 characters
	file    string // absolute path of the file holding it
	revoked bool
	ec      *ecdsa.PrivateKey // APNs and Web Push
	rsa     *rsa.PrivateKey   // FCM
	public  []byte            // Web Push: the uncompressed P-256 point, as k= carries it
	private []byte            // Web Push: the 32-byte scalar
}

// appSet is every app and key at one moment. It is never changed once
// published: a change builds a new one and swaps it in, so that a push reads
// a consistent set with one atomic load and no lock.
type appSet struct {
	def      *app
	apps     map[string]*app
	keys     map[*app]*[numChannels][]*appKey // oldest first: the last is the one in use
	byID     [numChannels]map[string]*appKey
	topics   map[string]*app
	projects map[string]*app
	emails   map[string]*app
}

func newAppSet() *appSet {
	set := &appSet{
		apps:     make(map[string]*app),
		keys:     make(map[*app]*[numChannels][]*appKey),
		topics:   make(map[string]*app),
		projects: make(map[string]*app),
		emails:   make(map[string]*app),
	}
	for ch := range numChannels {
		set.byID[ch] = make(map[string]*appKey)
	}
	return set
}

// clone copies the set's maps, for a change to be made on the copy.
func (set *appSet) clone() *appSet {
	c := &appSet{
		def:      set.def,
		apps:     maps.Clone(set.apps),
		keys:     make(map[*app]*[numChannels][]*appKey, len(set.keys)),
		topics:   maps.Clone(set.topics),
		projects: maps.Clone(set.projects),
		emails:   maps.Clone(set.emails),
	}
	for a, ks := range set.keys {
		k := *ks
		c.keys[a] = &k
	}
	for ch := range numChannels {
		c.byID[ch] = maps.Clone(set.byID[ch])
	}
	return c
}

// put adds a, or replaces its keys, in a set not yet published.
func (set *appSet) put(a *app, keys [numChannels][]*appKey) {
	set.apps[a.name] = a
	set.keys[a] = &keys
	for ch := range numChannels {
		for _, k := range keys[ch] {
			set.byID[ch][k.id] = k
		}
	}
	set.topics[a.topic] = a
	set.projects[a.project] = a
	set.emails[a.email] = a
}

// current is the key a uses now on ch: its newest.
func (set *appSet) current(a *app, ch Channel) *appKey {
	ks := set.keys[a][ch]
	return ks[len(ks)-1]
}

// sorted lists the apps, the default one first and the others by name.
func (set *appSet) sorted() []*app {
	out := make([]*app, 0, len(set.apps))
	for _, a := range set.apps {
		if a != set.def {
			out = append(out, a)
		}
	}
	slices.SortFunc(out, func(x, y *app) int { return strings.Compare(x.name, y.name) })
	return append([]*app{set.def}, out...)
}

// clash reports another app that already has a's topic or project.
func (set *appSet) clash(a *app) error {
	if b := set.topics[a.topic]; b != nil && b.name != a.name {
		return fmt.Errorf("app %q would have the APNs topic %s, which is app %q's", a.name, a.topic, b.name)
	}
	if b := set.projects[a.project]; b != nil && b.name != a.name {
		return fmt.Errorf("app %q would have the Firebase project %s, which is app %q's", a.name, a.project, b.name)
	}
	return nil
}

// appRegistry is the Server's apps: the published set, and the mutex that
// serializes its changes and the files behind them.
type appRegistry struct {
	mu  sync.Mutex
	set atomic.Pointer[appSet]
	// written is set once Start has written the apps' client files: from then
	// on a change rewrites them at once.
	written bool
}

func (r *appRegistry) load() *appSet { return r.set.Load() }

// appManifest is an app's keys.json.
type appManifest struct {
	TeamID  string        `json:"team_id,omitempty"`
	APNs    []manifestKey `json:"apns"`
	FCM     []manifestKey `json:"fcm"`
	WebPush []manifestKey `json:"webpush"`
}

type manifestKey struct {
	KeyID   string `json:"key_id"`
	Revoked bool   `json:"revoked,omitempty"`
}

func (m *appManifest) channel(ch Channel) *[]manifestKey {
	switch ch {
	case APNs:
		return &m.APNs
	case FCM:
		return &m.FCM
	}
	return &m.WebPush
}

// keyFileName is the name, in its app's directory, of a key's file.
func keyFileName(ch Channel, id string) string {
	switch ch {
	case APNs:
		return "apns-" + id + ".p8"
	case FCM:
		return "fcm-" + id + ".pem"
	}
	return "vapid-" + id + ".pem"
}

// loadApps builds the first appSet: the default app from the credentials New
// loaded, every app found under TLSDir/apps, and those of Config.Apps not
// there yet, which it creates.
func (s *Server) loadApps() error {
	set := newAppSet()
	def := &app{
		name:    DefaultApp,
		dir:     filepath.Join(s.dir, dirApps, DefaultApp),
		topic:   s.cfg.APNsTopic,
		project: s.cfg.FCMProjectID,
		email:   clientEmail(s.cfg.FCMProjectID),
		teamID:  s.creds.apnsTeamID,
	}
	set.def = def
	keys, err := s.loadDefaultKeys(def)
	if err != nil {
		return err
	}
	set.put(def, keys)

	entries, err := os.ReadDir(filepath.Join(s.dir, dirApps))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("read %s: %w", filepath.Join(s.dir, dirApps), err)
	}
	for _, e := range entries {
		name := e.Name()
		if !e.IsDir() || name == DefaultApp || checkAppName(name) != nil {
			continue
		}
		m, err := readManifest(filepath.Join(s.dir, dirApps, name))
		if err != nil {
			return err
		}
		if m == nil {
			continue // never finished: made again if asked for
		}
		a := s.newApp(name, m.TeamID)
		if err := set.clash(a); err != nil {
			return err
		}
		keys, err := loadAppKeys(a, m, nil)
		if err != nil {
			return err
		}
		if a.teamID == "" {
			// The team is the first key's, as when the app was made.
			if _, a.teamID, err = appleIDs(keys[APNs][0].ec); err != nil {
				return err
			}
		}
		set.put(a, keys)
	}
	s.apps.set.Store(set)
	for _, name := range s.cfg.Apps {
		if _, _, err := s.AddApp(name); err != nil {
			return err
		}
	}
	return s.loadTokenBindings()
}

// newApp is an app beside the default one, before its keys.
func (s *Server) newApp(name, teamID string) *app {
	project := appProject(name)
	return &app{
		name:    name,
		dir:     filepath.Join(s.dir, dirApps, name),
		topic:   appTopicPrefix + name,
		project: project,
		email:   clientEmail(project),
		teamID:  teamID,
	}
}

// readManifest reads dir's keys.json, or nil when there is none.
func readManifest(dir string) (*appManifest, error) {
	path := filepath.Join(dir, fileAppKeys)
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	var m appManifest
	if err := json.Unmarshal(data, &m); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return &m, nil
}

// legacyKeys are the default app's first keys, the ones in the files
// fakepush wrote before it had apps.
func (s *Server) legacyKeys(def *app) [numChannels]*appKey {
	c := s.creds
	return [numChannels]*appKey{
		APNs:    {app: def, ch: APNs, id: c.apnsKeyID, file: filepath.Join(s.dir, fileAPNsKey), ec: c.apnsKey},
		FCM:     {app: def, ch: FCM, id: c.fcmKeyID, file: filepath.Join(s.dir, fileFCMAccount), rsa: c.fcmKey},
		WebPush: {app: def, ch: WebPush, id: b64(c.vapidPublic)[:vapidKeyIDChars], file: filepath.Join(s.dir, fileVAPIDKey), ec: c.vapidKey, public: c.vapidPublic, private: c.vapidPrivate},
	}
}

// loadDefaultKeys is the default app's keys: its first ones, then those its
// keys.json names, if it has one.
func (s *Server) loadDefaultKeys(def *app) ([numChannels][]*appKey, error) {
	legacy := s.legacyKeys(def)
	m, err := readManifest(def.dir)
	if err != nil || m == nil {
		var keys [numChannels][]*appKey
		for ch := range numChannels {
			keys[ch] = []*appKey{legacy[ch]}
		}
		return keys, err
	}
	return loadAppKeys(def, m, &legacy)
}

// loadAppKeys reads the keys m names from a's directory; legacy, for the
// default app, stands for the keys in the older files.
func loadAppKeys(a *app, m *appManifest, legacy *[numChannels]*appKey) ([numChannels][]*appKey, error) {
	var keys [numChannels][]*appKey
	for ch := range numChannels {
		entries := *m.channel(ch)
		if legacy != nil && !slices.ContainsFunc(entries, func(e manifestKey) bool { return e.KeyID == legacy[ch].id }) {
			keys[ch] = append(keys[ch], legacy[ch])
		}
		for _, e := range entries {
			var k *appKey
			if legacy != nil && e.KeyID == legacy[ch].id {
				c := *legacy[ch]
				k = &c
			} else {
				var err error
				if k, err = readAppKey(a, ch, e.KeyID); err != nil {
					return keys, err
				}
			}
			k.revoked = e.Revoked
			keys[ch] = append(keys[ch], k)
		}
		if len(keys[ch]) == 0 {
			return keys, fmt.Errorf("%s names no %s key; delete %s to make the app afresh", filepath.Join(a.dir, fileAppKeys), ch, a.dir)
		}
	}
	return keys, nil
}

// readAppKey reads one key file of a.
func readAppKey(a *app, ch Channel, id string) (*appKey, error) {
	if id == "" || strings.ContainsAny(id, `/\`) {
		return nil, fmt.Errorf("%s: bad key id %q", filepath.Join(a.dir, fileAppKeys), id)
	}
	path := filepath.Join(a.dir, keyFileName(ch, id))
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read %s (delete %s to make the app afresh): %w", path, a.dir, err)
	}
	k := &appKey{app: a, ch: ch, id: id, file: path}
	if ch == FCM {
		block, _ := pem.Decode(data)
		if block == nil {
			return nil, fmt.Errorf("%s: no PEM block", path)
		}
		key, err := x509.ParsePKCS8PrivateKey(block.Bytes)
		rsaKey, ok := key.(*rsa.PrivateKey)
		if err != nil || !ok {
			return nil, fmt.Errorf("%s: not an RSA key", path)
		}
		k.rsa = rsaKey
		return k, nil
	}
	if k.ec, err = parseECKeyPEM(data); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if ch == WebPush {
		if err := k.vapidHalves(); err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
	}
	return k, nil
}

// vapidHalves fills a VAPID key's public and private encodings.
func (k *appKey) vapidHalves() error {
	var err error
	if k.public, err = k.ec.PublicKey.Bytes(); err != nil {
		return err
	}
	k.private, err = k.ec.Bytes()
	return err
}

// newAppKey makes a key for a on ch and writes its file; taken says which
// ids are in use already, on this channel, by any app.
func newAppKey(a *app, ch Channel, taken map[string]*appKey) (*appKey, error) {
	for {
		k := &appKey{app: a, ch: ch}
		var err error
		switch ch {
		case APNs:
			if k.ec, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader); err == nil {
				k.id, _, err = appleIDs(k.ec)
			}
		case FCM:
			k.rsa, k.id, err = newServiceAccountKey()
		case WebPush:
			if k.ec, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader); err == nil {
				if err = k.vapidHalves(); err == nil {
					k.id = b64(k.public)[:vapidKeyIDChars]
				}
			}
		}
		if err != nil {
			return nil, fmt.Errorf("app %q: make a %s key: %w", a.name, ch, err)
		}
		if taken[k.id] != nil {
			continue // ids are too long to clash but by a freak; make another
		}
		k.file = filepath.Join(a.dir, keyFileName(ch, k.id))
		var key any = k.ec
		if ch == FCM {
			key = k.rsa
		}
		if err := writeKeyFile(k.file, key); err != nil {
			return nil, err
		}
		return k, nil
	}
}

// writeManifest writes a's keys.json from set.
func writeManifest(set *appSet, a *app) error {
	m := appManifest{TeamID: a.teamID}
	for ch := range numChannels {
		list := m.channel(ch)
		*list = []manifestKey{}
		for _, k := range set.keys[a][ch] {
			*list = append(*list, manifestKey{KeyID: k.id, Revoked: k.revoked})
		}
	}
	if a == set.def {
		m.TeamID = "" // the default app's team comes from its first APNs key
	}
	data, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(a.dir, 0o700); err != nil {
		return fmt.Errorf("fakepush: %w", err)
	}
	return writeFileAtomic(filepath.Join(a.dir, fileAppKeys), append(data, '\n'), 0o600)
}

// App is an app's credentials, as GET /_apps/{name} and the other /_apps
// endpoints answer them and TLSDir/apps/NAME/app.json holds them: what a
// team would download from Apple, Google and its own VAPID key generation.
type App struct {
	Name    string     `json:"name"`
	APNs    AppAPNs    `json:"apns"`
	FCM     AppFCM     `json:"fcm"`
	WebPush AppWebPush `json:"webpush"`
}

// AppAPNs is an app's APNs credentials: the key in use (its id, its .p8 file
// and that file's content), the team and the bundle id.
type AppAPNs struct {
	KeyID   string   `json:"key_id"`
	TeamID  string   `json:"team_id"`
	Topic   string   `json:"topic"`
	KeyFile string   `json:"key_file"`
	KeyPEM  string   `json:"key_pem"`
	Keys    []AppKey `json:"keys"`
}

// AppFCM is an app's Firebase project and the service-account file of the
// key in use, as a path and as its content.
type AppFCM struct {
	ProjectID          string   `json:"project_id"`
	KeyID              string   `json:"key_id"`
	CredentialsFile    string   `json:"credentials_file"`
	ServiceAccountJSON string   `json:"service_account_json"`
	Keys               []AppKey `json:"keys"`
}

// AppWebPush is an app's VAPID key pair in use, in the encodings
// webpush-go and VAPID_PUBLIC_KEY/VAPID_PRIVATE_KEY use, and its contact.
type AppWebPush struct {
	KeyID      string   `json:"key_id"`
	PublicKey  string   `json:"public_key"`
	PrivateKey string   `json:"private_key"`
	Subject    string   `json:"subject"`
	Keys       []AppKey `json:"keys"`
}

// AppKey is one key an app has had on a channel, oldest first: the last is
// the one in use.
type AppKey struct {
	KeyID   string `json:"key_id"`
	Revoked bool   `json:"revoked"`
}

// credentialsFile is the service-account file of a's FCM key in use: for
// the default app's first key the file it always had, else one in a's
// directory.
func (s *Server) credentialsFile(set *appSet, a *app) string {
	if a == set.def && set.current(a, FCM).file == filepath.Join(s.dir, fileFCMAccount) {
		return filepath.Join(s.dir, fileFCMAccount)
	}
	return filepath.Join(a.dir, fileAppAccount)
}

// appOf renders a's credentials from set.
func (s *Server) appOf(set *appSet, a *app) (App, error) {
	apns, fcm, vapid := set.current(a, APNs), set.current(a, FCM), set.current(a, WebPush)
	p8, err := keyPEM(apns.ec)
	if err != nil {
		return App{}, err
	}
	sa, err := encodeServiceAccount(fcm.rsa, fcm.id, a.project, s.baseURL+"/token")
	if err != nil {
		return App{}, err
	}
	list := func(ch Channel) []AppKey {
		var out []AppKey
		for _, k := range set.keys[a][ch] {
			out = append(out, AppKey{KeyID: k.id, Revoked: k.revoked})
		}
		return out
	}
	return App{
		Name: a.name,
		APNs: AppAPNs{KeyID: apns.id, TeamID: a.teamID, Topic: a.topic, KeyFile: apns.file, KeyPEM: string(p8), Keys: list(APNs)},
		FCM: AppFCM{ProjectID: a.project, KeyID: fcm.id, CredentialsFile: s.credentialsFile(set, a),
			ServiceAccountJSON: string(sa), Keys: list(FCM)},
		WebPush: AppWebPush{KeyID: vapid.id, PublicKey: b64(vapid.public), PrivateKey: b64(vapid.private),
			Subject: s.cfg.VAPIDSubject, Keys: list(WebPush)},
	}, nil
}

// writeAppFiles writes what a client of a reads: its service-account file
// and app.json, or for the default app DIR/env (and its service-account
// file once its first key is not the one in use). The caller holds s.apps.mu.
func (s *Server) writeAppFiles(set *appSet, a *app) error {
	if !s.apps.written {
		return nil // Start writes them, once the address is known
	}
	if a == set.def {
		if path := s.credentialsFile(set, a); path != filepath.Join(s.dir, fileFCMAccount) {
			fcm := set.current(a, FCM)
			data, err := encodeServiceAccount(fcm.rsa, fcm.id, a.project, s.baseURL+"/token")
			if err != nil {
				return err
			}
			if err := writeFileAtomic(path, data, 0o600); err != nil {
				return err
			}
		}
		return s.writeEnv(set)
	}
	app, err := s.appOf(set, a)
	if err != nil {
		return err
	}
	if err := writeFileAtomic(app.FCM.CredentialsFile, []byte(app.FCM.ServiceAccountJSON), 0o600); err != nil {
		return err
	}
	data, err := json.MarshalIndent(app, "", "  ")
	if err != nil {
		return err
	}
	return writeFileAtomic(filepath.Join(a.dir, fileAppJSON), append(data, '\n'), 0o600)
}

// AddApp adds the app name, with new keys on every channel, as POST /_apps
// does; created is false when it existed already, and is then left as it is.
func (s *Server) AddApp(name string) (a App, created bool, err error) {
	if err := checkAppName(name); err != nil {
		return App{}, false, err
	}
	s.apps.mu.Lock()
	defer s.apps.mu.Unlock()
	set := s.apps.load()
	if old := set.apps[name]; old != nil {
		a, err := s.appOf(set, old)
		return a, false, err
	}
	n := s.newApp(name, "")
	if err := set.clash(n); err != nil {
		return App{}, false, err
	}
	if err := os.MkdirAll(n.dir, 0o700); err != nil {
		return App{}, false, fmt.Errorf("fakepush: %w", err)
	}
	var keys [numChannels][]*appKey
	for ch := range numChannels {
		k, err := newAppKey(n, ch, set.byID[ch])
		if err != nil {
			return App{}, false, err
		}
		keys[ch] = []*appKey{k}
	}
	// The team is the app's first key's, as the default app's is.
	if _, n.teamID, err = appleIDs(keys[APNs][0].ec); err != nil {
		return App{}, false, err
	}
	next := set.clone()
	next.put(n, keys)
	if err := writeManifest(next, n); err != nil {
		return App{}, false, err
	}
	if err := s.writeAppFiles(next, n); err != nil {
		return App{}, false, err
	}
	s.apps.set.Store(next)
	a, err = s.appOf(next, n)
	return a, true, err
}

// Apps lists every app's credentials, the default one first and the others
// by name, as GET /_apps does.
func (s *Server) Apps() ([]App, error) {
	set := s.apps.load()
	var out []App
	for _, a := range set.sorted() {
		app, err := s.appOf(set, a)
		if err != nil {
			return nil, err
		}
		out = append(out, app)
	}
	return out, nil
}

// App returns the credentials of the app name, as GET /_apps/{name} does.
func (s *Server) App(name string) (App, error) {
	if err := checkAppName(name); err != nil {
		return App{}, err
	}
	set := s.apps.load()
	a := set.apps[name]
	if a == nil {
		return App{}, fmt.Errorf("%w: %q", errNoApp, name)
	}
	return s.appOf(set, a)
}

// appChannel reads a channel name of the /_apps bodies.
func appChannel(name string) (Channel, error) {
	ch, ok := parseChannel(name)
	if !ok {
		return 0, fmt.Errorf("channel must be apns, fcm or webpush, got %q", name)
	}
	return ch, nil
}

// RotateAppKey gives the app name a new key on channel, as POST
// /_apps/{name}/rotate does, and returns its credentials, which now hold
// it. Its older keys stay valid until revoked, as a team's do at Apple and
// Google.
func (s *Server) RotateAppKey(name, channel string) (App, error) {
	if err := checkAppName(name); err != nil {
		return App{}, err
	}
	ch, err := appChannel(channel)
	if err != nil {
		return App{}, err
	}
	s.apps.mu.Lock()
	defer s.apps.mu.Unlock()
	set := s.apps.load()
	a := set.apps[name]
	if a == nil {
		return App{}, fmt.Errorf("%w: %q", errNoApp, name)
	}
	if err := os.MkdirAll(a.dir, 0o700); err != nil {
		return App{}, fmt.Errorf("fakepush: %w", err)
	}
	k, err := newAppKey(a, ch, set.byID[ch])
	if err != nil {
		return App{}, err
	}
	next := set.clone()
	keys := *next.keys[a]
	keys[ch] = append(slices.Clip(keys[ch]), k)
	next.put(a, keys)
	if err := s.commit(next, a); err != nil {
		return App{}, err
	}
	return s.appOf(next, a)
}

// RevokeAppKey revokes the key keyID of the app name on channel, or every
// key it has there when keyID is empty, as POST /_apps/{name}/revoke does.
// Revoking a key revoked already changes nothing.
func (s *Server) RevokeAppKey(name, channel, keyID string) error {
	if err := checkAppName(name); err != nil {
		return err
	}
	ch, err := appChannel(channel)
	if err != nil {
		return err
	}
	s.apps.mu.Lock()
	defer s.apps.mu.Unlock()
	set := s.apps.load()
	a := set.apps[name]
	if a == nil {
		return fmt.Errorf("%w: %q", errNoApp, name)
	}
	next := set.clone()
	keys := *next.keys[a]
	keys[ch] = slices.Clone(keys[ch])
	found := false
	for i, k := range keys[ch] {
		if keyID == "" || k.id == keyID {
			c := *k
			c.revoked = true
			keys[ch][i] = &c
			found = true
		}
	}
	if !found {
		return fmt.Errorf("app %q has no %s key %q", name, ch, keyID)
	}
	next.put(a, keys)
	return s.commit(next, a)
}

// commit writes a's files for next, a set in which a's keys changed, and
// publishes it. The caller holds s.apps.mu.
func (s *Server) commit(next *appSet, a *app) error {
	if err := writeManifest(next, a); err != nil {
		return err
	}
	if err := s.writeAppFiles(next, a); err != nil {
		return err
	}
	s.apps.set.Store(next)
	return nil
}

// AppTokens is the body of POST /_apps/{name}/tokens: device tokens of a
// channel (apns or fcm) that belong to the app.
type AppTokens struct {
	Channel string   `json:"channel"`
	Tokens  []string `json:"tokens"`
}

// tokenBindings say which app each declared APNs and FCM device token
// belongs to; a token not in them is the default app's.
type tokenBindings struct {
	mu sync.RWMutex
	m  [2]map[string]*app // APNs tokens in lower case, then FCM ones
	// n counts the bindings, read without the lock so that a server whose
	// tokens are all the default app's pays nothing per push.
	n atomic.Int64
}

// app is the app token belongs to on ch (APNs or FCM), nil for the default
// one.
func (b *tokenBindings) app(ch Channel, token string) *app {
	if b.n.Load() == 0 {
		return nil
	}
	if ch == APNs {
		token = strings.ToLower(token)
	}
	b.mu.RLock()
	defer b.mu.RUnlock()
	return b.m[ch][token]
}

// bind makes token a's on ch, nil meaning the default app, and reports
// whether that changed anything. The caller holds b.mu.
func (b *tokenBindings) bind(ch Channel, token string, a *app) bool {
	if b.m[ch] == nil {
		b.m[ch] = make(map[string]*app)
	}
	old, had := b.m[ch][token]
	switch {
	case a == nil && !had, a != nil && old == a:
		return false
	case a == nil:
		delete(b.m[ch], token)
		b.n.Add(-1)
	default:
		if !had {
			b.n.Add(1)
		}
		b.m[ch][token] = a
	}
	return true
}

// tokenApp is the app a device token belongs to on ch (APNs or FCM).
func (s *Server) tokenApp(set *appSet, ch Channel, token string) *app {
	if a := s.bindings.app(ch, token); a != nil {
		return a
	}
	return set.def
}

// DeclareAppTokens makes the tokens of t the app name's, as POST
// /_apps/{name}/tokens does: pushes to them must then come with that app's
// topic (APNs) or through its project (FCM). The bindings are kept in
// TLSDir/apps/tokens, so that a restart keeps them; Reset keeps them too.
func (s *Server) DeclareAppTokens(name string, t AppTokens) error {
	if err := checkAppName(name); err != nil {
		return err
	}
	ch, err := appChannel(t.Channel)
	if err != nil {
		return err
	}
	if ch == WebPush {
		return errors.New("channel must be apns or fcm: a Web Push subscription belongs to the app whose key it was made with (POST /_webpush/subscriptions)")
	}
	tokens := make([]string, len(t.Tokens))
	for i, tok := range t.Tokens {
		switch {
		case ch == APNs && !isHex(tok):
			return fmt.Errorf("tokens: %q is not an APNs token (hex digits)", tok)
		case ch == FCM && (tok == "" || !isFCMToken(tok)):
			return fmt.Errorf("tokens: %q is not an FCM registration token", tok)
		}
		tokens[i] = tok
		if ch == APNs {
			tokens[i] = strings.ToLower(tok)
		}
	}
	s.apps.mu.Lock()
	defer s.apps.mu.Unlock()
	set := s.apps.load()
	a := set.apps[name]
	if a == nil {
		return fmt.Errorf("%w: %q", errNoApp, name)
	}
	bound := a
	if a == set.def {
		bound = nil
	}
	// The file first, then the bindings: what a push sees is on disk.
	var lines bytes.Buffer
	s.bindings.mu.RLock()
	for _, tok := range tokens {
		if s.bindings.m[ch][tok] != bound {
			fmt.Fprintf(&lines, "%s %s %s\n", ch, name, tok)
		}
	}
	s.bindings.mu.RUnlock()
	if lines.Len() == 0 {
		return nil
	}
	if err := appendFile(filepath.Join(s.dir, dirApps, fileAppTokens), lines.Bytes()); err != nil {
		return err
	}
	s.bindings.mu.Lock()
	defer s.bindings.mu.Unlock()
	for _, tok := range tokens {
		s.bindings.bind(ch, tok, bound)
	}
	return nil
}

// loadTokenBindings reads TLSDir/apps/tokens, in which a later line
// overrides an earlier one. A line naming an app no longer there is passed
// over.
func (s *Server) loadTokenBindings() error {
	path := filepath.Join(s.dir, dirApps, fileAppTokens)
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("read %s: %w", path, err)
	}
	set := s.apps.load()
	s.bindings.mu.Lock()
	defer s.bindings.mu.Unlock()
	for line := range strings.Lines(string(data)) {
		f := strings.Fields(line)
		if len(f) != 3 {
			continue
		}
		ch, ok := parseChannel(f[0])
		a := set.apps[f[1]]
		if !ok || ch == WebPush || a == nil {
			continue
		}
		if a == set.def {
			a = nil
		}
		s.bindings.bind(ch, f[2], a)
	}
	return nil
}

// appendFile appends data to path, creating it (and its directory) if need
// be.
func appendFile(path string, data []byte) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return fmt.Errorf("fakepush: %w", err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("fakepush: %w", err)
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return fmt.Errorf("fakepush: write %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("fakepush: write %s: %w", path, err)
	}
	return nil
}

// appTally attributes one push request to an app for /_stats: the app of
// its device once that is known, before that the app of its credentials.
// A request tied to no app (its credentials no app's, its device unknown)
// counts in its channel's totals only.
type appTally struct {
	app      *app
	accepted bool
	// warmup marks a request that is no push (an FCM dry run).
	warmup bool
}

// countApp adds a finished request's tally to its app's counters; handlers
// defer it once admit has let the request in.
func countApp(ch Channel, t *appTally) {
	if t.app == nil || t.warmup {
		return
	}
	c := &t.app.counts[ch]
	c.received.Add(1)
	if t.accepted {
		c.accepted.Add(1)
	} else {
		c.rejected.Add(1)
	}
}

// AppKeyChange is the body of POST /_apps/{name}/rotate and
// /_apps/{name}/revoke: the channel whose key changes and, to revoke one
// key only, its id.
type AppKeyChange struct {
	Channel string `json:"channel"`
	KeyID   string `json:"key_id,omitempty"`
}

func (s *Server) handleApps(w http.ResponseWriter, _ *http.Request) {
	list, err := s.Apps()
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	s.writeJSON(w, http.StatusOK, list)
}

func (s *Server) handleAddApp(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Name string `json:"name"`
	}
	var a App
	created := false
	if !s.applyControl(w, r, &body, func() (err error) {
		a, created, err = s.AddApp(body.Name)
		return err
	}) {
		return
	}
	status := http.StatusOK
	if created {
		status = http.StatusCreated
	}
	s.writeJSON(w, status, a)
}

func (s *Server) handleApp(w http.ResponseWriter, r *http.Request) {
	a, err := s.App(r.PathValue("name"))
	if err != nil {
		s.writeJSON(w, controlStatus(err), controlError(err.Error()))
		return
	}
	s.writeJSON(w, http.StatusOK, a)
}

// handleAppCredential answers an app's credential in use on one channel as
// the body Herald's POST /v1/apps/{app}/credentials takes, so that a
// script hands it on without taking a JSON document apart.
func (s *Server) handleAppCredential(w http.ResponseWriter, r *http.Request) {
	a, err := s.App(r.PathValue("name"))
	if err != nil {
		s.writeJSON(w, controlStatus(err), controlError(err.Error()))
		return
	}
	var body any
	switch r.PathValue("channel") {
	case "apns":
		body = map[string]any{"apns": map[string]string{"key_id": a.APNs.KeyID, "team_id": a.APNs.TeamID, "topic": a.APNs.Topic, "key": a.APNs.KeyPEM}}
	case "fcm":
		body = map[string]any{"fcm": map[string]string{"service_account": a.FCM.ServiceAccountJSON}}
	case "webpush":
		body = map[string]any{"webpush": map[string]string{"public_key": a.WebPush.PublicKey, "private_key": a.WebPush.PrivateKey, "subject": a.WebPush.Subject}}
	default:
		s.writeJSON(w, http.StatusBadRequest, controlError("channel: one of apns, fcm and webpush"))
		return
	}
	s.writeJSON(w, http.StatusOK, body)
}

func (s *Server) handleAppTokens(w http.ResponseWriter, r *http.Request) {
	var body AppTokens
	if s.applyControl(w, r, &body, func() error { return s.DeclareAppTokens(r.PathValue("name"), body) }) {
		w.WriteHeader(http.StatusNoContent)
	}
}

func (s *Server) handleRotateApp(w http.ResponseWriter, r *http.Request) {
	var body AppKeyChange
	var a App
	if s.applyControl(w, r, &body, func() (err error) {
		if body.KeyID != "" {
			return errors.New("key_id: a rotation makes a new key; name none")
		}
		a, err = s.RotateAppKey(r.PathValue("name"), body.Channel)
		return err
	}) {
		s.writeJSON(w, http.StatusOK, a)
	}
}

func (s *Server) handleRevokeApp(w http.ResponseWriter, r *http.Request) {
	var body AppKeyChange
	if s.applyControl(w, r, &body, func() error {
		return s.RevokeAppKey(r.PathValue("name"), body.Channel, body.KeyID)
	}) {
		w.WriteHeader(http.StatusNoContent)
	}
}
