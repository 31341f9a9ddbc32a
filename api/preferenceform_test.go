package api

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/heraldpush/herald/jobs/preferences"
)

// putUserOf makes user, in zone when one is given.
func (b *bundle) putUserOf(t testing.TB, user, zone string) {
	t.Helper()
	body := map[string]any{}
	if zone != "" {
		body["timezone"] = zone
	}
	rec := b.call(t, request{method: http.MethodPut, path: "/v1/users/" + user, body: body})
	require.Contains(t, []int{http.StatusOK, http.StatusCreated}, rec.Code, rec.Body.String())
}

// formLinkOf asks for a link to user's form with body (none when nil) and
// returns the answer, which must be a 201.
func (b *bundle) formLinkOf(t testing.TB, user string, body any) map[string]any {
	t.Helper()
	rec := b.call(t, request{method: http.MethodPost, path: "/v1/users/" + user + "/preferences/link", body: body})
	require.Equal(t, http.StatusCreated, rec.Code, rec.Body.String())
	return decodeBody(t, rec)
}

// linkToken is a fresh link's token for user.
func (b *bundle) linkToken(t testing.TB, user string) string {
	t.Helper()
	return b.formLinkOf(t, user, nil)["token"].(string)
}

// formCall calls one of the form's routes through h, as the form does:
// with token as its bearer token (none when empty) and body as JSON (none
// when nil). The answer is held to openapi.yaml.
func formCall(t testing.TB, h http.Handler, method, path, token string, body any) *httptest.ResponseRecorder {
	t.Helper()
	var r io.Reader
	if body != nil {
		raw, err := json.Marshal(body)
		require.NoError(t, err)
		r = bytes.NewReader(raw)
	}
	req := httptest.NewRequest(method, path, r)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	checkAgainstSpec(t, req, rec)
	return rec
}

// storedPreferences is what user_preferences holds of user: its opt-outs
// and quiet hours ("" when none), or ok false when it holds no row.
func (b *bundle) storedPreferences(t testing.TB, user string) (optOuts []string, quiet string, ok bool) {
	t.Helper()
	p, err := b.q.GetUserPreferences(context.Background(), user)
	require.NoError(t, err)
	if p.UpdatedAt == nil {
		return p.OptOuts, "", false
	}
	if q := storedQuietHours(p.QuietStart, p.QuietEnd); q != nil {
		quiet = q.Start + "-" + q.End
	}
	return p.OptOuts, quiet, true
}

// TestPreferencesLink: a send key asks for a link to a user's form and
// gets the form's URL with the token in its fragment, good for 30 days or
// the ttl asked for, within its bounds; an unknown user is a 404, and the
// URL is under HERALD_PUBLIC_URL when it is set.
func TestPreferencesLink(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.putUserOf(t, "ann", "")

	before := time.Now().Truncate(time.Second)
	link := b.formLinkOf(t, "ann", nil)
	tok := link["token"].(string)
	require.Equal(t, "http://example.com/preferences#token="+tok, link["url"], "the request's own host without HERALD_PUBLIC_URL")
	expires, err := time.Parse(time.RFC3339, link["expires_at"].(string))
	require.NoError(t, err)
	require.WithinRange(t, expires, before.Add(defaultLinkTTL), time.Now().Add(defaultLinkTTL))
	got, until, err := b.srv.linkSigner.Load().Verify(tok, time.Now())
	require.NoError(t, err)
	require.Equal(t, "ann", got.UserID)
	require.True(t, until.Equal(expires), "the token holds the expiry answered")

	for ttl, want := range map[int64]time.Duration{300: 5 * time.Minute, 366 * 86400: maxLinkTTL} {
		link = b.formLinkOf(t, "ann", map[string]any{"ttl_seconds": ttl})
		expires, err := time.Parse(time.RFC3339, link["expires_at"].(string))
		require.NoError(t, err)
		require.WithinRange(t, expires, before.Add(want), time.Now().Add(want))
	}
	require.NotEmpty(t, b.formLinkOf(t, "ann", map[string]any{})["token"], "an empty body takes the default")
	for _, bad := range []any{map[string]any{"ttl_seconds": 299}, map[string]any{"ttl_seconds": 366*86400 + 1},
		map[string]any{"ttl_seconds": -1}, map[string]any{"ttl_seconds": "1h"}, map[string]any{"ttl": 300}} {
		rec := b.call(t, request{method: http.MethodPost, path: "/v1/users/ann/preferences/link", body: bad})
		require.Equal(t, http.StatusBadRequest, rec.Code, "%v: %s", bad, rec.Body.String())
	}
	requireError(t, b.call(t, request{method: http.MethodPost, path: "/v1/users/ann/preferences/link", body: map[string]any{"ttl_seconds": 60}}),
		http.StatusBadRequest, "invalid_field", "ttl_seconds")

	requireError(t, b.call(t, request{method: http.MethodPost, path: "/v1/users/nobody/preferences/link"}), http.StatusNotFound, "not_found", "")
	requireError(t, b.call(t, request{method: http.MethodPost, path: "/v1/users/not%20an%20id/preferences/link"}), http.StatusNotFound, "not_found", "")
	read := b.makeKey(t, "reader", ScopeRead, nil)
	requireError(t, b.call(t, as(read, request{method: http.MethodPost, path: "/v1/users/ann/preferences/link"})), http.StatusForbidden, "forbidden", "")

	behind := setupWith(t, b.db, Config{PublicURL: "https://push.example.com/"})
	link = behind.formLinkOf(t, "ann", nil)
	require.Equal(t, "https://push.example.com/preferences#token="+link["token"].(string), link["url"])
}

// TestPreferencesFormRoundTrip: the token of a link reads its user's
// preferences, with the declared categories, the zone and the
// installation's quiet hours, and replaces them, through both listeners;
// it reaches no other user, and the settings are held to the keyed
// route's rules.
func TestPreferencesFormRoundTrip(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	_, err := b.db.Pool.Exec(ctx, `INSERT INTO categories (name, critical) VALUES ('marketing', false), ('security', true);
		INSERT INTO quiet_hours_default (quiet_start, quiet_end, timezone) VALUES ('22:00', '07:00', 'Europe/Paris')`)
	require.NoError(t, err)
	b.putUserOf(t, "ann", "Europe/Berlin")
	b.putUserOf(t, "bob", "")
	ann, bob := b.linkToken(t, "ann"), b.linkToken(t, "bob")

	rec := formCall(t, b.srv, http.MethodGet, "/v1/preferences", ann, nil)
	require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
	require.Equal(t, "no-store", rec.Header().Get("Cache-Control"))
	require.Empty(t, rec.Header().Get("Access-Control-Allow-Origin"), "the form's own origin only")
	require.JSONEq(t, `{"opt_outs": [], "quiet_hours": null, "timezone": "Europe/Berlin",
		"default_quiet_hours": {"start": "22:00", "end": "07:00"},
		"categories": [{"name": "marketing", "critical": false}, {"name": "security", "critical": true}],
		"updated_at": null}`, rec.Body.String())
	rec = formCall(t, b.srv.PublicHandler(), http.MethodGet, "/v1/preferences", bob, nil)
	require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
	require.Equal(t, "Europe/Paris", decodeBody(t, rec)["timezone"], "a user without a zone keeps the installation's")

	// Ann's form, through the public listener: one opt-out of a category
	// on every channel, one on a channel, one of a category nobody
	// declared, and quiet hours of her own.
	settings := map[string]any{
		"opt_outs":    []map[string]any{{"category": "marketing", "channel": "webpush"}, {"category": "weekly-digest"}, {"category": "marketing"}, {"category": "marketing"}},
		"quiet_hours": map[string]any{"start": "23:00", "end": "06:30"},
	}
	rec = formCall(t, b.srv.PublicHandler(), http.MethodPut, "/v1/preferences", ann, settings)
	require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
	answer := decodeBody(t, rec)
	require.Equal(t, []any{map[string]any{"category": "marketing"}, map[string]any{"category": "marketing", "channel": "webpush"},
		map[string]any{"category": "weekly-digest"}}, answer["opt_outs"], "in one order, without repeats")
	require.Equal(t, map[string]any{"start": "23:00", "end": "06:30"}, answer["quiet_hours"])
	require.NotNil(t, answer["updated_at"])
	optOuts, quiet, ok := b.storedPreferences(t, "ann")
	require.True(t, ok)
	require.Equal(t, []string{"marketing", "marketing:webpush", "weekly-digest"}, optOuts)
	require.Equal(t, "23:00-06:30", quiet)
	_, _, ok = b.storedPreferences(t, "bob")
	require.False(t, ok, "ann's token reached bob")

	// Read back through the main listener; then bob's token sets bob's,
	// and ann's stay.
	rec = formCall(t, b.srv, http.MethodGet, "/v1/preferences", ann, nil)
	require.Equal(t, answer, decodeBody(t, rec))
	rec = formCall(t, b.srv, http.MethodPut, "/v1/preferences", bob, map[string]any{"opt_outs": []any{}, "quiet_hours": map[string]any{"start": "00:00", "end": "00:00"}})
	require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
	optOuts, quiet, _ = b.storedPreferences(t, "bob")
	require.Empty(t, optOuts)
	require.Equal(t, "00:00-00:00", quiet, "equal ends: no quiet hours, not the installation's")
	optOuts, quiet, _ = b.storedPreferences(t, "ann")
	require.Equal(t, []string{"marketing", "marketing:webpush", "weekly-digest"}, optOuts)
	require.Equal(t, "23:00-06:30", quiet)

	// Null quiet hours are the installation's again.
	rec = formCall(t, b.srv, http.MethodPut, "/v1/preferences", ann, map[string]any{"opt_outs": []any{}, "quiet_hours": nil})
	require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
	require.Nil(t, decodeBody(t, rec)["quiet_hours"])

	// The keyed route's rules, and nothing of a refused request is kept.
	for field, bad := range map[string]map[string]any{
		"opt_outs[0].channel":  {"opt_outs": []map[string]any{{"category": "marketing", "channel": "sms"}}},
		"opt_outs[1].category": {"opt_outs": []map[string]any{{"category": "marketing"}, {"category": "Marketing!"}}},
		"quiet_hours":          {"quiet_hours": map[string]any{"start": "25:00", "end": "07:00"}},
	} {
		requireError(t, formCall(t, b.srv, http.MethodPut, "/v1/preferences", ann, bad), http.StatusBadRequest, "invalid_field", field)
	}
	rec = formCall(t, b.srv, http.MethodPut, "/v1/preferences", ann, map[string]any{"opt_outs": []any{}, "user_id": "bob"})
	require.Equal(t, http.StatusBadRequest, rec.Code, "an unknown field: %s", rec.Body.String())
	optOuts, quiet, _ = b.storedPreferences(t, "ann")
	require.Empty(t, optOuts)
	require.Empty(t, quiet)
}

// TestPreferencesFormRefusesBadTokens: without a token, with one changed,
// signed under another key, past its expiry, or with an API key in its
// place, the form's routes answer 401 and say why.
func TestPreferencesFormRefusesBadTokens(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.putUserOf(t, "ann", "")
	b.putUserOf(t, "bob", "")
	good := b.linkToken(t, "ann")
	since, err := b.q.UserCreatedAt(context.Background(), "ann")
	require.NoError(t, err)
	ann := preferences.Link{UserID: "ann", UserSince: since}

	// Bob's id in ann's token, its MAC kept: refused as changed.
	other, err := preferences.NewLinkSigner(bytes.Repeat([]byte{9}, preferences.LinkKeySize))
	require.NoError(t, err)
	changed := []byte(good)
	changed[len(changed)/2] ^= 0x01
	expired := b.srv.linkSigner.Load().Sign(ann, time.Now().Add(-time.Second))
	for _, h := range []http.Handler{b.srv, b.srv.PublicHandler()} {
		for _, method := range []string{http.MethodGet, http.MethodPut} {
			var body any
			if method == http.MethodPut {
				body = map[string]any{"opt_outs": []map[string]any{{"category": "marketing"}}}
			}
			for tok, code := range map[string]string{
				"":              "invalid_token",
				string(changed): "invalid_token",
				other.Sign(ann, time.Now().Add(time.Hour)): "invalid_token",
				testKey: "invalid_token",
				expired: "token_expired",
			} {
				rec := formCall(t, h, method, "/v1/preferences", tok, body)
				requireError(t, rec, http.StatusUnauthorized, code, "")
				require.Contains(t, rec.Header().Get("WWW-Authenticate"), `realm="herald-preferences"`)
			}
		}
	}
	_, _, ok := b.storedPreferences(t, "ann")
	require.False(t, ok, "a refused token wrote nothing")
	// A token is taken however the scheme is written, and only as Bearer.
	req := httptest.NewRequest(http.MethodGet, "/v1/preferences", nil)
	req.Header.Set("Authorization", "bearer "+good)
	rec := httptest.NewRecorder()
	b.srv.ServeHTTP(rec, req)
	require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
	req.Header.Set("Authorization", "Basic "+good)
	rec = httptest.NewRecorder()
	b.srv.ServeHTTP(rec, req)
	require.Equal(t, http.StatusUnauthorized, rec.Code, rec.Body.String())
}

// TestPreferencesFormOfAnErasedUser: once a user is erased, a link made
// before opens nothing (410), writes nothing, and makes no user again, even
// after the same id is used for a new user; a new link works for the new
// one.
func TestPreferencesFormOfAnErasedUser(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.putUserOf(t, "carl", "Europe/Rome")
	old := b.linkToken(t, "carl")
	rec := formCall(t, b.srv, http.MethodPut, "/v1/preferences", old, map[string]any{"opt_outs": []map[string]any{{"category": "marketing"}}})
	require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
	require.Equal(t, http.StatusNoContent, b.call(t, request{method: http.MethodDelete, path: "/v1/users/carl"}).Code)

	count := func() (users, prefs int) {
		require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM users WHERE id = 'carl'),
			(SELECT count(*) FROM user_preferences WHERE user_id = 'carl')`).Scan(&users, &prefs))
		return users, prefs
	}
	for _, h := range []http.Handler{b.srv, b.srv.PublicHandler()} {
		requireError(t, formCall(t, h, http.MethodGet, "/v1/preferences", old, nil), http.StatusGone, "user_erased", "")
		requireError(t, formCall(t, h, http.MethodPut, "/v1/preferences", old, map[string]any{"opt_outs": []map[string]any{{"category": "marketing"}}}),
			http.StatusGone, "user_erased", "")
	}
	users, prefs := count()
	require.Zero(t, users, "the user was made again")
	require.Zero(t, prefs, "preferences were written again")

	// The id used again: the old link is still no one's.
	b.putUserOf(t, "carl", "")
	requireError(t, formCall(t, b.srv, http.MethodGet, "/v1/preferences", old, nil), http.StatusGone, "user_erased", "")
	requireError(t, formCall(t, b.srv, http.MethodPut, "/v1/preferences", old, map[string]any{"opt_outs": []any{}}), http.StatusGone, "user_erased", "")
	_, prefs = count()
	require.Zero(t, prefs)
	rec = formCall(t, b.srv, http.MethodGet, "/v1/preferences", b.linkToken(t, "carl"), nil)
	require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
	require.Empty(t, decodeBody(t, rec)["opt_outs"], "the new carl has none of the old one's")
}

// TestPreferencesFormRateLimitPerAddress: the form's calls are limited per
// client address, in the receipts' buckets, before the token is checked.
func TestPreferencesFormRateLimitPerAddress(t *testing.T) {
	t.Parallel()
	b := setupWith(t, dbtestNew(t), Config{ReceiptRateLimit: 0.01, ReceiptRateBurst: 2})
	b.putUserOf(t, "ann", "")
	tok := b.linkToken(t, "ann")
	from := func(addr, method string) *httptest.ResponseRecorder {
		req := httptest.NewRequest(method, "/v1/preferences", strings.NewReader(`{"opt_outs":[]}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+tok)
		req.RemoteAddr = addr
		rec := httptest.NewRecorder()
		b.srv.PublicHandler().ServeHTTP(rec, req)
		checkAgainstSpec(t, req, rec)
		return rec
	}
	require.Equal(t, http.StatusOK, from("198.51.100.7:4000", http.MethodGet).Code)
	require.Equal(t, http.StatusOK, from("198.51.100.7:4001", http.MethodPut).Code)
	rec := from("198.51.100.7:4002", http.MethodGet)
	requireError(t, rec, http.StatusTooManyRequests, "rate_limited", "")
	require.NotEmpty(t, rec.Header().Get("Retry-After"))
	requireError(t, from("198.51.100.7:4002", http.MethodPut), http.StatusTooManyRequests, "rate_limited", "")
	require.Equal(t, http.StatusOK, from("198.51.100.8:4000", http.MethodGet).Code, "another address")
}

// TestPreferencesFormPage: both listeners serve the form's page, script
// and style, to be checked again before each use, the page kept to its own
// files; nothing else under /preferences/.
func TestPreferencesFormPage(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, h := range []http.Handler{b.srv, b.srv.PublicHandler()} {
		get := func(method, path string) *httptest.ResponseRecorder {
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequest(method, path, nil))
			return rec
		}
		rec := get(http.MethodGet, "/preferences")
		require.Equal(t, http.StatusOK, rec.Code)
		require.Equal(t, "text/html; charset=utf-8", rec.Header().Get("Content-Type"))
		require.Contains(t, rec.Body.String(), `<form id="form"`)
		require.Contains(t, rec.Header().Get("Content-Security-Policy"), "script-src 'self'")
		require.Contains(t, rec.Header().Get("Content-Security-Policy"), "connect-src 'self'")
		require.Equal(t, "no-referrer", rec.Header().Get("Referrer-Policy"))
		require.Equal(t, "no-cache", rec.Header().Get("Cache-Control"))
		head := get(http.MethodHead, "/preferences")
		require.Equal(t, http.StatusOK, head.Code)
		require.Empty(t, head.Body.String())

		for file, kind := range map[string]string{"form.js": "javascript", "form.css": "text/css"} {
			rec := get(http.MethodGet, "/preferences/"+file)
			require.Equal(t, http.StatusOK, rec.Code, file)
			require.Contains(t, rec.Header().Get("Content-Type"), kind, file)
			require.Equal(t, "no-cache", rec.Header().Get("Cache-Control"), file)
			require.Contains(t, get(http.MethodGet, "/preferences").Body.String(), `"preferences/`+file+`"`, "the page uses %s", file)
		}
		for _, path := range []string{"/preferences/", "/preferences/index.html", "/preferences/nothing.js"} {
			require.Equal(t, http.StatusNotFound, get(http.MethodGet, path).Code, path)
		}
	}
}
