package apps_test

import (
	"bytes"
	"context"
	"crypto/ecdh"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/heraldpush/herald/db"
	"github.com/heraldpush/herald/db/dbtest"
	"github.com/heraldpush/herald/jobs/apps"
	"github.com/heraldpush/herald/jobs/push"
)

var discard = slog.New(slog.NewTextHandler(io.Discard, nil))

func sealer(t *testing.T, keys ...byte) *apps.Sealer {
	t.Helper()
	var raw [][]byte
	for _, k := range keys {
		raw = append(raw, bytes.Repeat([]byte{k}, apps.SealKeySize))
	}
	s, err := apps.NewSealer(raw...)
	require.NoError(t, err)
	return s
}

// TestSealerBindsAValueToItsRow: a sealed credential opens for its own
// app, channel and version only, with the key that sealed it; a second key
// given after the first opens what the old one sealed, and the first seals.
func TestSealerBindsAValueToItsRow(t *testing.T) {
	t.Parallel()
	s := sealer(t, 1)
	sealed, keyID, err := s.Seal(2, "apns", 1, []byte("the .p8 key"))
	require.NoError(t, err)
	require.NotContains(t, string(sealed), "the .p8 key")
	plain, err := s.Open(2, "apns", 1, keyID, sealed)
	require.NoError(t, err)
	require.Equal(t, "the .p8 key", string(plain))
	for _, other := range []struct {
		app     int32
		channel string
		version int32
	}{{3, "apns", 1}, {2, "fcm", 1}, {2, "apns", 2}} {
		_, err := s.Open(other.app, other.channel, other.version, keyID, sealed)
		require.Error(t, err, "a sealed value moved to app %d %s v%d must not open", other.app, other.channel, other.version)
	}
	tampered := bytes.Clone(sealed)
	tampered[len(tampered)-1] ^= 1
	_, err = s.Open(2, "apns", 1, keyID, tampered)
	require.Error(t, err)

	_, err = sealer(t, 9).Open(2, "apns", 1, keyID, sealed)
	require.ErrorContains(t, err, "HERALD_SECRET_KEY does not hold")

	rotated := sealer(t, 9, 1)
	plain, err = rotated.Open(2, "apns", 1, keyID, sealed)
	require.NoError(t, err, "the old key, given second, still opens")
	require.Equal(t, "the .p8 key", string(plain))
	require.NotEqual(t, keyID, rotated.KeyID(), "the first key seals")

	_, _, err = (&apps.Sealer{}).Seal(2, "apns", 1, []byte("x"))
	require.ErrorIs(t, err, apps.ErrNoSealKey)

	parsed, err := apps.ParseSealKeys(base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{1}, 32)))
	require.NoError(t, err)
	require.Equal(t, keyID, parsed.KeyID())
	_, err = apps.ParseSealKeys("c2hvcnQ=")
	require.ErrorContains(t, err, "32 bytes")
}

// apnsInput is a valid APNs credential with a fresh key.
func apnsInput(t *testing.T, keyID string) apps.Input {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	der, err := x509.MarshalPKCS8PrivateKey(key)
	require.NoError(t, err)
	p8 := pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})
	return apps.Input{APNs: &apps.APNs{KeyID: keyID, TeamID: "TEAM123456", Topic: "com.example.brand", Key: string(p8)}}
}

// fcmInput is a valid service account with a fresh key.
func fcmInput(t *testing.T, project string) apps.Input {
	t.Helper()
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	require.NoError(t, err)
	der, err := x509.MarshalPKCS8PrivateKey(key)
	require.NoError(t, err)
	sa, err := json.Marshal(map[string]string{
		"type": "service_account", "project_id": project, "private_key_id": "kid-1",
		"private_key":  string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})),
		"client_email": "herald@" + project + ".iam.gserviceaccount.com", "token_uri": "https://oauth2.googleapis.com/token",
	})
	require.NoError(t, err)
	return apps.Input{FCM: &apps.FCM{ServiceAccount: string(sa)}}
}

// webPushInput is a valid VAPID pair.
func webPushInput(t *testing.T) apps.Input {
	t.Helper()
	key, err := ecdh.P256().GenerateKey(rand.Reader)
	require.NoError(t, err)
	return apps.Input{WebPush: &apps.WebPush{
		PublicKey:  base64.RawURLEncoding.EncodeToString(key.PublicKey().Bytes()),
		PrivateKey: base64.RawURLEncoding.EncodeToString(key.Bytes()),
		Subject:    "mailto:push@example.com",
	}}
}

// TestCredentialsAreCheckedBeforeTheyAreStored: each channel's credential
// is held to what its provider takes, and every refusal names the field.
func TestCredentialsAreCheckedBeforeTheyAreStored(t *testing.T) {
	t.Parallel()
	good := []apps.Input{apnsInput(t, "KEY1234567"), fcmInput(t, "brand-a"), webPushInput(t)}
	for _, in := range good {
		require.NoError(t, in.Check())
	}
	fcm := fcmInput(t, "brand-a")
	require.NoError(t, fcm.Check())
	require.Equal(t, "brand-a", fcm.FCM.ProjectID, "the project is what the service account says")

	field := func(in apps.Input) string {
		var bad *apps.InvalidError
		require.ErrorAs(t, in.Check(), &bad)
		return bad.Field
	}
	a := apnsInput(t, "short")
	require.Equal(t, "apns.key_id", field(a))
	a = apnsInput(t, "KEY1234567")
	a.APNs.Key = strings.Replace(a.APNs.Key, "M", "x", 3)
	require.Equal(t, "apns.key", field(a), "a key that does not parse")
	p384, err := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	require.NoError(t, err)
	der, err := x509.MarshalPKCS8PrivateKey(p384)
	require.NoError(t, err)
	a.APNs.Key = string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}))
	require.Equal(t, "apns.key", field(a), "a key of another curve than Apple's")
	a = apnsInput(t, "KEY1234567")
	a.APNs.Topic = "com.example.brand.voip"
	require.Equal(t, "apns.topic", field(a))

	require.Equal(t, "fcm.service_account", field(apps.Input{FCM: &apps.FCM{ServiceAccount: `{"type":"authorized_user"}`}}))

	w := webPushInput(t)
	w.WebPush.PrivateKey = webPushInput(t).WebPush.PrivateKey
	require.Equal(t, "webpush.private_key", field(w), "the halves of two pairs")
	w = webPushInput(t)
	w.WebPush.Subject = "not a contact"
	require.Equal(t, "webpush.subject", field(w))

	require.Equal(t, "credentials", field(apps.Input{}))
	two := apnsInput(t, "KEY1234567")
	two.WebPush = webPushInput(t).WebPush
	require.Equal(t, "credentials", field(two))
}

// recorder is a provider client that records what it sent and whether it
// was closed: what the registry hands out.
type recorder struct {
	name   string
	sent   atomic.Int64
	closed atomic.Bool
}

func (r *recorder) Send(_ context.Context, _ *push.Message, targets []push.Target, results []push.Result, _ func() bool, _ func(int)) {
	r.sent.Add(int64(len(targets)))
}
func (r *recorder) Warm(context.Context) error { return nil }
func (r *recorder) Close()                     { r.closed.Store(true) }

// built records every client the registry built, by credential.
type built struct {
	mu      sync.Mutex
	clients map[string]*recorder
}

func (b *built) build(_ context.Context, lane string, c *apps.Credential) (apps.Provider, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	version := strconv.Itoa(int(c.Version))
	r := &recorder{name: c.App + "/" + c.Channel + "/v" + version + "/" + lane}
	b.clients[r.name] = r
	return r, nil
}

func (b *built) get(name string) *recorder {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.clients[name]
}

// TestRegistryRotatesWithoutDroppingSends: a rotation gives new sends the
// new credential's client at the next refresh, while a send that took the
// old one keeps it until it is answered, and only then is the old client
// closed. A Web Push subscription keeps the key it was made with while
// that credential is retiring, and the default app falls back on the
// environment's clients.
func TestRegistryRotatesWithoutDroppingSends(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tdb := dbtest.New(t)
	s := sealer(t, 5)
	store := &apps.Store{Pool: tdb.Pool, Sealer: s}
	b := &built{clients: map[string]*recorder{}}
	env := &recorder{name: "env/apns"}
	reg := apps.NewRegistry(apps.RegistryConfig{Pool: tdb.Pool, Sealer: s, Logger: discard, Lanes: []string{"bulk"}, Build: b.build,
		Env: map[string]map[string]apps.Provider{"bulk": {"apns": env}}})
	require.NoError(t, reg.Refresh(ctx))

	brand, created, err := store.Create(ctx, "brand-b")
	require.NoError(t, err)
	require.True(t, created)
	_, again, err := store.Create(ctx, "brand-b")
	require.NoError(t, err)
	require.False(t, again)

	// No credential yet: brand-b's APNs devices have no client, the
	// default app's go through the environment's.
	require.NoError(t, reg.Refresh(ctx))
	_, _, why := reg.Lookup("bulk", brand.ID, "apns", 0)
	require.Contains(t, why, "apns is not configured for app brand-b")
	sender, lease, _ := reg.Lookup("bulk", apps.DefaultID, "apns", 0)
	require.Same(t, env, sender)
	lease.Release()

	v1, err := store.Rotate(ctx, "brand-b", apnsInput(t, "KEY1111111"))
	require.NoError(t, err)
	require.Equal(t, int32(1), v1.Version)
	require.NoError(t, reg.Refresh(ctx))
	old, oldLease, why := reg.Lookup("bulk", brand.ID, "apns", 0)
	require.Empty(t, why)
	require.Same(t, b.get("brand-b/apns/v1/bulk"), old)

	_, err = store.Rotate(ctx, "brand-b", apnsInput(t, "KEY2222222"))
	require.NoError(t, err)
	require.NoError(t, reg.Refresh(ctx))
	current, currentLease, _ := reg.Lookup("bulk", brand.ID, "apns", 0)
	require.Same(t, b.get("brand-b/apns/v2/bulk"), current, "new sends take the new credential")
	currentLease.Release()
	require.False(t, b.get("brand-b/apns/v1/bulk").closed.Load(), "a send still holds the old client")
	require.True(t, oldLease.Retired(), "the send that holds it is told to take the new one for what it has not sent")
	require.False(t, currentLease.Retired())
	oldLease.Release()
	require.True(t, b.get("brand-b/apns/v1/bulk").closed.Load(), "closed once its last send was answered")

	// Web Push: a subscription made with v1's key keeps it while v1 is
	// retiring; once v1 is retired it goes with the active one.
	w1, err := store.Rotate(ctx, "brand-b", webPushInput(t))
	require.NoError(t, err)
	require.NoError(t, reg.Refresh(ctx))
	key1, cred1, ok := reg.WebPushKey(brand.ID)
	require.True(t, ok)
	require.JSONEq(t, string(w1.Public), `{"public_key":"`+key1+`","subject":"mailto:push@example.com"}`)
	_, err = store.Rotate(ctx, "brand-b", webPushInput(t))
	require.NoError(t, err)
	require.NoError(t, reg.Refresh(ctx))
	key2, cred2, _ := reg.WebPushKey(brand.ID)
	require.NotEqual(t, key1, key2)
	found, ok := reg.WebPushCredential(brand.ID, key1)
	require.True(t, ok, "the retiring key is still one of the app's")
	require.Equal(t, cred1, found)
	sub, subLease, _ := reg.Lookup("bulk", brand.ID, "webpush", cred1)
	require.Same(t, b.get("brand-b/webpush/v1/bulk"), sub)
	subLease.Release()
	// Retention retires a kept key only once no subscription is left
	// that was made with it.
	_, err = tdb.Pool.Exec(ctx, "INSERT INTO users (id) VALUES ('ann')")
	require.NoError(t, err)
	device, err := db.On(tdb.Pool).RegisterDevices(ctx, db.RegisterDevicesParams{
		UserIds: []string{"ann"}, Channels: []string{"webpush"}, Tokens: []string{"https://push.example/ann"},
		P256dhs: []string{"K"}, Auths: []string{"A"}, Environments: []string{"production"}, InstallationIds: []string{""},
		AppIds: []int32{brand.ID}, CredentialIds: []int64{cred1},
	})
	require.NoError(t, err)
	retired, err := db.On(tdb.Pool).RetireUnusedWebPushCredentials(ctx)
	require.NoError(t, err)
	require.Empty(t, retired, "a subscription still uses v1's key")
	_, err = db.On(tdb.Pool).DeleteDevices(ctx, []int64{device[0].ID})
	require.NoError(t, err)
	retired, err = db.On(tdb.Pool).RetireUnusedWebPushCredentials(ctx)
	require.NoError(t, err)
	require.Len(t, retired, 1)
	require.Equal(t, cred1, retired[0].ID)
	require.NoError(t, reg.Refresh(ctx))
	sub, subLease, _ = reg.Lookup("bulk", brand.ID, "webpush", cred1)
	require.Same(t, b.get("brand-b/webpush/v2/bulk"), sub, "a retired key's subscriptions go with the active one")
	subLease.Release()
	require.True(t, b.get("brand-b/webpush/v1/bulk").closed.Load())
	_ = cred2

	// A disabled app is sent nothing, and says so.
	_, err = store.SetDisabled(ctx, tdb.Pool, "brand-b", true)
	require.NoError(t, err)
	require.NoError(t, reg.Refresh(ctx))
	_, _, why = reg.Lookup("bulk", brand.ID, "apns", 0)
	require.Equal(t, "app brand-b is disabled", why)

	// Stored credentials of the default app win over the environment's.
	_, err = store.Rotate(ctx, apps.DefaultName, apnsInput(t, "KEY3333333"))
	require.NoError(t, err)
	require.NoError(t, reg.Refresh(ctx))
	sender, lease, _ = reg.Lookup("bulk", apps.DefaultID, "apns", 0)
	require.Same(t, b.get("default/apns/v1/bulk"), sender)
	lease.Release()
	_, err = store.Retire(ctx, apps.DefaultName, "apns", 0)
	require.NoError(t, err)
	require.NoError(t, reg.Refresh(ctx))
	sender, lease, _ = reg.Lookup("bulk", apps.DefaultID, "apns", 0)
	require.Same(t, env, sender, "retired, the environment's again")
	lease.Release()
	reg.Close()
	require.False(t, env.closed.Load(), "the environment's clients are the caller's to close")
}

// TestStoredCredentialsAreCiphertext: what the database holds of a
// credential is its public part and a sealed value that holds none of the
// secret, and what the store shows holds none either.
func TestStoredCredentialsAreCiphertext(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tdb := dbtest.New(t)
	store := &apps.Store{Pool: tdb.Pool, Sealer: sealer(t, 6)}
	_, _, err := store.Create(ctx, "brand-c")
	require.NoError(t, err)
	ins := []apps.Input{apnsInput(t, "KEY1234567"), fcmInput(t, "brand-c"), webPushInput(t)}
	secrets := []string{ins[0].APNs.Key, ins[1].FCM.ServiceAccount, ins[2].WebPush.PrivateKey}
	for _, in := range ins {
		require.NoError(t, in.Check())
		_, err := store.Rotate(ctx, "brand-c", in)
		require.NoError(t, err)
	}
	rows, err := db.On(tdb.Pool).LiveCredentials(ctx)
	require.NoError(t, err)
	require.Len(t, rows, 3)
	a, err := store.Get(ctx, tdb.Pool, "brand-c")
	require.NoError(t, err)
	shown, err := json.Marshal(a)
	require.NoError(t, err)
	for _, secret := range secrets {
		// A distinctive part of each secret: its PEM body or the scalar.
		part := secret[len(secret)/3 : len(secret)/3+12]
		for _, r := range rows {
			require.NotContains(t, string(r.Sealed), part)
			require.NotContains(t, string(r.Public), part)
		}
		require.NotContains(t, string(shown), part)
	}
	for _, r := range rows {
		require.NotEmpty(t, r.SealKey)
	}
}
