package api

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestMessageInstantsAreBounded(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.population(t, "p", 1, 1)
	audience := map[string]any{"type": "users", "ids": []string{"p0"}}
	for _, tc := range []struct {
		name   string
		fields map[string]any
		field  string
	}{
		{"default expiry past 9999", map[string]any{"dispatch_at": "9999-12-31T23:00:00Z"}, "expires_at"},
		{"dispatch_at before 1970", map[string]any{"dispatch_at": "1969-12-31T23:59:59Z", "expires_at": future(time.Hour)}, "dispatch_at"},
		{"expires_at in year 10000 by its offset", map[string]any{"dispatch_at": "9999-12-31T22:00:00Z", "expires_at": "9999-12-31T23:00:00-01:00"}, "expires_at"},
		{"expires_at after dispatch_at", map[string]any{"dispatch_at": "2999-01-01T00:00:00Z", "expires_at": "2999-01-01T00:00:00Z"}, "expires_at"},
		{"expires_at more than 28 days on", map[string]any{"dispatch_at": "2999-01-01T00:00:00Z", "expires_at": "2999-01-29T00:00:00.001Z"}, "expires_at"},
		{"default dispatch_at, expires_at more than 28 days on", map[string]any{"expires_at": future(28*24*time.Hour + time.Minute)}, "expires_at"},
		{"local wall too early", map[string]any{"deliver_at_local": "1970-01-01T13:59"}, "deliver_at_local"},
		{"local wall too late", map[string]any{"deliver_at_local": "9999-12-31T11:00"}, "deliver_at_local"},
		{"local lifetime too late", map[string]any{"deliver_at_local": "9999-12-04T00:00", "ttl_seconds": maxTTLSeconds}, "deliver_at_local"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			body := map[string]any{"audience": audience, "payload": map[string]any{"title": "x"}}
			for k, v := range tc.fields {
				body[k] = v
			}
			requireError(t, b.call(t, request{method: http.MethodPost, path: "/v1/messages", body: body}),
				http.StatusBadRequest, "invalid_field", tc.field)
		})
	}
	for _, tc := range []struct {
		name    string
		fields  map[string]any
		expires string
	}{
		{"expires_at 28 days on", map[string]any{"dispatch_at": "2999-01-01T00:00:00Z", "expires_at": "2999-01-29T00:00:00Z"}, "2999-01-29T00:00:00Z"},
		{"the last dispatch_at with its default expiry", map[string]any{"dispatch_at": "9999-12-31T22:59:59Z"}, "9999-12-31T23:59:59Z"},
		{"the last local wall time", map[string]any{"deliver_at_local": "9999-12-31T10:59"}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			body := map[string]any{"audience": audience, "payload": map[string]any{"title": "x"}}
			for k, v := range tc.fields {
				body[k] = v
			}
			status, out := b.do(t, http.MethodPost, "/v1/messages", body)
			require.Equal(t, http.StatusAccepted, status, out)
			if tc.expires != "" {
				require.Equal(t, tc.expires, out["expires_at"])
			}
		})
	}
}

func TestScheduleInstantsAreBounded(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for field, value := range map[string]string{
		"starts_at": "9999-12-31T20:00:00-05:00",
		"ends_at":   "1969-12-31T00:00:00Z",
	} {
		body := scheduleBody()
		body[field] = value
		requireError(t, b.call(t, request{method: http.MethodPost, path: "/v1/schedules", body: body}),
			http.StatusBadRequest, "invalid_field", field)
	}

	// Runs stop where their message would outlive year 9999: the last
	// day's 09:00 run lives until 10:00, a four-week lifetime no run does.
	body := scheduleBody()
	body["cron"], body["timezone"], body["starts_at"] = "0 9 * * *", "UTC", "9999-12-29T00:00:00Z"
	status, sch := b.do(t, http.MethodPost, "/v1/schedules", body)
	require.Equal(t, http.StatusCreated, status, sch)
	require.Equal(t, []any{"9999-12-29T09:00:00Z", "9999-12-30T09:00:00Z", "9999-12-31T09:00:00Z"}, sch["next_runs"])

	body["ttl_seconds"] = maxTTLSeconds
	status, sch = b.do(t, http.MethodPost, "/v1/schedules", body)
	require.Equal(t, http.StatusCreated, status, sch)
	require.Empty(t, sch["next_runs"])

	status, list := b.do(t, http.MethodGet, "/v1/schedules", nil)
	require.Equal(t, http.StatusOK, status, list)
	require.Len(t, list["items"], 2)
}
