package api

import (
	"context"
	"crypto/ecdh"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/heraldpush/herald/db"
	"github.com/heraldpush/herald/jobs"
)

func apnsToken() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func webpushSubscription(t testing.TB) map[string]any {
	t.Helper()
	key, err := ecdh.P256().GenerateKey(rand.Reader)
	require.NoError(t, err)
	auth := make([]byte, 16)
	_, _ = rand.Read(auth)
	id := make([]byte, 12)
	_, _ = rand.Read(id)
	return map[string]any{
		"endpoint": "https://push.example.test/webpush/" + hex.EncodeToString(id),
		"keys": map[string]any{
			"p256dh": base64.RawURLEncoding.EncodeToString(key.PublicKey().Bytes()),
			"auth":   base64.RawURLEncoding.EncodeToString(auth),
		},
		"expirationTime": nil,
	}
}

func TestRegisterDeviceEachChannel(t *testing.T) {
	t.Parallel()
	b := setup(t)
	sub := webpushSubscription(t)
	for _, body := range []map[string]any{
		{"user_id": "u_1", "channel": "apns", "token": apnsToken()},
		{"user_id": "u_1", "channel": "fcm", "token": "fcm:" + apnsToken()},
		{"user_id": "u_1", "channel": "webpush", "subscription": sub},
	} {
		status, resp := b.do(t, http.MethodPost, "/v1/devices", body)
		require.Equal(t, http.StatusCreated, status, resp)
		require.Equal(t, "u_1", resp["user_id"])
		require.Equal(t, body["channel"], resp["channel"])
		require.Equal(t, "active", resp["status"])
		require.True(t, strings.HasPrefix(resp["device_id"].(string), "dev_"), resp)
	}

	status, list := b.do(t, http.MethodGet, "/v1/users/u_1/devices", nil)
	require.Equal(t, http.StatusOK, status)
	items := list["items"].([]any)
	require.Len(t, items, 3)
	webpush := items[2].(map[string]any)
	require.Equal(t, sub["endpoint"], webpush["endpoint"])
	require.NotContains(t, webpush, "token")
	require.Equal(t, "active", webpush["status"])
}

func TestRegisterDeviceEnvironment(t *testing.T) {
	t.Parallel()
	b := setup(t)
	token := apnsToken()
	status, resp := b.do(t, http.MethodPost, "/v1/devices", map[string]any{"user_id": "u_env", "channel": "apns", "token": token})
	require.Equal(t, http.StatusCreated, status, resp)
	require.Equal(t, "production", resp["environment"], "production by default")

	// Registering the token again with its right environment changes it.
	status, resp = b.do(t, http.MethodPost, "/v1/devices", map[string]any{"user_id": "u_env", "channel": "apns", "token": token, "environment": "sandbox"})
	require.Equal(t, http.StatusOK, status, resp)
	require.Equal(t, "sandbox", resp["environment"])

	status, resp = b.do(t, http.MethodPost, "/v1/devices/batch", map[string]any{"devices": []map[string]any{
		{"user_id": "u_env", "channel": "apns", "token": apnsToken(), "environment": "sandbox"},
		{"user_id": "u_env", "channel": "fcm", "token": "fcm-env"},
	}})
	require.Equal(t, http.StatusOK, status, resp)

	status, list := b.do(t, http.MethodGet, "/v1/users/u_env/devices", nil)
	require.Equal(t, http.StatusOK, status)
	var envs []string
	for _, item := range list["items"].([]any) {
		envs = append(envs, item.(map[string]any)["environment"].(string))
	}
	require.Equal(t, []string{"sandbox", "sandbox", "production"}, envs)

	for _, tc := range []struct {
		body  map[string]any
		field string
	}{
		{map[string]any{"user_id": "u_env", "channel": "apns", "token": apnsToken(), "environment": "development"}, "environment"},
		{map[string]any{"user_id": "u_env", "channel": "fcm", "token": "fcm-x", "environment": "sandbox"}, "environment"},
	} {
		requireError(t, b.call(t, request{method: http.MethodPost, path: "/v1/devices", body: tc.body}), http.StatusBadRequest, "invalid_field", tc.field)
	}
	rec := b.call(t, request{method: http.MethodPost, path: "/v1/devices/batch", body: map[string]any{"devices": []map[string]any{
		{"user_id": "u_env", "channel": "webpush", "subscription": webpushSubscription(t), "environment": "sandbox"},
	}}})
	requireError(t, rec, http.StatusBadRequest, "invalid_field", "devices[0].environment")
}

func TestReRegisteringMovesAndReactivates(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	token := apnsToken()

	status, first := b.do(t, http.MethodPost, "/v1/devices", map[string]any{"user_id": "alice", "channel": "apns", "token": token})
	require.Equal(t, http.StatusCreated, status)
	id, ok := parseID(devicePrefix, first["device_id"].(string))
	require.True(t, ok)

	// The same token in upper case is the same device.
	status, again := b.do(t, http.MethodPost, "/v1/devices", map[string]any{"user_id": "alice", "channel": "apns", "token": strings.ToUpper(token)})
	require.Equal(t, http.StatusOK, status)
	require.Equal(t, first["device_id"], again["device_id"])

	n, err := b.q.EvictDevice(ctx, db.EvictDeviceParams{ID: id, Reason: ptr("unregistered")})
	require.NoError(t, err)
	require.EqualValues(t, 1, n)

	// Bob registers the evicted token: same device, now his, active again.
	status, moved := b.do(t, http.MethodPost, "/v1/devices", map[string]any{"user_id": "bob", "channel": "apns", "token": token})
	require.Equal(t, http.StatusOK, status)
	require.Equal(t, first["device_id"], moved["device_id"])
	require.Equal(t, "bob", moved["user_id"])
	require.Equal(t, "active", moved["status"])

	dev, err := b.q.GetDevice(ctx, id)
	require.NoError(t, err)
	require.Equal(t, "bob", dev.UserID)
	require.Nil(t, dev.EvictedAt)
	require.Nil(t, dev.EvictedReason)

	_, aliceList := b.do(t, http.MethodGet, "/v1/users/alice/devices", nil)
	require.Empty(t, aliceList["items"])
}

func TestRacingRegistrationsMakeOneDevice(t *testing.T) {
	t.Parallel()
	b := setup(t)
	token := apnsToken()
	const racers = 12
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		statuses = map[int]int{}
		ids      = map[string]bool{}
	)
	for i := range racers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rec := b.call(t, request{method: http.MethodPost, path: "/v1/devices",
				body: map[string]any{"user_id": fmt.Sprintf("racer_%d", i), "channel": "apns", "token": token}})
			m := decodeBody(t, rec)
			mu.Lock()
			defer mu.Unlock()
			statuses[rec.Code]++
			ids[fmt.Sprint(m["device_id"])] = true
		}()
	}
	wg.Wait()
	require.Equal(t, map[int]int{http.StatusCreated: 1, http.StatusOK: racers - 1}, statuses)
	require.Len(t, ids, 1)
	var count int
	require.NoError(t, b.db.Pool.QueryRow(context.Background(), "SELECT count(*) FROM devices").Scan(&count))
	require.Equal(t, 1, count)
}

func TestRegisterDeviceRejectsBadInput(t *testing.T) {
	t.Parallel()
	b := setup(t)
	sub := func(mutate func(s map[string]any)) map[string]any {
		s := webpushSubscription(t)
		mutate(s)
		return s
	}
	keys := func(s map[string]any) map[string]any { return s["keys"].(map[string]any) }
	cases := []struct {
		name  string
		body  any
		code  string
		field string
	}{
		{"malformed json", `{"user_id": "u1",`, "malformed_json", ""},
		{"not json at all", `hello`, "malformed_json", ""},
		{"empty body", ``, "malformed_json", ""},
		{"array body", `[1,2]`, "invalid_type", ""},
		{"trailing data", `{"user_id":"u1","channel":"fcm","token":"abc"} {}`, "malformed_json", ""},
		{"user_id wrong type", map[string]any{"user_id": 42, "channel": "fcm", "token": "abc"}, "invalid_type", "user_id"},
		{"token wrong type", map[string]any{"user_id": "u1", "channel": "fcm", "token": true}, "invalid_type", "token"},
		{"unknown field", map[string]any{"user_id": "u1", "channel": "fcm", "token": "abc", "tokn": "x"}, "unknown_field", "tokn"},
		{"missing user", map[string]any{"channel": "fcm", "token": "abc"}, "invalid_field", "user_id"},
		{"user id with slash", map[string]any{"user_id": "a/b", "channel": "fcm", "token": "abc"}, "invalid_field", "user_id"},
		{"user id too long", map[string]any{"user_id": strings.Repeat("u", 129), "channel": "fcm", "token": "abc"}, "invalid_field", "user_id"},
		{"missing channel", map[string]any{"user_id": "u1", "token": "abc"}, "invalid_field", "channel"},
		{"unknown channel", map[string]any{"user_id": "u1", "channel": "sms", "token": "abc"}, "invalid_field", "channel"},
		{"apns token not hex", map[string]any{"user_id": "u1", "channel": "apns", "token": strings.Repeat("zz", 32)}, "invalid_field", "token"},
		{"apns token too short", map[string]any{"user_id": "u1", "channel": "apns", "token": "abcd"}, "invalid_field", "token"},
		{"apns token odd length", map[string]any{"user_id": "u1", "channel": "apns", "token": apnsToken() + "a"}, "invalid_field", "token"},
		{"apns token missing", map[string]any{"user_id": "u1", "channel": "apns"}, "invalid_field", "token"},
		{"apns with subscription", map[string]any{"user_id": "u1", "channel": "apns", "token": apnsToken(), "subscription": webpushSubscription(t)}, "invalid_field", "subscription"},
		{"fcm token with space", map[string]any{"user_id": "u1", "channel": "fcm", "token": "ab cd"}, "invalid_field", "token"},
		{"fcm token too long", map[string]any{"user_id": "u1", "channel": "fcm", "token": strings.Repeat("a", 1025)}, "invalid_field", "token"},
		{"webpush without subscription", map[string]any{"user_id": "u1", "channel": "webpush"}, "invalid_field", "subscription"},
		{"webpush with token", map[string]any{"user_id": "u1", "channel": "webpush", "token": "abc", "subscription": webpushSubscription(t)}, "invalid_field", "token"},
		{"webpush http endpoint", map[string]any{"user_id": "u1", "channel": "webpush", "subscription": sub(func(s map[string]any) { s["endpoint"] = "http://push.example.test/x" })}, "invalid_field", "subscription.endpoint"},
		{"webpush relative endpoint", map[string]any{"user_id": "u1", "channel": "webpush", "subscription": sub(func(s map[string]any) { s["endpoint"] = "/webpush/x" })}, "invalid_field", "subscription.endpoint"},
		{"webpush endpoint loopback", map[string]any{"user_id": "u1", "channel": "webpush", "subscription": sub(func(s map[string]any) { s["endpoint"] = "https://127.0.0.1:5432/" })}, "invalid_field", "subscription.endpoint"},
		{"webpush endpoint localhost", map[string]any{"user_id": "u1", "channel": "webpush", "subscription": sub(func(s map[string]any) { s["endpoint"] = "https://localhost:8443/x" })}, "invalid_field", "subscription.endpoint"},
		{"webpush endpoint metadata", map[string]any{"user_id": "u1", "channel": "webpush", "subscription": sub(func(s map[string]any) { s["endpoint"] = "https://169.254.169.254/latest/meta-data/" })}, "invalid_field", "subscription.endpoint"},
		{"webpush endpoint private", map[string]any{"user_id": "u1", "channel": "webpush", "subscription": sub(func(s map[string]any) { s["endpoint"] = "https://10.0.0.1/" })}, "invalid_field", "subscription.endpoint"},
		{"webpush endpoint unspecified", map[string]any{"user_id": "u1", "channel": "webpush", "subscription": sub(func(s map[string]any) { s["endpoint"] = "https://0.0.0.0:8443/" })}, "invalid_field", "subscription.endpoint"},
		{"webpush endpoint mapped loopback", map[string]any{"user_id": "u1", "channel": "webpush", "subscription": sub(func(s map[string]any) { s["endpoint"] = "https://[::ffff:127.0.0.1]/" })}, "invalid_field", "subscription.endpoint"},
		{"webpush endpoint unknown host", map[string]any{"user_id": "u1", "channel": "webpush", "subscription": sub(func(s map[string]any) { s["endpoint"] = "https://push.evil.example/x" })}, "invalid_field", "subscription.endpoint"},
		{"webpush endpoint credentials", map[string]any{"user_id": "u1", "channel": "webpush", "subscription": sub(func(s map[string]any) { s["endpoint"] = "https://user:pw@push.example.test/x" })}, "invalid_field", "subscription.endpoint"},
		{"webpush endpoint other port", map[string]any{"user_id": "u1", "channel": "webpush", "subscription": sub(func(s map[string]any) { s["endpoint"] = "https://push.example.test:8443/x" })}, "invalid_field", "subscription.endpoint"},
		{"webpush short p256dh", map[string]any{"user_id": "u1", "channel": "webpush", "subscription": sub(func(s map[string]any) { keys(s)["p256dh"] = "AAAA" })}, "invalid_field", "subscription.keys.p256dh"},
		{"webpush p256dh off the curve", map[string]any{"user_id": "u1", "channel": "webpush", "subscription": sub(func(s map[string]any) {
			keys(s)["p256dh"] = base64.RawURLEncoding.EncodeToString(append([]byte{4}, make([]byte, 64)...))
		})}, "invalid_field", "subscription.keys.p256dh"},
		{"webpush p256dh not base64", map[string]any{"user_id": "u1", "channel": "webpush", "subscription": sub(func(s map[string]any) { keys(s)["p256dh"] = "!!!!" })}, "invalid_field", "subscription.keys.p256dh"},
		{"webpush auth wrong size", map[string]any{"user_id": "u1", "channel": "webpush", "subscription": sub(func(s map[string]any) { keys(s)["auth"] = "AAAA" })}, "invalid_field", "subscription.keys.auth"},
		{"webpush auth missing", map[string]any{"user_id": "u1", "channel": "webpush", "subscription": sub(func(s map[string]any) { delete(keys(s), "auth") })}, "invalid_field", "subscription.keys.auth"},
		{"webpush keys wrong type", map[string]any{"user_id": "u1", "channel": "webpush", "subscription": sub(func(s map[string]any) { s["keys"] = "x" })}, "invalid_type", "subscription.keys"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rec := b.call(t, request{method: http.MethodPost, path: "/v1/devices", body: tc.body})
			requireError(t, rec, http.StatusBadRequest, tc.code, tc.field)
		})
	}

	t.Run("not json content type", func(t *testing.T) {
		rec := b.call(t, request{method: http.MethodPost, path: "/v1/devices", body: `{}`,
			header: map[string]string{"Content-Type": "text/plain"}})
		requireError(t, rec, http.StatusUnsupportedMediaType, "unsupported_media_type", "")
	})
	t.Run("too large", func(t *testing.T) {
		rec := b.call(t, request{method: http.MethodPost, path: "/v1/devices",
			body: `{"user_id":"u1","channel":"fcm","token":"` + strings.Repeat("a", smallBodyLimit) + `"}`})
		requireError(t, rec, http.StatusRequestEntityTooLarge, "too_large", "")
	})

	// Nothing of the above was stored.
	var count int
	require.NoError(t, b.db.Pool.QueryRow(context.Background(), "SELECT count(*) FROM devices").Scan(&count))
	require.Zero(t, count)
}

func batchOf(n int, user func(i int) string) []map[string]any {
	devices := make([]map[string]any, n)
	for i := range devices {
		switch i % 3 {
		case 0:
			devices[i] = map[string]any{"user_id": user(i), "channel": "apns", "token": fmt.Sprintf("%064x", i)}
		case 1:
			devices[i] = map[string]any{"user_id": user(i), "channel": "fcm", "token": fmt.Sprintf("fcm-token-%d", i)}
		default:
			devices[i] = map[string]any{"user_id": user(i), "channel": "webpush", "subscription": map[string]any{
				"endpoint": fmt.Sprintf("https://push.example.test/webpush/%d", i),
				"keys":     map[string]any{"p256dh": fixedP256dh, "auth": "AAAAAAAAAAAAAAAAAAAAAA"},
			}}
		}
	}
	return devices
}

// fixedP256dh is a valid P-256 public key, shared by batch fixtures so that
// building 10,000 devices costs no key generation.
const fixedP256dh = "BFaogAdJrMFroK-NgG0tTyt4CLnbF53M5Zi04iYkVWy2aq4ODaPqXqNSVKGmmCJTa3WGtgXY5L7UcAaAE7STrMw"

func TestRegisterDevicesBatch(t *testing.T) {
	t.Parallel()
	b := setup(t)
	devices := batchOf(maxBatchDevices, func(i int) string { return fmt.Sprintf("user_%d", i/3) })

	status, resp := b.do(t, http.MethodPost, "/v1/devices/batch", map[string]any{"devices": devices})
	require.Equal(t, http.StatusOK, status, resp)
	require.EqualValues(t, maxBatchDevices, resp["created"])
	require.EqualValues(t, 0, resp["updated"])

	// Again, with every device moved to another user: all updates.
	moved := batchOf(maxBatchDevices, func(i int) string { return fmt.Sprintf("other_%d", i/2) })
	status, resp = b.do(t, http.MethodPost, "/v1/devices/batch", map[string]any{"devices": moved})
	require.Equal(t, http.StatusOK, status, resp)
	require.EqualValues(t, 0, resp["created"])
	require.EqualValues(t, maxBatchDevices, resp["updated"])

	_, list := b.do(t, http.MethodGet, "/v1/users/other_0/devices", nil)
	require.Len(t, list["items"], 2)
	_, list = b.do(t, http.MethodGet, "/v1/users/user_0/devices", nil)
	require.Empty(t, list["items"])
}

func TestRegisterDevicesBatchDuplicateTokenCountsOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	token := apnsToken()
	status, resp := b.do(t, http.MethodPost, "/v1/devices/batch", map[string]any{"devices": []map[string]any{
		{"user_id": "a", "channel": "apns", "token": token},
		{"user_id": "b", "channel": "apns", "token": token},
	}})
	require.Equal(t, http.StatusOK, status, resp)
	require.EqualValues(t, 1, resp["created"])
	_, list := b.do(t, http.MethodGet, "/v1/users/b/devices", nil)
	require.Len(t, list["items"], 1, "the later registration wins")
}

func TestRegisterDevicesBatchRejectsBadInput(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tooMany := batchOf(maxBatchDevices+1, func(i int) string { return "u" })
	rec := b.call(t, request{method: http.MethodPost, path: "/v1/devices/batch", body: map[string]any{"devices": tooMany}})
	requireError(t, rec, http.StatusBadRequest, "invalid_field", "devices")

	rec = b.call(t, request{method: http.MethodPost, path: "/v1/devices/batch", body: map[string]any{"devices": []any{}}})
	requireError(t, rec, http.StatusBadRequest, "invalid_field", "devices")

	rec = b.call(t, request{method: http.MethodPost, path: "/v1/devices/batch", body: `{"devices": {}}`})
	requireError(t, rec, http.StatusBadRequest, "invalid_type", "devices")

	// One bad device among good ones: 400 naming it, and nothing stored.
	devices := batchOf(50, func(i int) string { return fmt.Sprintf("u%d", i) })
	devices[37]["token"] = "not hex at all"
	devices[37]["channel"] = "apns"
	rec = b.call(t, request{method: http.MethodPost, path: "/v1/devices/batch", body: map[string]any{"devices": devices}})
	requireError(t, rec, http.StatusBadRequest, "invalid_field", "devices[37].token")

	var count int
	require.NoError(t, b.db.Pool.QueryRow(context.Background(), "SELECT count(*) FROM devices").Scan(&count))
	require.Zero(t, count)
}

func TestListDevicesUnknownUser(t *testing.T) {
	t.Parallel()
	b := setup(t)
	requireError(t, b.call(t, request{method: http.MethodGet, path: "/v1/users/nobody/devices"}), http.StatusNotFound, "not_found", "")
	requireError(t, b.call(t, request{method: http.MethodGet, path: "/v1/users/bad%20id/devices"}), http.StatusNotFound, "not_found", "")
}

func TestDeleteDevice(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	status, resp := b.do(t, http.MethodPost, "/v1/devices", map[string]any{"user_id": "u1", "channel": "fcm", "token": "tok-1"})
	require.Equal(t, http.StatusCreated, status)
	deviceID := resp["device_id"].(string)
	id, _ := parseID(devicePrefix, deviceID)

	// A message with a pending delivery to this device and one to another.
	var messageID int64
	require.NoError(t, b.db.Pool.QueryRow(ctx, `
		WITH p AS (INSERT INTO payloads (content) VALUES ('{}') RETURNING id)
		INSERT INTO messages (priority, dispatch_at, expires_at, payload_id, audience, device_count, pending_count)
		SELECT 'bulk', now() + interval '1 hour', now() + interval '2 hours', p.id, '{}', 2, 2 FROM p
		RETURNING id`).Scan(&messageID))
	_, err := b.db.Pool.Exec(ctx, `INSERT INTO deliveries (message_id, device_id, user_id, channel, chunk, due_at)
		VALUES ($1, $2, 'u1', 'fcm', 0, now()), ($1, $2 + 1000, 'u2', 'fcm', 0, now())`, messageID, id)
	require.NoError(t, err)

	rec := b.call(t, request{method: http.MethodDelete, path: "/v1/devices/" + deviceID})
	require.Equal(t, http.StatusNoContent, rec.Code, rec.Body.String())
	require.Zero(t, rec.Body.Len())

	_, list := b.do(t, http.MethodGet, "/v1/users/u1/devices", nil)
	require.Empty(t, list["items"])

	var pending, cancelled int
	require.NoError(t, b.db.Pool.QueryRow(ctx, "SELECT pending_count, cancelled_count FROM messages WHERE id = $1", messageID).Scan(&pending, &cancelled))
	require.Equal(t, 1, pending)
	require.Equal(t, 1, cancelled)
	var st string
	require.NoError(t, b.db.Pool.QueryRow(ctx, "SELECT status FROM ledger WHERE device_id = $1", id).Scan(&st))
	require.Equal(t, "cancelled", st)

	requireError(t, b.call(t, request{method: http.MethodDelete, path: "/v1/devices/" + deviceID}), http.StatusNotFound, "not_found", "")
	for _, bad := range []string{"dev_0", "dev_x", "garbage", "dev_00" + deviceID[4:], "dev_99999999999999999999"} {
		requireError(t, b.call(t, request{method: http.MethodDelete, path: "/v1/devices/" + bad}), http.StatusNotFound, "not_found", "")
	}
}

func ptr[T any](v T) *T { return &v }

func TestFirstOverLimit(t *testing.T) {
	t.Parallel()
	dev := func(user, token string) device { return device{UserID: user, Channel: jobs.ChannelFCM, Token: token} }
	key := func(token string) db.Key { return db.Key{Channel: jobs.ChannelFCM, Token: token} }
	// The installation "i" is the device of token 1: a registration under
	// it is that device, whatever its token.
	same := func(d device) db.Key {
		if d.InstallationID == "i" {
			return key("1")
		}
		return key(d.Token)
	}
	refreshed := dev("a", "8")
	refreshed.InstallationID = "i"
	tests := []struct {
		name   string
		regs   []device
		active map[string]int
		owner  map[db.Key]string
		want   int
	}{
		{"under the limit", []device{dev("a", "1"), dev("a", "2")}, nil, nil, -1},
		{"the third new one", []device{dev("a", "1"), dev("a", "2"), dev("a", "3")}, nil, nil, 2},
		{"one the user has adds nothing", []device{dev("a", "1")}, map[string]int{"a": 2},
			map[db.Key]string{key("1"): "a"}, -1},
		{"a new token of an installation the user has adds nothing", []device{refreshed}, map[string]int{"a": 2},
			map[db.Key]string{key("1"): "a"}, -1},
		{"the same one twice counts once", []device{dev("a", "1"), dev("a", "1"), dev("a", "2")}, nil, nil, -1},
		{"another user's counts for the new user", []device{dev("a", "9")}, map[string]int{"a": 2, "b": 1},
			map[db.Key]string{key("9"): "b"}, 0},
		{"moving one away makes room", []device{dev("b", "1"), dev("a", "3")}, map[string]int{"a": 2},
			map[db.Key]string{key("1"): "a"}, -1},
		{"already over: its own still pass, a new one not", []device{dev("a", "1"), dev("a", "7")}, map[string]int{"a": 5},
			map[db.Key]string{key("1"): "a"}, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			active, owner := map[string]int{}, map[db.Key]string{}
			maps.Copy(active, tt.active)
			maps.Copy(owner, tt.owner)
			require.Equal(t, tt.want, firstOverLimit(tt.regs, same, active, owner, 2))
		})
	}
}

func TestDevicesPerUserLimit(t *testing.T) {
	t.Parallel()
	b := setupWith(t, dbtestNew(t), Config{MaxDevicesPerUser: 2})
	ctx := context.Background()
	fcm := func(user, token string) map[string]any {
		return map[string]any{"user_id": user, "channel": "fcm", "token": token}
	}
	register := func(body map[string]any) *httptest.ResponseRecorder {
		return b.call(t, request{method: http.MethodPost, path: "/v1/devices", body: body})
	}
	require.Equal(t, http.StatusCreated, register(fcm("ann", "t1")).Code)
	require.Equal(t, http.StatusCreated, register(fcm("ann", "t2")).Code)
	rec := register(fcm("ann", "t3"))
	requireError(t, rec, http.StatusConflict, "too_many_devices", "")
	require.Contains(t, rec.Body.String(), "at most 2 active devices")
	require.Equal(t, http.StatusOK, register(fcm("ann", "t1")).Code, "a device the user has is always taken again")

	// An evicted device no longer counts, and coming back it counts again.
	_, list := b.do(t, http.MethodGet, "/v1/users/ann/devices", nil)
	id, ok := parseID(devicePrefix, list["items"].([]any)[0].(map[string]any)["device_id"].(string))
	require.True(t, ok)
	_, err := b.q.EvictDevice(ctx, db.EvictDeviceParams{ID: id, Reason: ptr("unregistered")})
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, register(fcm("ann", "t3")).Code)
	requireError(t, register(fcm("ann", "t1")), http.StatusConflict, "too_many_devices", "")

	// A batch is refused whole, naming the first registration over the
	// limit; registrations before it may move devices and make room.
	batch := []map[string]any{fcm("bob", "t2"), fcm("ann", "t4"), fcm("cy", "c1"), fcm("ann", "t5")}
	rec = b.call(t, request{method: http.MethodPost, path: "/v1/devices/batch", body: map[string]any{"devices": batch}})
	requireError(t, rec, http.StatusConflict, "too_many_devices", "devices[3]")
	exists, err := b.q.UserExists(ctx, "cy")
	require.NoError(t, err)
	require.False(t, exists, "nothing of a refused batch is kept")
	status, res := b.do(t, http.MethodPost, "/v1/devices/batch", map[string]any{"devices": batch[:3]})
	require.Equal(t, http.StatusOK, status)
	require.Equal(t, map[string]any{"created": 2.0, "updated": 1.0}, res)
	counts, err := b.q.ActiveDeviceCounts(ctx, []string{"ann", "bob", "cy"})
	require.NoError(t, err)
	require.ElementsMatch(t, []db.ActiveDeviceCountsRow{{UserID: "ann", Devices: 2}, {UserID: "bob", Devices: 1}, {UserID: "cy", Devices: 1}}, counts)
}

func TestRacingRegistrationsKeepTheLimit(t *testing.T) {
	t.Parallel()
	b := setupWith(t, dbtestNew(t), Config{MaxDevicesPerUser: 3})
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		statuses = map[int]int{}
	)
	for i := range 10 {
		wg.Go(func() {
			body := map[string]any{"devices": []map[string]any{{"user_id": "dora", "channel": "fcm", "token": fmt.Sprintf("race-%d", i)}}}
			path := "/v1/devices/batch"
			if i%2 == 0 {
				body, path = body["devices"].([]map[string]any)[0], "/v1/devices"
			}
			rec := b.call(t, request{method: http.MethodPost, path: path, body: body})
			mu.Lock()
			defer mu.Unlock()
			statuses[rec.Code]++
		})
	}
	wg.Wait()
	require.Equal(t, 7, statuses[http.StatusConflict], "%v", statuses)
	counts, err := b.q.ActiveDeviceCounts(context.Background(), []string{"dora"})
	require.NoError(t, err)
	require.Equal(t, []db.ActiveDeviceCountsRow{{UserID: "dora", Devices: 3}}, counts)
}

func TestListDevicesInPages(t *testing.T) {
	t.Parallel()
	b := setup(t)
	status, _ := b.do(t, http.MethodPost, "/v1/devices/batch", map[string]any{"devices": batchOf(7, func(int) string { return "pat" })})
	require.Equal(t, http.StatusOK, status)
	var ids []string
	cursor := ""
	for pages := 1; ; pages++ {
		path := "/v1/users/pat/devices?limit=3"
		if cursor != "" {
			path += "&cursor=" + cursor
		}
		status, page := b.do(t, http.MethodGet, path, nil)
		require.Equal(t, http.StatusOK, status)
		require.Equal(t, "pat", page["user_id"])
		for _, it := range page["items"].([]any) {
			ids = append(ids, it.(map[string]any)["device_id"].(string))
		}
		next, _ := page["next_cursor"].(string)
		if next == "" {
			require.Equal(t, 3, pages)
			break
		}
		cursor = next
	}
	require.Len(t, ids, 7)
	for i := 1; i < len(ids); i++ {
		a, _ := parseID(devicePrefix, ids[i-1])
		c, _ := parseID(devicePrefix, ids[i])
		require.Less(t, a, c, "in registration order, each once")
	}
	requireError(t, b.call(t, request{method: http.MethodGet, path: "/v1/users/pat/devices?limit=0"}), http.StatusBadRequest, "invalid_field", "limit")
	requireError(t, b.call(t, request{method: http.MethodGet, path: "/v1/users/pat/devices?cursor=bogus"}), http.StatusBadRequest, "invalid_cursor", "cursor")
}
