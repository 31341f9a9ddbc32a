package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/heraldpush/herald/db"
)

// These tests attack a running `herald serve` with input a hostile or
// careless caller can send: bytes PostgreSQL refuses to store, bytes that are
// not UTF-8, and instants that cannot be written back as RFC 3339. Every one
// of them must be a 400 that names the field, never a 500, and nothing may
// be stored that a later listing cannot show.

// sendRaw makes an authenticated call with body as it is: json.Marshal
// would repair invalid UTF-8, and the point is to send it unrepaired.
func sendRaw(t *testing.T, e *e2e, method, path string, body []byte, header map[string]string) (int, map[string]any) {
	t.Helper()
	req, err := http.NewRequest(method, e.base+path, bytes.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+testAPIKey)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	var out map[string]any
	if resp.StatusCode != http.StatusNoContent {
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&out), "%s %s answered %d without JSON", method, path, resp.StatusCode)
	}
	return resp.StatusCode, out
}

// requireInvalidField checks a 400 invalid_field that blames field.
func requireInvalidField(t *testing.T, status int, out map[string]any, field string) {
	t.Helper()
	require.Equal(t, http.StatusBadRequest, status, "%v", out)
	e, ok := out["error"].(map[string]any)
	require.True(t, ok, "%v", out)
	require.Equal(t, "invalid_field", e["code"], "%v", out)
	require.Equal(t, field, e["field"], "%v", out)
}

const attackAudience = `"audience":{"type":"users","ids":["ann"]}`

func TestAttackInputNULIsRefusedWithItsField(t *testing.T) {
	t.Parallel()
	e := startE2E(t, nil)
	for _, tc := range []struct {
		name, method, path, body, field string
	}{
		{"segment name", http.MethodPut, "/v1/segments/seg_nul", `{"name":"morning\u0000digest"}`, "name"},
		{"payload title", http.MethodPost, "/v1/messages", `{` + attackAudience + `,"payload":{"title":"a\u0000"}}`, "payload.title"},
		{"payload data key", http.MethodPost, "/v1/messages", `{` + attackAudience + `,"payload":{"data":{"k\u0000":"v"}}}`, `payload.data.k\x00`},
		{"payload data value", http.MethodPost, "/v1/messages", `{` + attackAudience + `,"payload":{"data":{"k":"v\u0000"}}}`, "payload.data.k"},
		{"schedule payload body", http.MethodPost, "/v1/schedules", `{"cron":"@daily",` + attackAudience + `,"payload":{"body":"\u0000"}}`, "payload.body"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			status, out := sendRaw(t, e, tc.method, tc.path, []byte(tc.body), nil)
			requireInvalidField(t, status, out, tc.field)
		})
	}
	// Nothing was stored on the way to the error.
	status, _ := sendRaw(t, e, http.MethodGet, "/v1/segments/seg_nul", nil, nil)
	require.Equal(t, http.StatusNotFound, status)
}

func TestAttackInputInvalidUTF8IsRefusedNotRepaired(t *testing.T) {
	t.Parallel()
	e := startE2E(t, nil)
	for _, tc := range []struct {
		name, method, path string
		body               []byte
		field              string
	}{
		{"segment name", http.MethodPut, "/v1/segments/seg_utf8", []byte("{\"name\":\"caf\xe9\"}"), "name"},
		{"payload title", http.MethodPost, "/v1/messages", []byte("{" + attackAudience + ",\"payload\":{\"title\":\"\xff\xfe\"}}"), "payload.title"},
		{"payload data key", http.MethodPost, "/v1/messages", []byte("{" + attackAudience + ",\"payload\":{\"data\":{\"\xc3\":\"v\"}}}"), `payload.data.\xc3`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			status, out := sendRaw(t, e, tc.method, tc.path, tc.body, nil)
			requireInvalidField(t, status, out, tc.field)
		})
	}
	status, _ := sendRaw(t, e, http.MethodGet, "/v1/segments/seg_utf8", nil, nil)
	require.Equal(t, http.StatusNotFound, status, "a name that is not UTF-8 was stored with its bytes replaced")
}

func TestAttackInputIdempotencyKeyMustBeText(t *testing.T) {
	t.Parallel()
	e := startE2E(t, nil)
	body := []byte(`{` + attackAudience + `,"payload":{"title":"hello"}}`)
	for name, key := range map[string]string{
		"invalid UTF-8": "key-\xff\xfe",
		"tab":           "key\twith-tab",
	} {
		t.Run(name, func(t *testing.T) {
			status, out := sendRaw(t, e, http.MethodPost, "/v1/messages", body, map[string]string{"Idempotency-Key": key})
			requireInvalidField(t, status, out, "Idempotency-Key")
		})
	}
	// A key of printable text still works, and replays.
	var ids []any
	for range 2 {
		status, out := sendRaw(t, e, http.MethodPost, "/v1/messages", body, map[string]string{"Idempotency-Key": "standup 2026-09-04 #1"})
		require.Equal(t, http.StatusAccepted, status, "%v", out)
		ids = append(ids, out["message_id"])
	}
	require.Equal(t, ids[0], ids[1])
}

func TestAttackInputTimestampsStayWithinYears1970To9999(t *testing.T) {
	t.Parallel()
	e := startE2E(t, nil)
	// A recipient in UTC-11, whose wave of a local-time message is the last.
	e.must(http.StatusCreated, http.MethodPut, "/v1/users/ann", map[string]any{"timezone": "Pacific/Pago_Pago"})
	e.register("ann", false)

	for _, tc := range []struct{ name, body, field string }{
		// The default expiry, an hour after dispatch_at, is in year 10000.
		{"default expiry past 9999", `"dispatch_at":"9999-12-31T23:00:00Z"`, "expires_at"},
		{"dispatch_at before 1970", `"dispatch_at":"1969-12-31T23:00:00Z","expires_at":"2999-01-01T00:00:00Z"`, "dispatch_at"},
		// An offset carries a year-9999 timestamp into year 10000.
		{"expires_at past 9999 by its offset", `"dispatch_at":"9999-12-31T20:00:00Z","expires_at":"9999-12-31T23:00:00-05:00"`, "expires_at"},
		{"expires_at over 28 days after dispatch_at", `"dispatch_at":"2999-01-01T00:00:00Z","expires_at":"2999-01-29T00:00:01Z"`, "expires_at"},
		{"local wave past 9999", `"deliver_at_local":"9999-12-31T23:00"`, "deliver_at_local"},
		{"local wave's lifetime past 9999", `"deliver_at_local":"9999-12-20T00:00","ttl_seconds":2419200`, "deliver_at_local"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			status, out := sendRaw(t, e, http.MethodPost, "/v1/messages",
				[]byte(`{`+tc.body+`,`+attackAudience+`,"payload":{"title":"far"}}`), nil)
			requireInvalidField(t, status, out, tc.field)
		})
	}
	t.Run("expires_at 28 days after dispatch_at", func(t *testing.T) {
		status, out := sendRaw(t, e, http.MethodPost, "/v1/messages",
			[]byte(`{"dispatch_at":"2999-01-01T00:00:00Z","expires_at":"2999-01-29T00:00:00Z",`+attackAudience+`,"payload":{"title":"far"}}`), nil)
		require.Equal(t, http.StatusAccepted, status, "%v", out)
		require.Equal(t, "2999-01-29T00:00:00Z", out["expires_at"])
	})
	t.Run("expires_at cap message", func(t *testing.T) {
		expires := time.Now().Add(29 * 24 * time.Hour).UTC().Format(time.RFC3339)
		status, out := sendRaw(t, e, http.MethodPost, "/v1/messages",
			[]byte(`{"expires_at":"`+expires+`",`+attackAudience+`,"payload":{"title":"far"}}`), nil)
		requireInvalidField(t, status, out, "expires_at")
		require.Contains(t, out["error"].(map[string]any)["message"], "28 days")
	})
	for _, tc := range []struct{ name, body, field string }{
		{"starts_at past 9999 by its offset", `"starts_at":"9999-12-31T23:00:00-05:00"`, "starts_at"},
		{"ends_at before 1970", `"ends_at":"1969-01-01T00:00:00Z"`, "ends_at"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			status, out := sendRaw(t, e, http.MethodPost, "/v1/schedules",
				[]byte(`{"cron":"@daily",`+tc.body+`,`+attackAudience+`,"payload":{"title":"far"}}`), nil)
			requireInvalidField(t, status, out, tc.field)
		})
	}
}

// TestAttackInputFarScheduleKeepsListingsWorking creates a schedule whose
// runs reach the end of year 9999: its next_runs stop there, and the
// listing every caller shares keeps working, even around a row stored
// before such schedules were bounded.
func TestAttackInputFarScheduleKeepsListingsWorking(t *testing.T) {
	t.Parallel()
	e := startE2E(t, nil)
	other := e.must(http.StatusCreated, http.MethodPost, "/v1/schedules", map[string]any{
		"cron": "0 9 * * *", "audience": map[string]any{"type": "users", "ids": []string{"bob"}},
		"payload": map[string]any{"title": "ordinary"},
	})

	status, far := sendRaw(t, e, http.MethodPost, "/v1/schedules",
		[]byte(`{"cron":"0 9 * * *","starts_at":"9999-12-30T00:00:00Z",`+attackAudience+`,"payload":{"title":"far"}}`), nil)
	require.Equal(t, http.StatusCreated, status, "%v", far)
	require.Equal(t, []any{"9999-12-30T09:00:00Z", "9999-12-31T09:00:00Z"}, far["next_runs"])

	// A row that cannot be shown, as one stored before this was checked:
	// its ends_at lies in year 10000.
	pool, err := db.Open(context.Background(), e.vars["DATABASE_URL"], db.PoolConfig{})
	require.NoError(t, err)
	defer pool.Close()
	q := db.On(pool)
	payload, err := q.InsertPayload(context.Background(), []byte(`{"title":"stored long ago"}`))
	require.NoError(t, err)
	beyond := time.Date(10000, 1, 2, 0, 0, 0, 0, time.UTC)
	_, err = q.InsertSchedule(context.Background(), db.InsertScheduleParams{
		Cron: "0 9 * * *", Timezone: "UTC", Audience: []byte(`{"type":"users","ids":["ann"]}`), PayloadID: payload,
		Priority: "bulk", TtlSeconds: 3600, FallbackTimezone: "UTC", IfPassed: "skip", EndsAt: &beyond,
	})
	require.NoError(t, err)

	list := e.must(http.StatusOK, http.MethodGet, "/v1/schedules", nil)
	var ids []string
	for _, it := range list["items"].([]any) {
		ids = append(ids, it.(map[string]any)["schedule_id"].(string))
	}
	require.Equal(t, []string{far["schedule_id"].(string), other["schedule_id"].(string)}, ids,
		"the listing shows every schedule it can show, newest first")
	e.must(http.StatusOK, http.MethodGet, fmt.Sprintf("/v1/schedules/%s", far["schedule_id"]), nil)
}
