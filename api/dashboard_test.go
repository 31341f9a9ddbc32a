package api

import (
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/heraldpush/herald/jobs/push"
)

const testAdminPassword = "correct horse battery staple"

// dashBundle is a server with the dashboard on and a stand-in for River UI
// that counts the requests that reach it.
type dashBundle struct {
	*bundle
	riverUIHits *atomic.Int64
}

func setupDashboard(t *testing.T) *dashBundle {
	t.Helper()
	hits := &atomic.Int64{}
	stub := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		_, _ = w.Write([]byte("river ui"))
	})
	b := setupWith(t, dbtestNew(t), Config{AdminPassword: testAdminPassword, RiverUI: stub})
	return &dashBundle{bundle: b, riverUIHits: hits}
}

// browse makes a request as a browser on the same site would: with the
// session cookie (when given) and without any API key.
func (b *dashBundle) browse(method, path, body string, session *http.Cookie, header map[string]string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(method, path, strings.NewReader(body))
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if session != nil {
		req.AddCookie(session)
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	rec := httptest.NewRecorder()
	b.srv.ServeHTTP(rec, req)
	return rec
}

func (b *dashBundle) postLogin(user, password string, mutate func(*http.Request)) *httptest.ResponseRecorder {
	form := url.Values{"username": {user}, "password": {password}, "next": {"/#/providers"}}
	req := httptest.NewRequest(http.MethodPost, "/login", strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	if mutate != nil {
		mutate(req)
	}
	rec := httptest.NewRecorder()
	b.srv.ServeHTTP(rec, req)
	return rec
}

func sessionCookieOf(t testing.TB, rec *httptest.ResponseRecorder) *http.Cookie {
	t.Helper()
	for _, c := range rec.Result().Cookies() {
		if c.Name == sessionCookie {
			return c
		}
	}
	return nil
}

// login signs in and returns the session cookie and its CSRF token.
func (b *dashBundle) login(t testing.TB) (*http.Cookie, string) {
	t.Helper()
	rec := b.postLogin(adminUser, testAdminPassword, nil)
	require.Equal(t, http.StatusSeeOther, rec.Code, rec.Body.String())
	ck := sessionCookieOf(t, rec)
	require.NotNil(t, ck)
	rec = b.browse(http.MethodGet, "/ui/api/session", "", ck, nil)
	require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
	var s struct {
		CSRFToken string `json:"csrf_token"`
		RiverUI   bool   `json:"river_ui"`
	}
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &s))
	require.NotEmpty(t, s.CSRFToken)
	require.True(t, s.RiverUI)
	return ck, s.CSRFToken
}

func TestDashboardRefusesWithoutSession(t *testing.T) {
	t.Parallel()
	b := setupDashboard(t)
	forged := &http.Cookie{Name: sessionCookie, Value: "4102444800.bm9uY2U.forged-mac"}
	for _, session := range []*http.Cookie{nil, forged} {
		// Pages send the browser to the login form.
		for _, path := range []string{"/", "/riverui/", "/riverui/jobs?state=available"} {
			rec := b.browse(http.MethodGet, path, "", session, nil)
			require.Equal(t, http.StatusSeeOther, rec.Code, path)
			require.True(t, strings.HasPrefix(rec.Header().Get("Location"), "/login?next="), path)
			require.NotContains(t, rec.Body.String(), "<html", path)
		}
		// APIs, the dashboard's and River UI's, answer 401.
		for _, r := range []struct{ method, path string }{
			{http.MethodGet, "/ui/api/session"},
			{http.MethodGet, "/ui/api/messages"},
			{http.MethodGet, "/ui/api/providers"},
			{http.MethodGet, "/ui/api/apps"},
			{http.MethodPost, "/ui/api/messages"},
			{http.MethodDelete, "/ui/api/messages/msg_1"},
			{http.MethodGet, "/riverui/api/jobs?state=available"},
			{http.MethodPost, "/riverui/api/jobs/cancel"},
			{http.MethodPost, "/riverui/api/jobs/retry"},
		} {
			rec := b.browse(r.method, r.path, "", session, nil)
			requireError(t, rec, http.StatusUnauthorized, "unauthorized", "")
		}
	}
	require.Zero(t, b.riverUIHits.Load(), "River UI was reached without a session")

	// The API keys open /v1 only, not the dashboard.
	rec := b.browse(http.MethodGet, "/ui/api/messages", "", nil, map[string]string{"Authorization": "Bearer " + testKey})
	require.Equal(t, http.StatusUnauthorized, rec.Code)
}

func TestDashboardLogin(t *testing.T) {
	t.Parallel()
	b := setupDashboard(t)

	rec := b.browse(http.MethodGet, "/login?next=/riverui/", "", nil, nil)
	require.Equal(t, http.StatusOK, rec.Code)
	require.Contains(t, rec.Body.String(), `value="/riverui/"`)
	require.NotEmpty(t, rec.Header().Get("Content-Security-Policy"))

	for name, creds := range map[string][2]string{
		"wrong password": {adminUser, "correct horse battery stapler"},
		"empty password": {adminUser, ""},
		"wrong user":     {"root", testAdminPassword},
	} {
		rec := b.postLogin(creds[0], creds[1], nil)
		require.Equal(t, http.StatusUnauthorized, rec.Code, name)
		require.Nil(t, sessionCookieOf(t, rec), name)
		require.Contains(t, rec.Body.String(), "The user or password is wrong.", name)
	}

	// A login form posted from another site is refused: login CSRF.
	rec = b.postLogin(adminUser, testAdminPassword, func(r *http.Request) { r.Header.Set("Sec-Fetch-Site", "cross-site") })
	require.Equal(t, http.StatusForbidden, rec.Code)
	require.Nil(t, sessionCookieOf(t, rec))

	rec = b.postLogin(adminUser, testAdminPassword, nil)
	require.Equal(t, http.StatusSeeOther, rec.Code)
	require.Equal(t, "/#/providers", rec.Header().Get("Location"))
	ck := sessionCookieOf(t, rec)
	require.NotNil(t, ck)
	require.True(t, ck.HttpOnly)
	require.Equal(t, http.SameSiteStrictMode, ck.SameSite)
	require.Equal(t, "/", ck.Path)
	require.False(t, ck.Secure, "a plain-HTTP login cannot use a Secure cookie")
	require.WithinDuration(t, time.Now().Add(sessionLifetime), ck.Expires, time.Minute)

	// Over TLS the cookie is Secure.
	rec = b.postLogin(adminUser, testAdminPassword, func(r *http.Request) { r.TLS = &tls.ConnectionState{} })
	require.True(t, sessionCookieOf(t, rec).Secure)

	rec = b.browse(http.MethodGet, "/", "", ck, nil)
	require.Equal(t, http.StatusOK, rec.Code)
	require.Contains(t, rec.Body.String(), `<script src="/assets/app.js"`)
	require.Contains(t, rec.Header().Get("Content-Security-Policy"), "script-src 'self'")
	rec = b.browse(http.MethodGet, "/assets/app.js", "", nil, nil)
	require.Equal(t, http.StatusOK, rec.Code)
}

func TestSafeNext(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"":                     "/",
		"/":                    "/",
		"/riverui/":            "/riverui/",
		"/#/messages/msg_1":    "/#/messages/msg_1",
		"//evil.example/":      "/",
		"/\\evil.example/":     "/",
		"https://evil.example": "/",
		"/login?next=/":        "/",
		// Browsers drop tabs and newlines and read a backslash as a slash,
		// which would make each of these //evil.example.
		"/\t/evil.example":     "/",
		"/\n/evil.example":     "/",
		"/\r\n/evil.example":   "/",
		"/\t\\evil.example":    "/",
		"\t//evil.example":     "/",
		" //evil.example":      "/",
		"/\x00/evil.example":   "/",
		"/\x7f/evil.example":   "/",
		"/\u0085/evil.example": "/",
		"/riverui/\\x":         "/",
		"https:/evil.example":  "/",
		"javascript:alert(1)":  "/",
		"/%2F/evil.example":    "/%2F/evil.example",
		"/riverui/jobs?q=1":    "/riverui/jobs?q=1",
	} {
		require.Equal(t, want, safeNext(in), in)
	}
}

func TestDashboardCSRF(t *testing.T) {
	t.Parallel()
	b := setupDashboard(t)
	ck, csrf := b.login(t)
	other, otherCSRF := b.login(t)
	require.NotEqual(t, csrf, otherCSRF, "each session has its own CSRF token")

	body := `{"audience":{"type":"users","ids":["u1"]},"payload":{"title":"hi"}}`
	for name, header := range map[string]map[string]string{
		"no token":          nil,
		"wrong token":       {csrfHeader: "not-the-token"},
		"another session's": {csrfHeader: otherCSRF},
	} {
		rec := b.browse(http.MethodPost, "/ui/api/messages", body, ck, header)
		require.Equal(t, http.StatusForbidden, rec.Code, name)
		requireError(t, rec, http.StatusForbidden, "csrf_failed", "")
	}
	for _, r := range []struct{ method, path, body string }{
		{http.MethodDelete, "/ui/api/messages/msg_1", ""},
		{http.MethodPatch, "/ui/api/schedules/sch_1", `{"paused":true}`},
	} {
		rec := b.browse(r.method, r.path, r.body, ck, nil)
		requireError(t, rec, http.StatusForbidden, "csrf_failed", "")
	}
	// With the token but from another site: refused all the same.
	rec := b.browse(http.MethodPost, "/ui/api/messages", body, ck, map[string]string{csrfHeader: csrf, "Sec-Fetch-Site": "cross-site"})
	requireError(t, rec, http.StatusForbidden, "cross_origin", "")
	rec = b.browse(http.MethodPost, "/riverui/api/jobs/cancel", `{"ids":["1"]}`, ck, map[string]string{"Origin": "https://evil.example"})
	requireError(t, rec, http.StatusForbidden, "cross_origin", "")
	require.Zero(t, b.riverUIHits.Load())

	// With its own token, the same call goes through.
	rec = b.browse(http.MethodPost, "/ui/api/messages", body, ck, map[string]string{csrfHeader: csrf, "Sec-Fetch-Site": "same-origin"})
	require.Equal(t, http.StatusAccepted, rec.Code, rec.Body.String())
	rec = b.browse(http.MethodGet, "/riverui/", "", other, nil)
	require.Equal(t, http.StatusOK, rec.Code)
	require.Equal(t, "river ui", rec.Body.String())
	require.EqualValues(t, 1, b.riverUIHits.Load())
}

func TestDashboardIdempotencyHasItsOwnScope(t *testing.T) {
	t.Parallel()
	b := setupDashboard(t)
	ck, csrf := b.login(t)
	msg := func(title string) map[string]any {
		return map[string]any{"audience": map[string]any{"type": "users", "ids": []string{"u1"}}, "payload": map[string]any{"title": title}}
	}
	rec := b.call(t, request{method: http.MethodPost, path: "/v1/messages", body: msg("by API"), header: map[string]string{"Idempotency-Key": "k1"}})
	require.Equal(t, http.StatusAccepted, rec.Code)
	viaAPI := decodeBody(t, rec)["message_id"]

	// The same key through the dashboard, with another body, is another
	// caller's key: no 409, and a message of its own.
	raw, err := json.Marshal(msg("by dashboard"))
	require.NoError(t, err)
	hdr := map[string]string{csrfHeader: csrf, "Idempotency-Key": "k1"}
	rec = b.browse(http.MethodPost, "/ui/api/messages", string(raw), ck, hdr)
	require.Equal(t, http.StatusAccepted, rec.Code, rec.Body.String())
	viaDashboard := decodeBody(t, rec)["message_id"]
	require.NotEqual(t, viaAPI, viaDashboard)

	// And within the dashboard's scope the key replays.
	rec = b.browse(http.MethodPost, "/ui/api/messages", string(raw), ck, hdr)
	require.Equal(t, http.StatusAccepted, rec.Code)
	require.Equal(t, viaDashboard, decodeBody(t, rec)["message_id"])
}

func TestDashboardLogoutAndExpiry(t *testing.T) {
	t.Parallel()
	b := setupDashboard(t)
	ck, csrf := b.login(t)

	rec := b.browse(http.MethodPost, "/logout", "", ck, nil)
	requireError(t, rec, http.StatusForbidden, "csrf_failed", "")
	require.Equal(t, http.StatusOK, b.browse(http.MethodGet, "/ui/api/messages", "", ck, nil).Code)

	rec = b.browse(http.MethodPost, "/logout", "", ck, map[string]string{csrfHeader: csrf})
	require.Equal(t, http.StatusNoContent, rec.Code)
	cleared := sessionCookieOf(t, rec)
	require.NotNil(t, cleared)
	require.Negative(t, cleared.MaxAge)
	// The old cookie no longer opens anything, even if it was kept.
	require.Equal(t, http.StatusUnauthorized, b.browse(http.MethodGet, "/ui/api/messages", "", ck, nil).Code)

	// A session ends by itself after sessionLifetime.
	ck, _ = b.login(t)
	require.Equal(t, http.StatusOK, b.browse(http.MethodGet, "/ui/api/messages", "", ck, nil).Code)
	b.srv.sessions.now = func() time.Time { return time.Now().Add(sessionLifetime + time.Second) }
	require.Equal(t, http.StatusUnauthorized, b.browse(http.MethodGet, "/ui/api/messages", "", ck, nil).Code)
}

// TestDashboardWithoutAdminPassword: without HERALD_ADMIN_PASSWORD no one
// signs in as admin, whatever password is given (an empty one included),
// and the pages still stay behind the login.
func TestDashboardWithoutAdminPassword(t *testing.T) {
	t.Parallel()
	b := &dashBundle{bundle: setup(t)}
	for _, password := range []string{"", testAdminPassword} {
		rec := b.postLogin(adminUser, password, nil)
		require.Equal(t, http.StatusUnauthorized, rec.Code)
		require.Nil(t, sessionCookieOf(t, rec))
	}
	require.Equal(t, http.StatusSeeOther, b.browse(http.MethodGet, "/", "", nil, nil).Code)
	requireError(t, b.browse(http.MethodGet, "/ui/api/messages", "", nil, nil), http.StatusUnauthorized, "unauthorized", "")
}

// TestDashboardLoginThrottled checks that the password cannot be guessed at
// network speed: after five failures from one address, even the right
// password waits, and the wait doubles; a success forgets the failures.
func TestDashboardLoginThrottled(t *testing.T) {
	t.Parallel()
	b := setupDashboard(t)
	now := time.Now()
	b.srv.sessions.now = func() time.Time { return now }
	for i := range freeLoginFailures {
		rec := b.postLogin(adminUser, "guess", nil)
		require.Equal(t, http.StatusUnauthorized, rec.Code, "failure %d", i+1)
	}
	rec := b.postLogin(adminUser, testAdminPassword, nil)
	require.Equal(t, http.StatusTooManyRequests, rec.Code)
	require.Equal(t, "61", rec.Header().Get("Retry-After"))
	require.Nil(t, sessionCookieOf(t, rec))

	// After the minute, one more failure doubles the wait.
	now = now.Add(time.Minute)
	require.Equal(t, http.StatusUnauthorized, b.postLogin(adminUser, "guess", nil).Code)
	rec = b.postLogin(adminUser, testAdminPassword, nil)
	require.Equal(t, http.StatusTooManyRequests, rec.Code)
	require.Equal(t, "121", rec.Header().Get("Retry-After"))

	// Once the wait is over the right password works and clears the count.
	now = now.Add(2 * time.Minute)
	require.Equal(t, http.StatusSeeOther, b.postLogin(adminUser, testAdminPassword, nil).Code)
	require.Equal(t, http.StatusUnauthorized, b.postLogin(adminUser, "guess", nil).Code)
	require.Equal(t, http.StatusSeeOther, b.postLogin(adminUser, testAdminPassword, nil).Code)
}

// TestDashboardLoginThrottleKeysOnTheConnection checks that the throttle
// counts failures against the address the request came from: the client's
// own X-Forwarded-For and X-Real-IP count only when a trusted proxy sent
// them, and then the proxy's entry, the rightmost untrusted one, decides.
func TestDashboardLoginThrottleKeysOnTheConnection(t *testing.T) {
	t.Parallel()
	spoof := func(i int) func(*http.Request) {
		return func(r *http.Request) {
			r.Header.Set("X-Forwarded-For", fmt.Sprintf("198.51.100.%d", i))
			r.Header.Set("X-Real-IP", fmt.Sprintf("203.0.113.%d", i))
		}
	}
	b := setupDashboard(t)
	for i := range freeLoginFailures {
		require.Equal(t, http.StatusUnauthorized, b.postLogin(adminUser, "guess", spoof(i)).Code)
	}
	rec := b.postLogin(adminUser, testAdminPassword, spoof(99))
	require.Equal(t, http.StatusTooManyRequests, rec.Code, "rotating forwarded headers escaped the throttle")

	// Behind a trusted proxy (httptest's requests come from 192.0.2.1),
	// clients are told apart by what the proxy appended.
	_, proxy, err := net.ParseCIDR("192.0.2.0/24")
	require.NoError(t, err)
	p := &dashBundle{bundle: setupWith(t, dbtestNew(t), Config{AdminPassword: testAdminPassword, TrustedProxies: []*net.IPNet{proxy}})}
	via := func(xff string) func(*http.Request) {
		return func(r *http.Request) { r.Header.Set("X-Forwarded-For", xff) }
	}
	for i := range freeLoginFailures {
		xff := fmt.Sprintf("198.51.100.%d, 2001:db8:1:2::%d", i, i+1)
		require.Equal(t, http.StatusUnauthorized, p.postLogin(adminUser, "guess", via(xff)).Code)
	}
	// Another address in the guesser's IPv6 /64 is the same guesser.
	require.Equal(t, http.StatusTooManyRequests, p.postLogin(adminUser, testAdminPassword, via("2001:db8:1:2::ff")).Code)
	require.Equal(t, http.StatusSeeOther, p.postLogin(adminUser, testAdminPassword, via("2001:db8:1:3::1")).Code)
	require.Equal(t, http.StatusSeeOther, p.postLogin(adminUser, testAdminPassword, func(r *http.Request) { r.Header.Set("X-Real-IP", "203.0.113.5") }).Code)
}

func TestThrottleKey(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"192.0.2.1":               "192.0.2.1",
		"::ffff:192.0.2.1":        "192.0.2.1",
		"2001:db8:1:2:3:4:5:6":    "2001:db8:1:2::/64",
		"2001:db8:1:2::ff":        "2001:db8:1:2::/64",
		"::1":                     "::/64",
		"not an address":          "not an address",
		"":                        "",
		"fe80::1%eth0":            "fe80::/64",
		"2001:db8:ffff:ffff::abc": "2001:db8:ffff:ffff::/64",
	} {
		require.Equal(t, want, throttleKey(in), in)
	}
}

// TestDashboardCookieSecure checks when the session cookie is Secure: over
// TLS, when a trusted proxy says https, and always with SecureCookies; not
// when an untrusted caller claims https.
func TestDashboardCookieSecure(t *testing.T) {
	t.Parallel()
	_, proxy, err := net.ParseCIDR("192.0.2.1/32")
	require.NoError(t, err)
	https := func(r *http.Request) { r.Header.Set("X-Forwarded-Proto", "https") }
	for _, tc := range []struct {
		name    string
		cfg     Config
		mutate  func(*http.Request)
		secure  bool
		message string
	}{
		{"untrusted claim", Config{}, https, false, "an untrusted X-Forwarded-Proto made the cookie Secure"},
		{"plain HTTP", Config{}, nil, false, "a plain-HTTP login cannot use a Secure cookie"},
		{"trusted proxy", Config{TrustedProxies: []*net.IPNet{proxy}}, https, true, "a trusted proxy's https was ignored"},
		{"forced", Config{SecureCookies: true}, nil, true, "SecureCookies did not make the cookie Secure"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.cfg.AdminPassword = testAdminPassword
			b := &dashBundle{bundle: setupWith(t, dbtestNew(t), tc.cfg)}
			rec := b.postLogin(adminUser, testAdminPassword, tc.mutate)
			require.Equal(t, http.StatusSeeOther, rec.Code)
			require.Equal(t, tc.secure, sessionCookieOf(t, rec).Secure, tc.message)
		})
	}
}

// TestDashboardLoginBodyLimit checks that the anonymous login form is
// refused with 413 beyond loginBodyLimit, announced or not, before any of
// it is parsed.
func TestDashboardLoginBodyLimit(t *testing.T) {
	t.Parallel()
	b := setupDashboard(t)
	big := url.Values{"username": {adminUser}, "password": {testAdminPassword}, "pad": {strings.Repeat("a", loginBodyLimit)}}.Encode()
	for name, length := range map[string]int64{"announced": int64(len(big)), "unannounced": -1} {
		req := httptest.NewRequest(http.MethodPost, "/login", strings.NewReader(big))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.ContentLength = length
		rec := httptest.NewRecorder()
		b.srv.ServeHTTP(rec, req)
		requireError(t, rec, http.StatusRequestEntityTooLarge, "too_large", "")
		require.Nil(t, sessionCookieOf(t, rec), name)
	}
	// An ordinary form still signs in.
	rec := b.postLogin(adminUser, testAdminPassword, nil)
	require.Equal(t, http.StatusSeeOther, rec.Code)
}

// TestDashboardSLOShare: the dashboard's share of messages within the SLO
// counts, by lane, the messages settled over the last day that were graded
// (slo_skew_ms), and those whose maximum skew was 1 s or less; older or
// ungraded ones are left out. Each message shows its maximum.
func TestDashboardSLOShare(t *testing.T) {
	t.Parallel()
	b := setupDashboard(t)
	ck, token := b.login(t)
	ctx := t.Context()
	insert := func(priority string, settledAgo time.Duration, sloSkewMs *float64) int64 {
		var id int64
		require.NoError(t, b.db.Pool.QueryRow(ctx, `
			WITH p AS (INSERT INTO payloads (content) VALUES ('{"title":"t"}') RETURNING id)
			INSERT INTO messages (state, priority, dispatch_at, expires_at, payload_id, audience, device_count, accepted_count, settled_at, slo_skew_ms)
			SELECT 'dispatched', $1, now() - $2::interval - interval '1 minute', now() + interval '1 hour', p.id, '{}', 1, 1, now() - $2::interval, $3 FROM p
			RETURNING id`, priority, settledAgo.String(), sloSkewMs).Scan(&id))
		return id
	}
	ms := func(v float64) *float64 { return &v }
	insert("urgent", time.Minute, ms(120))
	late := insert("urgent", time.Hour, ms(3000))
	insert("bulk", 2*time.Hour, ms(1000))
	insert("bulk", 48*time.Hour, ms(5000)) // settled the day before
	insert("bulk", time.Minute, nil)       // nothing of it was due

	rec := b.browse(http.MethodGet, "/ui/api/slo", "", ck, map[string]string{csrfHeader: token})
	require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
	require.JSONEq(t, `{"window_hours":24,"slo_ms":1000,"lanes":[
		{"priority":"bulk","messages":1,"within_slo":1},
		{"priority":"urgent","messages":2,"within_slo":1}]}`, rec.Body.String())

	rec = b.browse(http.MethodGet, "/ui/api/messages/"+push.FormatMessageID(late), "", ck, map[string]string{csrfHeader: token})
	require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
	var m struct {
		SLOSkewMs *float64 `json:"slo_skew_ms"`
	}
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &m))
	require.Equal(t, ms(3000), m.SLOSkewMs)

	// Without a session there is nothing to see.
	require.Equal(t, http.StatusUnauthorized, b.browse(http.MethodGet, "/ui/api/slo", "", nil, nil).Code)
}
