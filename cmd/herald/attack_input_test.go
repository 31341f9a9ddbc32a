package main

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/heraldpush/herald/api/client"
	"github.com/heraldpush/herald/db"
)

// These tests attack a running `herald serve` with input a hostile or
// careless caller can send: bytes PostgreSQL refuses to store, bytes that are
// not UTF-8, and instants that cannot be written back as RFC 3339. Every one
// of them must be a 400 that names the field, never a 500, and nothing may
// be stored that a later listing cannot show.

// rawAnswer is an answer to a request made by hand.
type rawAnswer struct {
	status int
	body   []byte
}

func (r rawAnswer) StatusCode() int { return r.status }
func (r rawAnswer) GetBody() []byte { return r.body }

// sendRaw makes an authenticated call with body as it is: the generated
// client's json.Marshal would repair invalid UTF-8, and the point is to send
// it unrepaired.
func sendRaw(t *testing.T, e *e2e, method, path string, body []byte) rawAnswer {
	t.Helper()
	req, err := http.NewRequest(method, e.base+path, bytes.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+testAPIKey)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return rawAnswer{status: resp.StatusCode, body: raw}
}

// requireInvalidField checks a 400 invalid_field that blames field.
func requireInvalidField(t *testing.T, res answer, field string) {
	t.Helper()
	require.Equal(t, http.StatusBadRequest, res.StatusCode(), "%s", res.GetBody())
	requireAPIError(t, res, "invalid_field", field)
}

// attackMessage is a message to ann with payload, for the tests to spoil.
func attackMessage(payload client.Payload) client.NewMessage {
	return client.NewMessage{Audience: toUsers("ann"), Payload: payload}
}

const attackAudience = `"audience":{"type":"users","ids":["ann"]}`

func TestAttackInputNULIsRefusedWithItsField(t *testing.T) {
	t.Parallel()
	e := startE2E(t, nil)
	ctx := t.Context()
	for _, tc := range []struct {
		name  string
		call  func() (answer, error)
		field string
	}{
		{"segment name", func() (answer, error) {
			return e.api.CreateSegmentWithResponse(ctx, "seg_nul", client.SegmentUpdate{Name: new("morning\x00digest")})
		}, "name"},
		{"payload title", func() (answer, error) {
			return e.api.CreateMessageWithResponse(ctx, nil, attackMessage(titled("a\x00")))
		}, "payload.title"},
		{"payload data key", func() (answer, error) {
			return e.api.CreateMessageWithResponse(ctx, nil, attackMessage(client.Payload{Data: &map[string]string{"k\x00": "v"}}))
		}, `payload.data.k\x00`},
		{"payload data value", func() (answer, error) {
			return e.api.CreateMessageWithResponse(ctx, nil, attackMessage(client.Payload{Data: &map[string]string{"k": "v\x00"}}))
		}, "payload.data.k"},
		{"schedule payload body", func() (answer, error) {
			return e.api.CreateScheduleWithResponse(ctx, nil, client.NewSchedule{Cron: "@daily", Audience: toUsers("ann"), Payload: client.Payload{Body: new("\x00")}})
		}, "payload.body"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res, err := tc.call()
			require.NoError(t, err)
			requireInvalidField(t, res, tc.field)
		})
	}
	// Nothing was stored on the way to the error.
	res, err := e.api.GetSegmentWithResponse(ctx, "seg_nul")
	answered(t, http.StatusNotFound, res, err)
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
			requireInvalidField(t, sendRaw(t, e, tc.method, tc.path, tc.body), tc.field)
		})
	}
	res, err := e.api.GetSegmentWithResponse(t.Context(), "seg_utf8")
	answered(t, http.StatusNotFound, res, err)
}

func TestAttackInputIdempotencyKeyMustBeText(t *testing.T) {
	t.Parallel()
	e := startE2E(t, nil)
	send := func(key string) *client.CreateMessageResponse {
		res, err := e.api.CreateMessageWithResponse(t.Context(), &client.CreateMessageParams{IdempotencyKey: &key}, attackMessage(titled("hello")))
		require.NoError(t, err)
		return res
	}
	for name, key := range map[string]string{
		"invalid UTF-8": "key-\xff\xfe",
		"tab":           "key\twith-tab",
	} {
		t.Run(name, func(t *testing.T) {
			requireInvalidField(t, send(key), "Idempotency-Key")
		})
	}
	// A key of printable text still works, and replays.
	var ids []string
	for range 2 {
		res := send("standup 2026-09-04 #1")
		require.Equal(t, http.StatusAccepted, res.StatusCode(), "%s", res.Body)
		ids = append(ids, res.JSON202.MessageID)
	}
	require.Equal(t, ids[0], ids[1])
}

func TestAttackInputTimestampsStayWithinYears1970To9999(t *testing.T) {
	t.Parallel()
	e := startE2E(t, nil)
	// A recipient in UTC-11, whose wave of a local-time message is the last.
	e.putUser("ann", "Pacific/Pago_Pago")
	e.register("ann", false)

	at := func(value string) *time.Time {
		ts, err := time.Parse(time.RFC3339, value)
		require.NoError(t, err)
		return &ts
	}
	sendMessage := func(m client.NewMessage) *client.CreateMessageResponse {
		m.Audience, m.Payload = toUsers("ann"), titled("far")
		res, err := e.api.CreateMessageWithResponse(t.Context(), nil, m)
		require.NoError(t, err)
		return res
	}
	for _, tc := range []struct {
		name  string
		msg   client.NewMessage
		field string
	}{
		// The default expiry, an hour after dispatch_at, is in year 10000.
		{"default expiry past 9999", client.NewMessage{DispatchAt: at("9999-12-31T23:00:00Z")}, "expires_at"},
		{"dispatch_at before 1970", client.NewMessage{DispatchAt: at("1969-12-31T23:00:00Z"), ExpiresAt: at("2999-01-01T00:00:00Z")}, "dispatch_at"},
		// An offset carries a year-9999 timestamp into year 10000.
		{"expires_at past 9999 by its offset", client.NewMessage{DispatchAt: at("9999-12-31T20:00:00Z"), ExpiresAt: at("9999-12-31T23:00:00-05:00")}, "expires_at"},
		{"expires_at over 28 days after dispatch_at", client.NewMessage{DispatchAt: at("2999-01-01T00:00:00Z"), ExpiresAt: at("2999-01-29T00:00:01Z")}, "expires_at"},
		{"local wave past 9999", client.NewMessage{DeliverAtLocal: new("9999-12-31T23:00")}, "deliver_at_local"},
		{"local wave's lifetime past 9999", client.NewMessage{DeliverAtLocal: new("9999-12-20T00:00"), TTLSeconds: new(2419200)}, "deliver_at_local"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			requireInvalidField(t, sendMessage(tc.msg), tc.field)
		})
	}
	t.Run("expires_at 28 days after dispatch_at", func(t *testing.T) {
		res := sendMessage(client.NewMessage{DispatchAt: at("2999-01-01T00:00:00Z"), ExpiresAt: at("2999-01-29T00:00:00Z")})
		require.Equal(t, http.StatusAccepted, res.StatusCode(), "%s", res.Body)
		require.Equal(t, *at("2999-01-29T00:00:00Z"), res.JSON202.ExpiresAt)
	})
	t.Run("expires_at cap message", func(t *testing.T) {
		res := sendMessage(client.NewMessage{ExpiresAt: new(time.Now().Add(29 * 24 * time.Hour))})
		requireInvalidField(t, res, "expires_at")
		require.Contains(t, requireAPIError(t, res, "invalid_field", "expires_at").Message, "28 days")
	})
	for _, tc := range []struct {
		name  string
		sched client.NewSchedule
		field string
	}{
		{"starts_at past 9999 by its offset", client.NewSchedule{StartsAt: at("9999-12-31T23:00:00-05:00")}, "starts_at"},
		{"ends_at before 1970", client.NewSchedule{EndsAt: at("1969-01-01T00:00:00Z")}, "ends_at"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.sched.Cron, tc.sched.Audience, tc.sched.Payload = "@daily", toUsers("ann"), titled("far")
			res, err := e.api.CreateScheduleWithResponse(t.Context(), nil, tc.sched)
			require.NoError(t, err)
			requireInvalidField(t, res, tc.field)
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
	other := e.createSchedule(client.NewSchedule{Cron: "0 9 * * *", Audience: toUsers("bob"), Payload: titled("ordinary")})

	starts := time.Date(9999, 12, 30, 0, 0, 0, 0, time.UTC)
	far := e.createSchedule(client.NewSchedule{Cron: "0 9 * * *", StartsAt: &starts, Audience: toUsers("ann"), Payload: titled("far")})
	require.Equal(t, []time.Time{starts.Add(9 * time.Hour), starts.Add(33 * time.Hour)}, far.NextRuns)

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

	res, err := e.api.ListSchedulesWithResponse(t.Context(), nil)
	var ids []string
	for _, it := range answered(t, http.StatusOK, res, err).JSON200.Items {
		ids = append(ids, it.ScheduleID)
	}
	require.Equal(t, []string{far.ScheduleID, other.ScheduleID}, ids,
		"the listing shows every schedule it can show, newest first")
	got, err := e.api.GetScheduleWithResponse(t.Context(), far.ScheduleID)
	answered(t, http.StatusOK, got, err)
}
