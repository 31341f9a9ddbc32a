package api

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// fuzzRoutes are the /v1 routes FuzzAPI drives; {} is the path parameter.
var fuzzRoutes = []struct{ method, path string }{
	{http.MethodPost, "/v1/devices"},
	{http.MethodPost, "/v1/devices/batch"},
	{http.MethodDelete, "/v1/devices/{}"},
	{http.MethodPut, "/v1/users/{}"},
	{http.MethodGet, "/v1/users/{}/devices"},
	{http.MethodPut, "/v1/segments/{}"},
	{http.MethodGet, "/v1/segments/{}"},
	{http.MethodPost, "/v1/segments/{}/members"},
	{http.MethodDelete, "/v1/segments/{}/members"},
	{http.MethodPost, "/v1/messages"},
	{http.MethodGet, "/v1/messages"},
	{http.MethodGet, "/v1/messages/{}"},
	{http.MethodDelete, "/v1/messages/{}"},
	{http.MethodGet, "/v1/messages/{}/deliveries"},
	{http.MethodPost, "/v1/schedules"},
	{http.MethodGet, "/v1/schedules"},
	{http.MethodGet, "/v1/schedules/{}"},
	{http.MethodPatch, "/v1/schedules/{}"},
	{http.MethodDelete, "/v1/schedules/{}"},
	{http.MethodGet, "/v1/providers"},
	// Appended, so that the saved corpus keeps naming the routes it named.
	{http.MethodGet, "/v1/users/{}"},
	{http.MethodDelete, "/v1/users/{}"},
	{http.MethodGet, "/v1/segments"},
	{http.MethodGet, "/v1/segments/{}/members"},
	{http.MethodDelete, "/v1/segments/{}"},
	{http.MethodPost, "/v1/keys"},
	{http.MethodGet, "/v1/keys"},
	{http.MethodDelete, "/v1/keys/{}"},
	{http.MethodGet, "/v1/audit"},
	{http.MethodGet, "/v1/users/{}/preferences"},
	{http.MethodPut, "/v1/users/{}/preferences"},
	{http.MethodGet, "/v1/categories"},
	{http.MethodGet, "/v1/categories/{}"},
	{http.MethodPut, "/v1/categories/{}"},
	{http.MethodDelete, "/v1/categories/{}"},
	{http.MethodGet, "/v1/quiet-hours"},
	{http.MethodPut, "/v1/quiet-hours"},
	{http.MethodDelete, "/v1/quiet-hours"},
}

// fuzzRoute finds a route of fuzzRoutes by method and path, for the seeds.
func fuzzRoute(tb testing.TB, method, path string) uint8 {
	for i, r := range fuzzRoutes {
		if r.method == method && r.path == path {
			return uint8(i)
		}
	}
	tb.Fatalf("%s %s is not in fuzzRoutes", method, path)
	return 0
}

// FuzzAPI drives the real /v1 handlers, on a real database that keeps what
// earlier inputs stored, with fuzzed path parameters, query strings,
// Idempotency-Keys and bodies: whatever a caller sends, the answer is never
// a 5xx (a panic is one too: Echo recovers it into a 500), and it is what
// openapi.yaml says. testdata/fuzz/FuzzAPI holds the inputs that were 500s
// once; they and the seeds below run in every go test.
func FuzzAPI(f *testing.F) {
	// The fuzzer sends thousands of requests a second with one key: far
	// past the rate limit, whose 429s would hide the handlers it is here
	// to reach (the limit has tests of its own).
	b := setupWith(f, dbtestNew(f), Config{RateLimit: 1e9, RateBurst: 1e9})
	// Something for the fuzzer to find behind each route: users u0 and u1
	// with devices (dev_1...), segment seg1, message msg_1, schedule sch_1.
	b.population(f, "u", 2, 2)
	for _, call := range []struct {
		method, path string
		body         any
	}{
		{http.MethodPut, "/v1/segments/seg1", map[string]any{"name": "Morning"}},
		{http.MethodPost, "/v1/segments/seg1/members", map[string]any{"user_ids": []string{"u0", "u1"}}},
		{http.MethodPost, "/v1/messages", messageBody(map[string]any{"type": "segment", "id": "seg1"})},
		{http.MethodPost, "/v1/schedules", scheduleBody()},
	} {
		rec := b.call(f, request{method: call.method, path: call.path, body: call.body})
		require.Less(f, rec.Code, 300, rec.Body.String())
	}

	audience := `"audience":{"type":"users","ids":["u0","u1"]}`
	for _, s := range []struct {
		method, path, id, query, key, body string
	}{
		{http.MethodPost, "/v1/devices", "", "", "", `{"user_id":"u2","channel":"fcm","token":"tok-1"}`},
		{http.MethodPost, "/v1/devices/batch", "", "", "", `{"devices":[{"user_id":"u2","channel":"apns","token":"` + strings.Repeat("ab", 32) + `"}]}`},
		{http.MethodDelete, "/v1/devices/{}", "dev_1", "", "", ""},
		{http.MethodPut, "/v1/users/{}", "u0", "", "", `{"timezone":"Asia/Kolkata"}`},
		{http.MethodGet, "/v1/users/{}/devices", "u0", "", "", ""},
		{http.MethodGet, "/v1/segments/{}", "seg1", "", "", ""},
		{http.MethodDelete, "/v1/segments/{}/members", "seg1", "", "", `{"user_ids":["u1"]}`},
		{http.MethodPost, "/v1/messages", "", "", "k1", `{"deliver_at_local":"2030-01-01T09:00","if_passed":"send_now",` + audience + `,"payload":{"title":"t","data":{"k":"v"}}}`},
		{http.MethodGet, "/v1/messages", "", "state=scheduled&schedule_id=sch_1&limit=1", "", ""},
		{http.MethodGet, "/v1/messages/{}", "msg_1", "", "", ""},
		{http.MethodGet, "/v1/messages/{}/deliveries", "msg_1", "status=pending&limit=1&cursor=eyJhIjoxfQ", "", ""},
		{http.MethodDelete, "/v1/messages/{}", "msg_1", "", "", ""},
		{http.MethodPost, "/v1/schedules", "", "", "", `{"cron":"0 9 * * MON-FRI","timezone":"Europe/Berlin","local_time":true,"ttl_seconds":600,` + audience + `,"payload":{"body":"b"}}`},
		{http.MethodGet, "/v1/schedules", "", "limit=1", "", ""},
		{http.MethodGet, "/v1/schedules/{}", "sch_1", "", "", ""},
		{http.MethodPatch, "/v1/schedules/{}", "sch_1", "", "", `{"paused":true}`},
		{http.MethodDelete, "/v1/schedules/{}", "sch_1", "", "", ""},
		{http.MethodGet, "/v1/providers", "", "", "", ""},
		{http.MethodGet, "/v1/users/{}", "u0", "", "", ""},
		{http.MethodGet, "/v1/segments", "", "limit=1&cursor=eyJrIjoic2VnMSIsImYiOiJzZWdtZW50cyJ9", "", ""},
		{http.MethodGet, "/v1/segments/{}/members", "seg1", "limit=1", "", ""},
		{http.MethodDelete, "/v1/segments/{}", "seg1", "", "", ""},
		{http.MethodDelete, "/v1/users/{}", "u1", "", "", ""},
		{http.MethodPost, "/v1/keys", "", "", "", `{"name":"fuzz","scope":"read","expires_at":"2100-01-01T00:00:00Z"}`},
		{http.MethodGet, "/v1/keys", "", "limit=1", "", ""},
		{http.MethodDelete, "/v1/keys/{}", "fuzz", "", "", ""},
		{http.MethodGet, "/v1/audit", "", "key_name=fuzz&operator=admin&limit=1", "", ""},
		{http.MethodPut, "/v1/users/{}/preferences", "u0", "", "", `{"opt_outs":[{"category":"news","channel":"webpush"}],"quiet_hours":{"start":"22:00","end":"07:00"}}`},
		{http.MethodGet, "/v1/users/{}/preferences", "u0", "", "", ""},
		{http.MethodPut, "/v1/categories/{}", "marketing", "", "", `{"cap":{"count":2,"period_seconds":86400}}`},
		{http.MethodGet, "/v1/categories/{}", "marketing", "", "", ""},
		{http.MethodGet, "/v1/categories", "", "", "", ""},
		{http.MethodDelete, "/v1/categories/{}", "marketing", "", "", ""},
		{http.MethodPut, "/v1/quiet-hours", "", "", "", `{"start":"22:00","end":"07:00","timezone":"Europe/Berlin"}`},
		{http.MethodGet, "/v1/quiet-hours", "", "", "", ""},
		{http.MethodDelete, "/v1/quiet-hours", "", "", "", ""},
		{http.MethodPost, "/v1/messages", "", "", "", `{"category":"marketing","quiet_hours":"skip",` + audience + `,"payload":{"title":"t"}}`},
		{http.MethodGet, "/v1/messages/{}/deliveries", "msg_1", "status=pending&reason=quiet_hours&limit=1", "", ""},
		// msg_1 cancelled, then u1 erased: deliveries never sent, of
		// devices deleted since (a fuzzed run found them answered with
		// channel "").
		{http.MethodGet, "/v1/messages/{}/deliveries", "msg_1", "", "", ""},
	} {
		f.Add(fuzzRoute(f, s.method, s.path), s.id, s.query, s.key, []byte(s.body))
	}

	f.Fuzz(func(t *testing.T, route uint8, id, query, key string, body []byte) {
		r := fuzzRoutes[int(route)%len(fuzzRoutes)]
		// A slash in the id would make another route of it, which both
		// routers may read differently; every other byte is escaped.
		target := strings.Replace(r.path, "{}", url.PathEscape(strings.ReplaceAll(id, "/", "")), 1)
		u, err := url.Parse(target)
		if err != nil {
			t.Skip("not a path:", err)
		}
		u.RawQuery = query
		var rd io.Reader
		if len(body) > 0 {
			rd = bytes.NewReader(body)
		}
		req := httptest.NewRequest(r.method, "/", rd)
		req.URL, req.RequestURI = u, u.RequestURI()
		req.Header.Set("Authorization", "Bearer "+testKey)
		req.Header.Set("Content-Type", "application/json")
		if key != "" {
			req.Header.Set("Idempotency-Key", key)
		}
		rec := httptest.NewRecorder()
		b.srv.ServeHTTP(rec, req)
		require.Less(t, rec.Code, 500, "%s %s?%s with Idempotency-Key %q and body %q answered %s",
			r.method, u.Path, query, key, body, rec.Body.String())
		checkAgainstSpec(t, req, rec)
	})
}
