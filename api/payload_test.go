package api

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/heraldpush/herald/jobs/push/pushtest"
)

// richPayload has every field of the payload reference set.
func richPayload(t testing.TB) map[string]any {
	t.Helper()
	raw, err := json.Marshal(pushtest.RichContent())
	require.NoError(t, err)
	var p map[string]any
	require.NoError(t, json.Unmarshal(raw, &p))
	return p
}

// TestPayloadFieldsValidated: every payload field that is wrong is refused
// with a 400 naming it, for messages and schedules alike.
func TestPayloadFieldsValidated(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.population(t, "p", 1, 1)
	set := func(path string, v any) func(map[string]any) {
		return func(p map[string]any) {
			keys := strings.Split(path, ".")
			m := p
			for _, k := range keys[:len(keys)-1] {
				m = m[k].(map[string]any)
			}
			if v == nil {
				delete(m, keys[len(keys)-1])
				return
			}
			m[keys[len(keys)-1]] = v
		}
	}
	silent := func(edit func(map[string]any)) func(map[string]any) {
		return func(p map[string]any) {
			for k := range p {
				delete(p, k)
			}
			p["silent"], p["data"] = true, map[string]any{"sync": "1"}
			edit(p)
		}
	}
	cases := []struct {
		name, field, code string
		edit              func(map[string]any)
	}{
		{"image not https", "payload.image", "invalid_field", set("image", "http://cdn.example.com/a.png")},
		{"image not a URL", "payload.image", "invalid_field", set("image", "picture")},
		{"url relative", "payload.url", "invalid_field", set("url", "/standup/42")},
		{"sound a path", "payload.sound", "invalid_field", set("sound", "../chime.caf")},
		{"negative badge", "payload.badge", "invalid_field", set("badge", -1)},
		{"badge not an integer", "payload.badge", "invalid_type", set("badge", 1.5)},
		{"badge a string", "payload.badge", "invalid_type", set("badge", "3")},
		{"silent not a boolean", "payload.silent", "invalid_type", set("silent", "yes")},
		{"interruption level", "payload.interruption_level", "invalid_field", set("interruption_level", "urgent")},
		{"relevance over 1", "payload.relevance_score", "invalid_field", set("relevance_score", 1.5)},
		{"category control character", "payload.category", "invalid_field", set("category", "A\tB")},
		{"thread id too long", "payload.thread_id", "invalid_field", set("thread_id", strings.Repeat("t", 257))},
		{"critical volume over 1", "payload.apns.critical_sound_volume", "invalid_field", set("apns.critical_sound_volume", 2)},
		{"critical volume without critical", "payload.apns.critical_sound_volume", "invalid_field", set("interruption_level", "active")},
		{"unknown apns field", "critical", "unknown_field", set("apns.critical", true)},
		{"android priority", "payload.fcm.android_priority", "invalid_field", set("fcm.android_priority", "max")},
		{"color", "payload.fcm.color", "invalid_field", set("fcm.color", "orange")},
		{"web icon not https", "payload.webpush.icon", "invalid_field", set("webpush.icon", "http://x/i.png")},
		{"web badge icon", "payload.webpush.badge_icon", "invalid_field", set("webpush.badge_icon", "badge.png")},
		{"three actions", "payload.webpush.actions", "invalid_field", set("webpush.actions", []any{
			map[string]any{"action": "a", "title": "A"}, map[string]any{"action": "b", "title": "B"}, map[string]any{"action": "c", "title": "C"},
		})},
		{"action without title", "payload.webpush.actions[1].title", "invalid_field", set("webpush.actions", []any{
			map[string]any{"action": "a", "title": "A"}, map[string]any{"action": "b"},
		})},
		{"renotify without tag", "payload.webpush.renotify", "invalid_field", set("webpush.tag", nil)},
		{"urgency", "payload.webpush.urgency", "invalid_field", set("webpush.urgency", "asap")},
		{"data key url beside url", "payload.data.url", "invalid_field", set("data", map[string]any{"url": "x"})},
		{"data key FCM reserves: from", "payload.data.from", "invalid_field", set("data", map[string]any{"from": "x"})},
		{"data key FCM reserves: message_type", "payload.data.message_type", "invalid_field", set("data", map[string]any{"message_type": "x"})},
		{"data key FCM reserves: google.", "payload.data.google.c.a.e", "invalid_field", set("data", map[string]any{"google.c.a.e": "1"})},
		{"data key FCM reserves: gcm.", "payload.data.gcm.n.e", "invalid_field", set("data", map[string]any{"gcm.n.e": "1"})},
		{"data key FCM reserves: collapse_key", "payload.data.collapse_key", "invalid_field", set("data", map[string]any{"collapse_key": "x"})},
		{"silent with a title", "payload.title", "invalid_field", silent(set("title", "t"))},
		{"silent with a badge", "payload.badge", "invalid_field", silent(set("badge", 1))},
		{"silent with a sound", "payload.sound", "invalid_field", silent(set("sound", "default"))},
		{"data key title with data_only", "payload.data.title", "invalid_field", func(p map[string]any) {
			p["fcm"].(map[string]any)["data_only"] = true
			p["data"] = map[string]any{"title": "x"}
		}},
		{"data_only not a boolean", "payload.fcm.data_only", "invalid_type", set("fcm.data_only", "yes")},
		{"silent with data_only", "payload.fcm.data_only", "invalid_field", silent(func(p map[string]any) { p["fcm"] = map[string]any{"data_only": true} })},
	}
	for _, tc := range cases {
		for _, path := range []string{"/v1/messages", "/v1/schedules"} {
			t.Run(tc.name+path, func(t *testing.T) {
				t.Parallel()
				payload := richPayload(t)
				tc.edit(payload)
				body := messageBody(map[string]any{"type": "users", "ids": []string{"p0"}})
				if path == "/v1/schedules" {
					body = scheduleBody()
				}
				body["payload"] = payload
				rec := b.call(t, request{method: http.MethodPost, path: path, body: body})
				requireError(t, rec, http.StatusBadRequest, tc.code, tc.field)
			})
		}
	}
}

// TestPayloadReadBack: a message and a schedule give back the payload they
// were made with, every field as sent; a silent payload is accepted.
func TestPayloadReadBack(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.population(t, "r", 1, 1)
	rich := richPayload(t)
	wantJSON, err := json.Marshal(rich)
	require.NoError(t, err)

	body := messageBody(map[string]any{"type": "users", "ids": []string{"r0"}})
	body["payload"] = rich
	status, created := b.do(t, http.MethodPost, "/v1/messages", body)
	require.Equal(t, http.StatusAccepted, status, created)
	id := created["message_id"].(string)
	_, got := b.do(t, http.MethodGet, "/v1/messages/"+id, nil)
	requireSameJSON(t, wantJSON, got["payload"])
	_, list := b.do(t, http.MethodGet, "/v1/messages", nil)
	requireSameJSON(t, wantJSON, list["items"].([]any)[0].(map[string]any)["payload"])

	sb := scheduleBody()
	sb["payload"] = rich
	status, sched := b.do(t, http.MethodPost, "/v1/schedules", sb)
	require.Equal(t, http.StatusCreated, status, sched)
	requireSameJSON(t, wantJSON, sched["payload"])
	_, got = b.do(t, http.MethodGet, "/v1/schedules/"+sched["schedule_id"].(string), nil)
	requireSameJSON(t, wantJSON, got["payload"])
	_, list = b.do(t, http.MethodGet, "/v1/schedules", nil)
	requireSameJSON(t, wantJSON, list["items"].([]any)[0].(map[string]any)["payload"])

	body["payload"] = map[string]any{"silent": true}
	status, created = b.do(t, http.MethodPost, "/v1/messages", body)
	require.Equal(t, http.StatusAccepted, status, "a silent push needs no data: it wakes the app")
	_, got = b.do(t, http.MethodGet, "/v1/messages/"+created["message_id"].(string), nil)
	require.Equal(t, map[string]any{"silent": true}, got["payload"])
}

func requireSameJSON(t testing.TB, want []byte, got any) {
	t.Helper()
	raw, err := json.Marshal(got)
	require.NoError(t, err)
	require.JSONEq(t, string(want), string(raw))
}

// TestAttackPayloadURLSchemes is issue #26's item 10: payload.url took any
// absolute URL, so a caller could make a tap run javascript:, open a data:
// document or a local file:. It is https with a host, or an app's own
// custom scheme; a scheme that a browser or an OS would act on is refused
// with a 400 naming payload.url, however it is cased or spelt.
func TestAttackPayloadURLSchemes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.population(t, "u", 1, 1)
	send := func(t *testing.T, u string) *httptest.ResponseRecorder {
		body := messageBody(map[string]any{"type": "users", "ids": []string{"u0"}})
		body["payload"] = map[string]any{"title": "t", "url": u}
		return b.call(t, request{method: http.MethodPost, path: "/v1/messages", body: body})
	}
	for _, u := range []string{
		"https://example.com/standup/42",
		"HTTPS://example.com/",
		"myapp://standup/42",
		"com.example.app:/standup?id=42",
		"my-app+beta.v2://x",
	} {
		t.Run("accepts "+u, func(t *testing.T) {
			t.Parallel()
			rec := send(t, u)
			require.Equal(t, http.StatusAccepted, rec.Code, rec.Body.String())
		})
	}
	for _, u := range []string{
		"javascript:alert(document.cookie)",
		"JavaScript:alert(1)",
		"javascript://%0aalert(1)",
		"vbscript:msgbox(1)",
		"data:text/html,<script>alert(1)</script>",
		"file:///etc/passwd",
		"blob:https://example.com/uuid",
		"about:blank",
		"http://example.com/",
		"ftp://example.com/",
		"view-source:https://example.com/",
		"intent://scan/#Intent;scheme=zxing;end",
		"filesystem:https://example.com/temporary/x",
		"ws://example.com/",
		"https:///no-host",
		"https://exa mple.com/",
		" javascript:alert(1)",
		"java\tscript:alert(1)",
		"myapp:",
		"1app://x",
		"/standup/42",
	} {
		t.Run("refuses "+u, func(t *testing.T) {
			t.Parallel()
			requireError(t, send(t, u), http.StatusBadRequest, "invalid_field", "payload.url")
		})
	}
}
