package api

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/heraldpush/herald/db"
)

func TestCheckTextNamesTheString(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, body, field string
	}{
		{"clean", `{"name":"Morning digest é","data":{"k":"v"}}`, ""},
		{"an escaped backslash before u0000 is no NUL", `{"name":"\\u0000"}`, ""},
		{"not JSON is left to the decoder", "{\"name\":\"\xff", ""},
		{"NUL in a value", `{"name":"a\u0000"}`, "name"},
		{"NUL in a nested value", `{"payload":{"data":{"room":"\u0000"}}}`, "payload.data.room"},
		{"NUL in a key", `{"payload":{"data":{"k\u0000":"v"}}}`, `payload.data.k\x00`},
		{"NUL in an array", `{"devices":[{"user_id":"a"},{},{"x":[1,{"y":2}]},{"user_id":"\u0000"}]}`, "devices[3].user_id"},
		{"NUL in an array of strings", `{"user_ids":["a","b","c\u0000"]}`, "user_ids[2]"},
		{"NUL after a value of every kind", `{"a":1,"b":true,"c":null,"d":[],"e":{},"f":"\u0000"}`, "f"},
		{"invalid UTF-8 in a value", "{\"payload\":{\"title\":\"\xff\"}}", "payload.title"},
		{"invalid UTF-8 in a key", "{\"payload\":{\"data\":{\"a\xc3\":\"v\"}}}", `payload.data.a\xc3`},
		{"a bare string", `"\u0000"`, "body"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			err := checkText([]byte(tc.body), "")
			if tc.field == "" {
				require.NoError(t, err)
				return
			}
			var apiErr *Error
			require.ErrorAs(t, err, &apiErr)
			require.Equal(t, "invalid_field", apiErr.Code)
			require.Equal(t, tc.field, apiErr.Field)
		})
	}
}

// TestBadTextIsRefusedOnEveryRoute sends a NUL and bytes that are not UTF-8
// through each route that stores a caller's strings: a 400 names the field,
// and nothing is stored.
func TestBadTextIsRefusedOnEveryRoute(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.population(t, "p", 1, 1)
	for _, tc := range []struct {
		name, method, path, body, field string
	}{
		{"segment name", http.MethodPut, "/v1/segments/s1", `{"name":"\u0000"}`, "name"},
		{"segment name not UTF-8", http.MethodPut, "/v1/segments/s1", "{\"name\":\"\xe9t\xe9\"}", "name"},
		{"member id", http.MethodPost, "/v1/segments/s1/members", `{"user_ids":["a","\u0000"]}`, "user_ids[1]"},
		{"user's zone", http.MethodPut, "/v1/users/u1", `{"timezone":"Europe/Berlin\u0000"}`, "timezone"},
		{"device token", http.MethodPost, "/v1/devices", `{"user_id":"u1","channel":"fcm","token":"t\u0000"}`, "token"},
		{"batch user id", http.MethodPost, "/v1/devices/batch", `{"devices":[{"user_id":"u1","channel":"fcm","token":"a"},{"user_id":"\u0000","channel":"fcm","token":"b"}]}`, "devices[1].user_id"},
		{"web push key", http.MethodPost, "/v1/devices", "{\"user_id\":\"u1\",\"channel\":\"webpush\",\"subscription\":{\"endpoint\":\"https://push.example/a\",\"keys\":{\"p256dh\":\"\xff\",\"auth\":\"x\"}}}", "subscription.keys.p256dh"},
		{"payload body", http.MethodPost, "/v1/messages", `{"audience":{"type":"users","ids":["p0"]},"payload":{"body":"\u0000"}}`, "payload.body"},
		{"audience id", http.MethodPost, "/v1/messages", `{"audience":{"type":"segment","id":"s\u0000"},"payload":{"title":"x"}}`, "audience.id"},
		{"local-time zone", http.MethodPost, "/v1/messages", `{"deliver_at_local":"2030-01-01T09:00","fallback_timezone":"\u0000","audience":{"type":"users","ids":["p0"]},"payload":{"title":"x"}}`, "fallback_timezone"},
		{"cron", http.MethodPost, "/v1/schedules", `{"cron":"@daily\u0000","audience":{"type":"users","ids":["p0"]},"payload":{"title":"x"}}`, "cron"},
		{"schedule data value", http.MethodPost, "/v1/schedules", "{\"cron\":\"@daily\",\"audience\":{\"type\":\"users\",\"ids\":[\"p0\"]},\"payload\":{\"data\":{\"k\":\"\xc0\xaf\"}}}", "payload.data.k"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := b.call(t, request{method: tc.method, path: tc.path, body: tc.body})
			requireError(t, rec, http.StatusBadRequest, "invalid_field", tc.field)
		})
	}
	var messages, schedules, segments int
	require.NoError(t, b.db.Pool.QueryRow(context.Background(),
		`SELECT (SELECT count(*) FROM messages), (SELECT count(*) FROM schedules), (SELECT count(*) FROM segments)`).
		Scan(&messages, &schedules, &segments))
	require.Zero(t, messages+schedules+segments, "a refused request stored something")
}

func TestIdempotencyKeyMustBeText(t *testing.T) {
	t.Parallel()
	b := setup(t)
	body := map[string]any{"audience": map[string]any{"type": "users", "ids": []string{"nobody"}}, "payload": map[string]any{"title": "x"}}
	for name, key := range map[string]string{
		"invalid UTF-8":     "k\xff",
		"tab":               "k\tk",
		"DEL":               "k\x7f",
		"C1 control":        "k\u0085",
		"longer than 255 B": string(make([]byte, 256)),
	} {
		t.Run(name, func(t *testing.T) {
			rec := b.call(t, request{method: http.MethodPost, path: "/v1/messages", body: body, header: map[string]string{"Idempotency-Key": key}})
			requireError(t, rec, http.StatusBadRequest, "invalid_field", "Idempotency-Key")
		})
	}
	rec := b.call(t, request{method: http.MethodPost, path: "/v1/messages", body: body, header: map[string]string{"Idempotency-Key": "Ünïcode key 1"}})
	require.Equal(t, http.StatusAccepted, rec.Code, rec.Body.String())
}

// TestInTxRollsBackWhatCannotBeShown checks that an answer which fails to
// encode undoes the change it answers.
func TestInTxRollsBackWhatCannotBeShown(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rec := httptest.NewRecorder()
	c := b.srv.echo.NewContext(httptest.NewRequest(http.MethodPut, "/v1/segments/s1", nil), rec)
	err := b.srv.inTx(c, func(tx pgx.Tx) (int, any, error) {
		if _, err := db.On(tx).UpsertSegment(context.Background(), db.UpsertSegmentParams{ID: "s1", Name: "x"}); err != nil {
			return 0, nil, err
		}
		return http.StatusCreated, map[string]any{"at": time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)}, nil
	})
	require.ErrorContains(t, err, "encode response")
	exists, err := b.q.SegmentExists(context.Background(), "s1")
	require.NoError(t, err)
	require.False(t, exists, "the change was committed though its answer could not be shown")
	require.Zero(t, rec.Body.Len())
}

// TestListingsLeaveOutRowsThatCannotBeShown stores a schedule and a message
// as no request can today (instants in year 10000), and lists them: every
// caller still gets the other rows.
func TestListingsLeaveOutRowsThatCannotBeShown(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.population(t, "p", 1, 1)
	status, good := b.do(t, http.MethodPost, "/v1/schedules", scheduleBody())
	require.Equal(t, http.StatusCreated, status, good)
	status, msg := b.do(t, http.MethodPost, "/v1/messages", messageBody(map[string]any{"type": "users", "ids": []string{"p0"}}))
	require.Equal(t, http.StatusAccepted, status, msg)

	ctx := context.Background()
	beyond := time.Date(10000, 1, 2, 0, 0, 0, 0, time.UTC)
	payload, err := b.q.InsertPayload(ctx, []byte(`{"title":"old"}`))
	require.NoError(t, err)
	_, err = b.q.InsertSchedule(ctx, db.InsertScheduleParams{
		Cron: "@daily", Timezone: "UTC", Audience: []byte(`{"type":"users","ids":["p0"]}`), PayloadID: payload,
		Priority: "bulk", TtlSeconds: 60, FallbackTimezone: "UTC", IfPassed: "skip", StartsAt: &beyond, NextRunAt: &beyond,
	})
	require.NoError(t, err)
	_, err = b.q.InsertMessage(ctx, db.InsertMessageParams{
		State: "scheduled", Priority: "bulk", DispatchAt: beyond, ExpiresAt: beyond.Add(time.Hour),
		PayloadID: payload, Audience: []byte(`{"type":"users","ids":["p0"]}`),
	})
	require.NoError(t, err)

	for path, id := range map[string]string{"/v1/schedules": good["schedule_id"].(string), "/v1/messages": msg["message_id"].(string)} {
		rec := b.call(t, request{method: http.MethodGet, path: path})
		require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
		var page struct {
			Items []map[string]any `json:"items"`
		}
		require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &page))
		require.Len(t, page.Items, 1, path)
		require.Contains(t, []any{page.Items[0]["schedule_id"], page.Items[0]["message_id"]}, id)
	}
}

// TestQueryParametersNeverFail sends query parameters that reach the
// database's queries, hostile ones included: each is a 400 naming it, never
// a 500.
func TestQueryParametersNeverFail(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.population(t, "p", 1, 1)
	status, msg := b.do(t, http.MethodPost, "/v1/messages", messageBody(map[string]any{"type": "users", "ids": []string{"p0"}}))
	require.Equal(t, http.StatusAccepted, status, msg)
	deliveries := "/v1/messages/" + msg["message_id"].(string) + "/deliveries"
	for _, tc := range []struct{ path, field string }{
		{"/v1/messages?cursor=%00", "cursor"},
		{"/v1/messages?cursor=eyJhIjotMX0", "cursor"},    // {"a":-1}
		{"/v1/messages?cursor=eyJhIjoxZTk5fQ", "cursor"}, // {"a":1e99}
		{"/v1/messages?state=%ff", "state"},
		{"/v1/messages?schedule_id=sch_%00", "schedule_id"},
		{"/v1/messages?schedule_id=sch_99999999999999999999", "schedule_id"},
		{"/v1/messages?limit=%00", "limit"},
		{"/v1/schedules?cursor=%ff%fe", "cursor"},
		{"/v1/schedules?limit=99999999999999999999", "limit"},
		{deliveries + "?status=%00", "status"},
		{deliveries + "?cursor=eyJhIjoxLCJmIjoieCJ9", "cursor"}, // another listing's filter
	} {
		t.Run(tc.path, func(t *testing.T) {
			code := "invalid_field"
			if tc.field == "cursor" {
				code = "invalid_cursor"
			}
			requireError(t, b.call(t, request{method: http.MethodGet, path: tc.path}), http.StatusBadRequest, code, tc.field)
		})
	}
}

// TestDecodeArrayNamesTheElement: a batch decoded as it arrives names the
// element at fault, by its index, and stops there.
func TestDecodeArrayNamesTheElement(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, tc := range []struct {
		body        string
		code, field string
	}{
		{`{"devices":[{"user_id":"u1","channel":"fcm","token":"t"},{"user_id":"u2","channel":"fcm","token":7}]}`, "invalid_type", "devices[1].token"},
		{`{"devices":[{"user_id":"u1","channel":"fcm","token":"t","extra":1}]}`, "unknown_field", "devices[0].extra"},
		{`{"devices":[{"user_id":"u1","channel":"fcm","token":"t"}, 3]}`, "invalid_type", "devices[1]"},
		{`{"devices":[{"user_id":"u1","channel":"fcm","token":"t\u0000"}]}`, "invalid_field", "devices[0].token"},
		{`{"devices":[]}`, "invalid_field", "devices"},
		{`{}`, "invalid_field", "devices"},
		{`{"devices":{}}`, "invalid_type", "devices"},
		{`{"devices":[],"devices":[]}`, "invalid_field", "devices"},
		{`{"other":[]}`, "unknown_field", "other"},
		{`[]`, "invalid_type", ""},
		{`{"devices":[{"user_id":"u1","channel":"fcm","token":"t"}]} {}`, "malformed_json", ""},
		{`{"devices":[{"user_id":"u1","channel":"fcm","token":"t"}`, "malformed_json", ""},
	} {
		rec := b.call(t, request{method: http.MethodPost, path: "/v1/devices/batch", body: tc.body})
		requireError(t, rec, http.StatusBadRequest, tc.code, tc.field)
	}
}
