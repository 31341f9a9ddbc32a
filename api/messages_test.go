package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"
	"github.com/stretchr/testify/require"

	"github.com/heraldpush/herald/db"
	"github.com/heraldpush/herald/jobs"
)

// population registers devices for users u0..u(n-1), each with perUser
// devices rotating through the three channels.
func (b *bundle) population(t testing.TB, prefix string, users, perUser int) {
	t.Helper()
	var devices []map[string]any
	for u := range users {
		for d := range perUser {
			user := fmt.Sprintf("%s%d", prefix, u)
			switch (u + d) % 3 {
			case 0:
				devices = append(devices, map[string]any{"user_id": user, "channel": "apns", "token": fmt.Sprintf("%08x%056x", len(prefix), u*10+d)})
			case 1:
				devices = append(devices, map[string]any{"user_id": user, "channel": "fcm", "token": fmt.Sprintf("fcm-%s-%d-%d", prefix, u, d)})
			default:
				devices = append(devices, map[string]any{"user_id": user, "channel": "webpush", "subscription": map[string]any{
					"endpoint": fmt.Sprintf("https://push.example.test/webpush/%s-%d-%d", prefix, u, d),
					"keys":     map[string]any{"p256dh": fixedP256dh, "auth": "AAAAAAAAAAAAAAAAAAAAAA"},
				}})
			}
		}
	}
	for start := 0; start < len(devices); start += maxBatchDevices {
		status, resp := b.do(t, http.MethodPost, "/v1/devices/batch", map[string]any{"devices": devices[start:min(start+maxBatchDevices, len(devices))]})
		require.Equal(t, http.StatusOK, status, resp)
	}
}

func future(d time.Duration) string { return time.Now().Add(d).UTC().Format(time.RFC3339Nano) }

func messageBody(audience map[string]any) map[string]any {
	return map[string]any{
		"dispatch_at": future(time.Hour),
		"audience":    audience,
		"payload":     map[string]any{"title": "Standup", "body": "in five minutes", "data": map[string]any{"room": "blue"}},
	}
}

type jobRow struct {
	State       string
	Queue       string
	ScheduledAt time.Time
	Args        jobs.FanOutArgs
}

func (b *bundle) chunkJobs(t testing.TB, messageID string) []jobRow {
	t.Helper()
	rows, err := b.db.Pool.Query(context.Background(), `
		SELECT j.state, j.queue, j.scheduled_at, j.kind, j.args
		FROM river_job j JOIN message_chunks c ON c.job_id = j.id
		WHERE c.message_id = $1 ORDER BY c.chunk`, strings.TrimPrefix(messageID, "msg_"))
	require.NoError(t, err)
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (jobRow, error) {
		var j jobRow
		var raw []byte
		var kind string
		if err := r.Scan(&j.State, &j.Queue, &j.ScheduledAt, &kind, &raw); err != nil {
			return j, err
		}
		var err error
		j.Args, err = jobs.ChunkArgs(kind, raw)
		return j, err
	})
	require.NoError(t, err)
	return out
}

func TestCreateMessageToUsers(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.population(t, "u", 4, 2)
	// u3's first device is evicted: later messages skip it.
	_, list := b.do(t, http.MethodGet, "/v1/users/u3/devices", nil)
	evicted, _ := parseID(devicePrefix, list["items"].([]any)[0].(map[string]any)["device_id"].(string))
	_, err := b.q.EvictDevice(context.Background(), db.EvictDeviceParams{ID: evicted, Reason: ptr("unregistered")})
	require.NoError(t, err)

	dispatchAt := time.Now().Add(time.Hour).Truncate(time.Millisecond)
	body := messageBody(map[string]any{"type": "users", "ids": []string{"u0", "u1", "u3", "u3", "nobody"}})
	body["dispatch_at"] = dispatchAt.In(time.FixedZone("IST", 5*3600+1800)).Format(time.RFC3339Nano)
	rec := b.call(t, request{method: http.MethodPost, path: "/v1/messages", body: body})
	require.Equal(t, http.StatusAccepted, rec.Code, rec.Body.String())
	resp := decodeBody(t, rec)
	id := resp["message_id"].(string)
	require.Equal(t, "/v1/messages/"+id, rec.Header().Get("Location"))
	require.Equal(t, "scheduled", resp["state"])
	require.Equal(t, dispatchAt.UTC().Format(time.RFC3339Nano), resp["dispatch_at"], "echoed in UTC")
	require.Equal(t, dispatchAt.Add(time.Hour).UTC().Format(time.RFC3339Nano), resp["expires_at"], "default lifetime is an hour")
	require.Equal(t, "bulk", resp["priority"])
	require.EqualValues(t, 3, resp["recipient_count"])
	require.EqualValues(t, 5, resp["device_count"])
	require.EqualValues(t, 1, resp["chunk_count"])

	jobsOf := b.chunkJobs(t, id)
	require.Len(t, jobsOf, 1)
	require.Equal(t, "bulk", jobsOf[0].Queue)
	require.Equal(t, "scheduled", jobsOf[0].State, "an hour ahead, the chunk waits for the promoter")
	require.True(t, dispatchAt.Equal(jobsOf[0].ScheduledAt), "%s != %s", dispatchAt, jobsOf[0].ScheduledAt)
	// The chunk, as its worker will read it: the five active devices.
	targets := chunkTargets(t, b.db.Pool, jobsOf[0].Args)
	require.Len(t, targets, 5)
	for _, tg := range targets {
		require.NotEqual(t, evicted, tg.DeviceID)
		require.NotEmpty(t, tg.Token)
		if tg.Channel == "webpush" {
			require.NotEmpty(t, tg.P256dh)
			require.NotEmpty(t, tg.Auth)
		}
	}

	status, st := b.do(t, http.MethodGet, "/v1/messages/"+id, nil)
	require.Equal(t, http.StatusOK, status)
	require.Equal(t, counted(map[string]any{"total": 5.0, "accepted": 0.0, "failed": 0.0, "expired": 0.0, "cancelled": 0.0, "pending": 5.0}), st["deliveries"])
	require.Nil(t, st["skew_ms"])
	require.Nil(t, st["started_at"])
	require.Nil(t, st["settled_at"])
}

// chunkTargets reads a chunk's pending deliveries, with their devices, as
// its worker does.
func chunkTargets(t *testing.T, q db.DBTX, a jobs.FanOutArgs) []db.ChunkPendingRow {
	t.Helper()
	targets, err := db.On(q).ChunkPendingOf(context.Background(), db.Chunk{ChunkPendingParams: db.ChunkPendingParams{
		MessageID: a.MessageID, FirstDevice: a.FirstDevice, LastDevice: a.LastDevice, Chunk: int32(a.Chunk)}, Snapshot: a.Snapshot})
	require.NoError(t, err)
	return targets
}

func TestCreateMessageToSegmentInChunks(t *testing.T) {
	t.Parallel()
	tdb := dbtestNew(t)
	b := setupWith(t, tdb, Config{ChunkSize: 7})
	b.population(t, "s", 20, 2)
	status, _ := b.do(t, http.MethodPut, "/v1/segments/seg", map[string]any{"name": "all"})
	require.Equal(t, http.StatusCreated, status)
	status, _ = b.do(t, http.MethodPost, "/v1/segments/seg/members", map[string]any{"user_ids": userIDs("s", 20)})
	require.Equal(t, http.StatusOK, status)

	body := messageBody(map[string]any{"type": "segment", "id": "seg"})
	body["priority"] = "urgent"
	body["dispatch_at"] = future(-time.Minute) // in the past: dispatched at once
	status, resp := b.do(t, http.MethodPost, "/v1/messages", body)
	require.Equal(t, http.StatusAccepted, status, resp)
	require.EqualValues(t, 20, resp["recipient_count"])
	require.EqualValues(t, 40, resp["device_count"])
	require.EqualValues(t, 6, resp["chunk_count"])

	seen := map[int64]bool{}
	for i, j := range b.chunkJobs(t, resp["message_id"].(string)) {
		require.Equal(t, "urgent", j.Queue)
		require.Equal(t, "available", j.State, "a chunk already due is available at once")
		require.Equal(t, i, j.Args.Chunk)
		targets := chunkTargets(t, tdb.Pool, j.Args)
		require.LessOrEqual(t, len(targets), 7)
		for _, tg := range targets {
			require.False(t, seen[tg.DeviceID], "device %d in two chunks", tg.DeviceID)
			seen[tg.DeviceID] = true
		}
	}
	require.Len(t, seen, 40)
	var ledger int
	require.NoError(t, tdb.Pool.QueryRow(context.Background(),
		"SELECT count(*) FROM ledger WHERE message_id = $1 AND status = 'pending'",
		strings.TrimPrefix(resp["message_id"].(string), "msg_")).Scan(&ledger))
	require.Equal(t, 40, ledger)
}

func TestCreateMessageWithNoDevices(t *testing.T) {
	t.Parallel()
	b := setup(t)
	status, _ := b.do(t, http.MethodPut, "/v1/segments/empty", map[string]any{"name": "nobody"})
	require.Equal(t, http.StatusCreated, status)
	for _, audience := range []map[string]any{
		{"type": "segment", "id": "empty"},
		{"type": "users", "ids": []string{"ghost"}},
	} {
		status, resp := b.do(t, http.MethodPost, "/v1/messages", messageBody(audience))
		require.Equal(t, http.StatusAccepted, status, resp)
		require.EqualValues(t, 0, resp["recipient_count"])
		require.EqualValues(t, 0, resp["device_count"])
		require.EqualValues(t, 0, resp["chunk_count"])
		require.Equal(t, "dispatched", resp["state"], "nothing to wait for")
	}
}

func TestCreateMessageRejectsBadInput(t *testing.T) {
	t.Parallel()
	b := setup(t)
	status, _ := b.do(t, http.MethodPut, "/v1/segments/seg", map[string]any{"name": "s"})
	require.Equal(t, http.StatusCreated, status)
	with := func(mutate func(m map[string]any)) map[string]any {
		m := messageBody(map[string]any{"type": "segment", "id": "seg"})
		mutate(m)
		return m
	}
	cases := []struct {
		name   string
		body   any
		status int
		code   string
		field  string
	}{
		{"dispatch_at without offset", with(func(m map[string]any) { m["dispatch_at"] = "2026-09-04T09:00:00" }), 400, "invalid_field", "dispatch_at"},
		{"dispatch_at not a time", with(func(m map[string]any) { m["dispatch_at"] = "tomorrow" }), 400, "invalid_field", "dispatch_at"},
		{"dispatch_at a number", with(func(m map[string]any) { m["dispatch_at"] = 1700000000 }), 400, "invalid_type", "dispatch_at"},
		{"expires_at without offset", with(func(m map[string]any) { m["expires_at"] = "2026-09-04T09:05:00" }), 400, "invalid_field", "expires_at"},
		{"expires before dispatch", with(func(m map[string]any) { m["expires_at"] = future(30 * time.Minute) }), 400, "invalid_field", "expires_at"},
		{"expires in the past", with(func(m map[string]any) {
			m["dispatch_at"] = future(-2 * time.Hour)
			m["expires_at"] = future(-time.Hour)
		}), 400, "invalid_field", "expires_at"},
		{"default expiry in the past", with(func(m map[string]any) { m["dispatch_at"] = future(-2 * time.Hour) }), 400, "invalid_field", "expires_at"},
		{"bad priority", with(func(m map[string]any) { m["priority"] = "asap" }), 400, "invalid_field", "priority"},
		{"no audience", with(func(m map[string]any) { delete(m, "audience") }), 400, "invalid_field", "audience"},
		{"audience type", with(func(m map[string]any) { m["audience"] = map[string]any{"type": "everyone"} }), 400, "invalid_field", "audience.type"},
		{"unknown segment", with(func(m map[string]any) { m["audience"] = map[string]any{"type": "segment", "id": "nope"} }), 400, "invalid_field", "audience.id"},
		{"segment with ids", with(func(m map[string]any) {
			m["audience"] = map[string]any{"type": "segment", "id": "seg", "ids": []string{"a"}}
		}), 400, "invalid_field", "audience.ids"},
		{"users without ids", with(func(m map[string]any) { m["audience"] = map[string]any{"type": "users"} }), 400, "invalid_field", "audience.ids"},
		{"too many users", with(func(m map[string]any) {
			m["audience"] = map[string]any{"type": "users", "ids": userIDs("u", jobs.MaxAudienceUsers+1)}
		}), 400, "invalid_field", "audience.ids"},
		{"bad user id", with(func(m map[string]any) {
			m["audience"] = map[string]any{"type": "users", "ids": []string{"ok", "no way"}}
		}), 400, "invalid_field", "audience.ids[1]"},
		{"no payload", with(func(m map[string]any) { delete(m, "payload") }), 400, "invalid_field", "payload"},
		{"empty payload", with(func(m map[string]any) { m["payload"] = map[string]any{} }), 400, "invalid_field", "payload"},
		{"data not strings", with(func(m map[string]any) { m["payload"] = map[string]any{"title": "t", "data": map[string]any{"n": 1}} }), 400, "invalid_type", ""},
		{"reserved data key", with(func(m map[string]any) {
			m["payload"] = map[string]any{"title": "t", "data": map[string]any{"herald_message_id": "x"}}
		}), 400, "invalid_field", "payload.data.herald_message_id"},
		{"receipt key in data", with(func(m map[string]any) {
			m["payload"] = map[string]any{"title": "t", "data": map[string]any{"herald_receipt": "x"}}
		}), 400, "invalid_field", "payload.data.herald_receipt"},
		{"payload too large", with(func(m map[string]any) { m["payload"] = map[string]any{"title": "t", "body": strings.Repeat("x", 4000)} }), 413, "payload_too_large", "payload"},
		{"localization key not a locale", with(func(m map[string]any) {
			m["payload"] = map[string]any{"title": "t", "localizations": map[string]any{"german": map[string]any{"title": "Hallo"}}}
		}), 400, "invalid_field", "payload.localizations.german"},
		{"localization key twice", with(func(m map[string]any) {
			m["payload"] = map[string]any{"title": "t", "localizations": map[string]any{
				"pt-BR": map[string]any{"title": "Olá"}, "pt-br": map[string]any{"title": "Oi"}}}
		}), 400, "invalid_field", "payload.localizations.pt-br"},
		{"empty localization", with(func(m map[string]any) {
			m["payload"] = map[string]any{"title": "t", "localizations": map[string]any{"de": map[string]any{}}}
		}), 400, "invalid_field", "payload.localizations.de"},
		{"localization unknown field", with(func(m map[string]any) {
			m["payload"] = map[string]any{"title": "t", "localizations": map[string]any{"de": map[string]any{"titel": "Hallo"}}}
		}), 400, "unknown_field", "titel"},
		{"localization too large", with(func(m map[string]any) {
			m["payload"] = map[string]any{"title": "t", "localizations": map[string]any{
				"de": map[string]any{"title": "Hallo"}, "fr": map[string]any{"body": strings.Repeat("x", 4000)}}}
		}), 413, "payload_too_large", "payload.localizations.fr"},
		{"unknown field", with(func(m map[string]any) { m["dispatchAt"] = future(time.Hour) }), 400, "unknown_field", "dispatchAt"},
		{"malformed", `{"audience": {`, 400, "malformed_json", ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rec := b.call(t, request{method: http.MethodPost, path: "/v1/messages", body: tc.body})
			requireError(t, rec, tc.status, tc.code, tc.field)
		})
	}
	rec := b.call(t, request{method: http.MethodPost, path: "/v1/messages", body: "{}", header: map[string]string{"Content-Type": "text/plain"}})
	requireError(t, rec, http.StatusUnsupportedMediaType, "unsupported_media_type", "")

	var messages int
	require.NoError(t, b.db.Pool.QueryRow(context.Background(), "SELECT count(*) FROM messages").Scan(&messages))
	require.Zero(t, messages, "nothing was scheduled")
}

func TestIdempotencyKey(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.population(t, "i", 3, 1)
	body := messageBody(map[string]any{"type": "users", "ids": []string{"i0", "i1", "i2"}})
	withKey := func(key string, body any) request {
		return request{method: http.MethodPost, path: "/v1/messages", body: body, header: map[string]string{"Idempotency-Key": key}}
	}

	first := b.call(t, withKey("k-1", body))
	require.Equal(t, http.StatusAccepted, first.Code, first.Body.String())
	again := b.call(t, withKey("k-1", body))
	require.Equal(t, http.StatusAccepted, again.Code)
	require.JSONEq(t, first.Body.String(), again.Body.String())
	require.Equal(t, first.Header().Get("Location"), again.Header().Get("Location"))

	// The same request with keys in another order is the same request.
	raw, err := json.Marshal(body)
	require.NoError(t, err)
	var reordered map[string]any
	require.NoError(t, json.Unmarshal(raw, &reordered))
	spaced := b.call(t, withKey("k-1", " "+string(raw)+"\n"))
	require.Equal(t, http.StatusAccepted, spaced.Code, spaced.Body.String())
	require.JSONEq(t, first.Body.String(), spaced.Body.String())

	other := messageBody(map[string]any{"type": "users", "ids": []string{"i0"}})
	requireError(t, b.call(t, withKey("k-1", other)), http.StatusConflict, "idempotency_key_reused", "")

	// Another key is another message.
	second := b.call(t, withKey("k-2", body))
	require.Equal(t, http.StatusAccepted, second.Code)
	require.NotEqual(t, decodeBody(t, first)["message_id"], decodeBody(t, second)["message_id"])

	var messages int
	require.NoError(t, b.db.Pool.QueryRow(context.Background(), "SELECT count(*) FROM messages").Scan(&messages))
	require.Equal(t, 2, messages)
}

func TestIdempotencyKeyConcurrentRetries(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.population(t, "c", 50, 2)
	body := messageBody(map[string]any{"type": "users", "ids": userIDs("c", 50)})
	const retries = 10
	var (
		wg  sync.WaitGroup
		mu  sync.Mutex
		ids = map[string]int{}
	)
	for range retries {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rec := b.call(t, request{method: http.MethodPost, path: "/v1/messages", body: body, header: map[string]string{"Idempotency-Key": "same"}})
			if !assertStatus(t, rec.Code, http.StatusAccepted, rec.Body.String()) {
				return
			}
			m := decodeBody(t, rec)
			mu.Lock()
			ids[m["message_id"].(string)]++
			mu.Unlock()
		}()
	}
	wg.Wait()
	require.Len(t, ids, 1, "every retry gets the one message")
	var messages, ledger, chunks int
	ctx := context.Background()
	require.NoError(t, b.db.Pool.QueryRow(ctx, "SELECT count(*) FROM messages").Scan(&messages))
	require.NoError(t, b.db.Pool.QueryRow(ctx, "SELECT count(*) FROM ledger").Scan(&ledger))
	require.NoError(t, b.db.Pool.QueryRow(ctx, "SELECT count(*) FROM river_job").Scan(&chunks))
	require.Equal(t, 1, messages)
	require.Equal(t, 100, ledger)
	require.Equal(t, 2, chunks, "a first chunk of 50 devices, and the rest")
}

func assertStatus(t *testing.T, got, want int, body string) bool {
	t.Helper()
	if got != want {
		t.Errorf("status %d, want %d: %s", got, want, body)
		return false
	}
	return true
}

// failingRiver stands in for nothing but the failure: it lets the ledger be
// written and then fails the chunk insert, as a lost connection would.
type failingRiver struct{ riverClient }

func (failingRiver) InsertManyTx(context.Context, pgx.Tx, []river.InsertManyParams) ([]*rivertype.JobInsertResult, error) {
	return nil, errors.New("injected failure after the ledger insert")
}

func TestCreateMessageRollsBackOnFailure(t *testing.T) {
	t.Parallel()
	tdb := dbtestNew(t)
	b := setupWith(t, tdb, Config{River: failingRiver{insertOnlyRiver(t, tdb)}})
	b.population(t, "r", 5, 2)

	rec := b.call(t, request{method: http.MethodPost, path: "/v1/messages",
		body:   messageBody(map[string]any{"type": "users", "ids": userIDs("r", 5)}),
		header: map[string]string{"Idempotency-Key": "rollback"}})
	requireError(t, rec, http.StatusInternalServerError, "internal", "")
	require.NotContains(t, rec.Body.String(), "injected", "500s keep their detail in the log")

	ctx := context.Background()
	for _, table := range []string{"messages", "payloads", "deliveries", "message_chunks", "idempotency_keys", "river_job"} {
		var n int
		require.NoError(t, tdb.Pool.QueryRow(ctx, "SELECT count(*) FROM "+table).Scan(&n))
		require.Zero(t, n, "%s has rows after a rolled-back schedule", table)
	}
}

// ledgerRow is a delivery as a test writes its result.
type ledgerRow struct {
	ID              int64
	DueAt           time.Time
	UserID, Channel string
	Chunk           int32
}

// startedMessage schedules a message to users users of prefix, one device
// each, starts it as its first chunk would, and returns its id (as the API
// names it and as a number) and its deliveries in device order.
func startedMessage(t *testing.T, b *bundle, prefix string, users int) (id string, n int64, ledger []ledgerRow) {
	t.Helper()
	b.population(t, prefix, users, 1)
	status, resp := b.do(t, http.MethodPost, "/v1/messages", messageBody(map[string]any{"type": "users", "ids": userIDs(prefix, users)}))
	require.Equal(t, http.StatusAccepted, status)
	id = resp["message_id"].(string)
	n, _ = parsePrefixed(id)
	ctx := context.Background()
	require.NoError(t, db.On(b.db.Pool).StartMessage(ctx, n))
	rows, err := b.db.Pool.Query(ctx, "SELECT device_id, due_at, user_id, channel, chunk FROM ledger WHERE message_id = $1 ORDER BY device_id", n)
	require.NoError(t, err)
	ledger, err = pgx.CollectRows(rows, pgx.RowToStructByPos[ledgerRow])
	require.NoError(t, err)
	require.Len(t, ledger, users)
	return id, n, ledger
}

// addResult adds d's result to r as a worker writes it: attempted at, and
// accepted at then when status is accepted.
func addResult(r *db.RecordResultsParams, message int64, d ledgerRow, status, reason string, at time.Time) {
	accepted := int64(0)
	if status == "accepted" {
		accepted = at.UnixMicro()
	}
	r.Add(db.DeliveryKey{MessageID: message, DeviceID: d.ID, UserID: d.UserID, Channel: d.Channel, Chunk: d.Chunk, DueUs: d.DueAt.UnixMicro()},
		status, reason, at.UnixMicro(), accepted)
}

func TestGetMessageCountsAndSkew(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id, n, ledger := startedMessage(t, b, "g", 4)

	// Write the results as a chunk worker does: three accepted at 10, 20
	// and 30 ms, one failed.
	ctx := context.Background()
	q := db.On(b.db.Pool)
	var r db.RecordResultsParams
	for i, d := range ledger {
		at := d.DueAt.Add(time.Duration(i+1) * 10 * time.Millisecond)
		if i == 3 {
			addResult(&r, n, d, "failed", "unregistered", at)
		} else {
			addResult(&r, n, d, "accepted", "", at)
		}
	}
	_, err := q.RecordResults(ctx, r)
	require.NoError(t, err)

	// While the message is dispatching, its skew comes from the histogram
	// the writes keep: each figure the top of its 10% bucket.
	status, st := b.do(t, http.MethodGet, "/v1/messages/"+id, nil)
	require.Equal(t, http.StatusOK, status)
	require.Equal(t, "dispatching", st["state"])
	require.Equal(t, counted(map[string]any{"total": 4.0, "accepted": 3.0, "failed": 1.0, "expired": 0.0, "cancelled": 0.0, "pending": 0.0}), st["deliveries"])
	require.Equal(t, map[string]any{"p50": 21.1, "p95": 30.9, "p99": 30.9, "max": 30.9}, st["skew_ms"])
	// Once settled, the exact percentiles.
	_, err = q.SettleMessage(ctx, n)
	require.NoError(t, err)
	status, st = b.do(t, http.MethodGet, "/v1/messages/"+id, nil)
	require.Equal(t, http.StatusOK, status)
	require.Equal(t, "dispatched", st["state"])
	require.Equal(t, map[string]any{"p50": 20.0, "p95": 29.0, "p99": 29.8, "max": 30.0}, st["skew_ms"])

	status, page := b.do(t, http.MethodGet, "/v1/messages/"+id+"/deliveries?status=failed", nil)
	require.Equal(t, http.StatusOK, status)
	items := page["items"].([]any)
	require.Len(t, items, 1)
	failed := items[0].(map[string]any)
	require.Equal(t, "unregistered", failed["reason"])
	require.Nil(t, failed["skew_ms"])
	require.Nil(t, page["next_cursor"])

	_, page = b.do(t, http.MethodGet, "/v1/messages/"+id+"/deliveries?status=accepted&limit=1", nil)
	require.EqualValues(t, 10, page["items"].([]any)[0].(map[string]any)["skew_ms"])

	for _, bad := range []string{"msg_0", "msg_999999", "dev_1", "x"} {
		requireError(t, b.call(t, request{method: http.MethodGet, path: "/v1/messages/" + bad}), http.StatusNotFound, "not_found", "")
		requireError(t, b.call(t, request{method: http.MethodGet, path: "/v1/messages/" + bad + "/deliveries"}), http.StatusNotFound, "not_found", "")
		requireError(t, b.call(t, request{method: http.MethodDelete, path: "/v1/messages/" + bad}), http.StatusNotFound, "not_found", "")
	}
}

// counted is a message's deliveries as its counts show them when none
// was withheld for its users' sake: by status, and zero opted out,
// capped, skipped or held by quiet hours.
func counted(byStatus map[string]any) map[string]any {
	for _, k := range []string{"opted_out", "capped", "quiet_hours", "held"} {
		byStatus[k] = 0.0
	}
	return byStatus
}

func parsePrefixed(id string) (int64, bool) {
	var n int64
	_, err := fmt.Sscanf(id, "msg_%d", &n)
	return n, err == nil
}

func TestDeliveryPagination(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.population(t, "p", 125, 2)
	status, resp := b.do(t, http.MethodPost, "/v1/messages", messageBody(map[string]any{"type": "users", "ids": userIDs("p", 125)}))
	require.Equal(t, http.StatusAccepted, status)
	id := resp["message_id"].(string)

	seen := map[string]bool{}
	next := ""
	pages := 0
	for {
		path := "/v1/messages/" + id + "/deliveries?limit=100"
		if next != "" {
			path += "&cursor=" + next
		}
		status, page := b.do(t, http.MethodGet, path, nil)
		require.Equal(t, http.StatusOK, status, page)
		pages++
		for _, it := range page["items"].([]any) {
			d := it.(map[string]any)
			require.False(t, seen[d["device_id"].(string)], "a row repeated across pages")
			seen[d["device_id"].(string)] = true
			require.Equal(t, "pending", d["status"])
		}
		if page["next_cursor"] == nil {
			break
		}
		next = page["next_cursor"].(string)
	}
	require.Equal(t, 3, pages)
	require.Len(t, seen, 250)

	_, page := b.do(t, http.MethodGet, "/v1/messages/"+id+"/deliveries?status=failed", nil)
	require.Empty(t, page["items"])

	// A cursor is bound to its listing and filter.
	_, first := b.do(t, http.MethodGet, "/v1/messages/"+id+"/deliveries?limit=10", nil)
	cur := first["next_cursor"].(string)
	requireError(t, b.call(t, request{method: http.MethodGet, path: "/v1/messages/" + id + "/deliveries?status=pending&cursor=" + cur}), 400, "invalid_cursor", "cursor")
	requireError(t, b.call(t, request{method: http.MethodGet, path: "/v1/messages/" + id + "/deliveries?cursor=garbage"}), 400, "invalid_cursor", "cursor")
	for _, limit := range []string{"0", "1001", "ten", "-5"} {
		requireError(t, b.call(t, request{method: http.MethodGet, path: "/v1/messages/" + id + "/deliveries?limit=" + limit}), 400, "invalid_field", "limit")
	}
	requireError(t, b.call(t, request{method: http.MethodGet, path: "/v1/messages/" + id + "/deliveries?status=lost"}), 400, "invalid_field", "status")
}

func TestListMessages(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.population(t, "l", 1, 1)
	var ids []string
	for range 5 {
		status, resp := b.do(t, http.MethodPost, "/v1/messages", messageBody(map[string]any{"type": "users", "ids": []string{"l0"}}))
		require.Equal(t, http.StatusAccepted, status)
		ids = append(ids, resp["message_id"].(string))
	}
	rec := b.call(t, request{method: http.MethodDelete, path: "/v1/messages/" + ids[1]})
	require.Equal(t, http.StatusNoContent, rec.Code)

	var got []string
	next := ""
	for {
		path := "/v1/messages?limit=2"
		if next != "" {
			path += "&cursor=" + next
		}
		status, page := b.do(t, http.MethodGet, path, nil)
		require.Equal(t, http.StatusOK, status, page)
		for _, it := range page["items"].([]any) {
			got = append(got, it.(map[string]any)["message_id"].(string))
		}
		if page["next_cursor"] == nil {
			break
		}
		next = page["next_cursor"].(string)
	}
	require.Equal(t, []string{ids[4], ids[3], ids[2], ids[1], ids[0]}, got, "newest first, each once")

	_, page := b.do(t, http.MethodGet, "/v1/messages?state=cancelled", nil)
	items := page["items"].([]any)
	require.Len(t, items, 1)
	require.Equal(t, ids[1], items[0].(map[string]any)["message_id"])

	requireError(t, b.call(t, request{method: http.MethodGet, path: "/v1/messages?state=lost"}), 400, "invalid_field", "state")
	requireError(t, b.call(t, request{method: http.MethodGet, path: "/v1/messages?schedule_id=nope"}), 400, "invalid_field", "schedule_id")
	_, page = b.do(t, http.MethodGet, "/v1/messages?schedule_id=sch_1", nil)
	require.Empty(t, page["items"])
}

func TestCancelMessage(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.population(t, "x", 10, 2)
	status, resp := b.do(t, http.MethodPost, "/v1/messages", messageBody(map[string]any{"type": "users", "ids": userIDs("x", 10)}))
	require.Equal(t, http.StatusAccepted, status)
	id := resp["message_id"].(string)

	rec := b.call(t, request{method: http.MethodDelete, path: "/v1/messages/" + id})
	require.Equal(t, http.StatusNoContent, rec.Code, rec.Body.String())

	_, st := b.do(t, http.MethodGet, "/v1/messages/"+id, nil)
	require.Equal(t, "cancelled", st["state"])
	require.Equal(t, counted(map[string]any{"total": 20.0, "accepted": 0.0, "failed": 0.0, "expired": 0.0, "cancelled": 20.0, "pending": 0.0}), st["deliveries"])
	require.NotNil(t, st["settled_at"])
	_, page := b.do(t, http.MethodGet, "/v1/messages/"+id+"/deliveries?status=cancelled", nil)
	require.Len(t, page["items"], 20)
	for _, j := range b.chunkJobs(t, id) {
		require.Equal(t, "cancelled", j.State, "its chunk jobs are cancelled with it")
	}

	// Cancelling again changes nothing and is not an error.
	rec = b.call(t, request{method: http.MethodDelete, path: "/v1/messages/" + id})
	require.Equal(t, http.StatusNoContent, rec.Code)
}

// TestCancelledDeliveriesOfDevicesDeletedSince lists a cancelled message's
// deliveries after some of its devices were deleted and a user erased: a
// delivery that was never sent has no ledger row, and still shows the user
// and channel its device had (the fuzzer once found them answered with an empty channel).
func TestCancelledDeliveriesOfDevicesDeletedSince(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.population(t, "gone", 3, 2)
	_, devs := b.do(t, http.MethodGet, "/v1/users/gone0/devices", nil)
	first := devs["items"].([]any)[0].(map[string]any)
	status, resp := b.do(t, http.MethodPost, "/v1/messages", messageBody(map[string]any{"type": "users", "ids": userIDs("gone", 3)}))
	require.Equal(t, http.StatusAccepted, status)
	id := resp["message_id"].(string)
	_, before := b.do(t, http.MethodGet, "/v1/messages/"+id+"/deliveries", nil)
	require.Len(t, before["items"], 6)

	rec := b.call(t, request{method: http.MethodDelete, path: "/v1/messages/" + id})
	require.Equal(t, http.StatusNoContent, rec.Code, rec.Body.String())
	rec = b.call(t, request{method: http.MethodDelete, path: "/v1/devices/" + first["device_id"].(string)})
	require.Equal(t, http.StatusNoContent, rec.Code, rec.Body.String())
	rec = b.call(t, request{method: http.MethodDelete, path: "/v1/users/gone1"})
	require.Equal(t, http.StatusNoContent, rec.Code, rec.Body.String())

	// b.call checks each answer against openapi.yaml too.
	_, after := b.do(t, http.MethodGet, "/v1/messages/"+id+"/deliveries", nil)
	require.Len(t, after["items"], 6)
	for i, item := range after["items"].([]any) {
		was := before["items"].([]any)[i].(map[string]any)
		d := item.(map[string]any)
		require.Equal(t, was["device_id"], d["device_id"])
		require.Equal(t, was["user_id"], d["user_id"], "device %s", d["device_id"])
		require.Equal(t, was["channel"], d["channel"], "device %s", d["device_id"])
		require.Equal(t, "cancelled", d["status"])
		if d["user_id"] == "gone2" {
			require.Equal(t, "default", d["app"])
		}
	}
	_, st := b.do(t, http.MethodGet, "/v1/messages/"+id, nil)
	require.Equal(t, 6.0, st["deliveries"].(map[string]any)["cancelled"])
}

func TestCancelAfterStartIsConflict(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.population(t, "y", 3, 1)
	status, resp := b.do(t, http.MethodPost, "/v1/messages", messageBody(map[string]any{"type": "users", "ids": userIDs("y", 3)}))
	require.Equal(t, http.StatusAccepted, status)
	id := resp["message_id"].(string)
	n, _ := parsePrefixed(id)
	err := b.q.StartMessage(context.Background(), n)
	require.NoError(t, err)

	rec := b.call(t, request{method: http.MethodDelete, path: "/v1/messages/" + id})
	requireError(t, rec, http.StatusConflict, "already_dispatching", "")
	e := decodeBody(t, rec)["error"].(map[string]any)
	require.Equal(t, "dispatching", e["state"])
	require.Equal(t, counted(map[string]any{"total": 3.0, "accepted": 0.0, "failed": 0.0, "expired": 0.0, "cancelled": 0.0, "pending": 3.0}), e["deliveries"])
}

// TestCancelRacesFirstChunk runs DELETE against a chunk's start
// (db.BeginChunk) many times:
// each race must end one way, either cancelled with nothing started, or
// started with the cancel refused, never both.
func TestCancelRacesFirstChunk(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.population(t, "z", 2, 1)
	ctx := context.Background()
	outcomes := map[string]int{}
	for range 40 {
		status, resp := b.do(t, http.MethodPost, "/v1/messages", messageBody(map[string]any{"type": "users", "ids": userIDs("z", 2)}))
		require.Equal(t, http.StatusAccepted, status)
		id := resp["message_id"].(string)
		n, _ := parsePrefixed(id)

		var (
			wg      sync.WaitGroup
			cancel  int
			started bool
			err     error
		)
		wg.Add(2)
		go func() {
			defer wg.Done()
			cancel = b.call(t, request{method: http.MethodDelete, path: "/v1/messages/" + id}).Code
		}()
		go func() {
			defer wg.Done()
			// The chunk worker's own first step.
			var begun db.ChunkStart
			begun, err = db.BeginChunk(ctx, b.db.Pool, db.Chunk{ChunkPendingParams: db.ChunkPendingParams{MessageID: n, LastDevice: math.MaxInt64}}, 0)
			started = begun.State == "dispatching"
		}()
		wg.Wait()
		require.NoError(t, err)
		m, err := b.q.GetMessage(ctx, n)
		require.NoError(t, err)
		switch {
		case cancel == http.StatusNoContent && !started:
			require.Equal(t, "cancelled", m.State)
			require.Nil(t, m.StartedAt)
			outcomes["cancelled"]++
		case cancel == http.StatusConflict && started:
			require.Equal(t, "dispatching", m.State)
			require.EqualValues(t, 0, m.CancelledCount)
			outcomes["started"]++
		default:
			t.Fatalf("race ended both ways or neither: cancel %d, started %v, state %s", cancel, started, m.State)
		}
	}
	t.Logf("outcomes over 40 races: %v", outcomes)
}

// TestLiveSkewIsWithinTenPercent writes the results of a 1,000-device
// message in ten writes, skews spread from 0.5 ms to 6 s, and checks that
// every figure of the skew shown while it is sent (the histogram's) is at
// or above the exact one computed when it settles, by at most 10% (or
// 1 ms under 1 ms).
func TestLiveSkewIsWithinTenPercent(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id, n, ledger := startedMessage(t, b, "h", 1000)
	ctx := context.Background()
	q := db.On(b.db.Pool)
	for start := 0; start < len(ledger); start += 100 {
		var r db.RecordResultsParams
		for i, d := range ledger[start : start+100] {
			// 0.5 ms growing by 0.9% a device, to about 6 s.
			skew := time.Duration(500 * math.Pow(1.0094, float64(start+i)) * float64(time.Microsecond))
			addResult(&r, n, d, "accepted", "", d.DueAt.Add(skew))
		}
		_, err := q.RecordResults(ctx, r)
		require.NoError(t, err)
	}
	skew := func() map[string]any {
		status, st := b.do(t, http.MethodGet, "/v1/messages/"+id, nil)
		require.Equal(t, http.StatusOK, status)
		return st["skew_ms"].(map[string]any)
	}
	live := skew()
	_, err := q.SettleMessage(ctx, n)
	require.NoError(t, err)
	exact := skew()
	t.Logf("live %v, exact %v", live, exact)
	for _, k := range []string{"p50", "p95", "p99", "max"} {
		l, e := live[k].(float64), exact[k].(float64)
		require.GreaterOrEqual(t, l, e-0.1, k)
		require.LessOrEqual(t, l, max(e*1.1+0.1, 1), k)
	}
}
