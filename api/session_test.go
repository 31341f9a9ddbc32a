package api

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestSessionsAreSharedByServers: two servers on one database are two
// processes behind a load balancer: a session begun on one is valid on the
// other, with the same CSRF token, and signing out on either ends it on
// both.
func TestSessionsAreSharedByServers(t *testing.T) {
	t.Parallel()
	tdb := dbtestNew(t)
	cfg := Config{AdminPassword: testAdminPassword, RiverUI: http.NotFoundHandler()}
	one := &dashBundle{bundle: setupWith(t, tdb, cfg)}
	two := &dashBundle{bundle: setupWith(t, tdb, cfg)}
	ck, csrf := one.login(t)

	rec := two.browse(http.MethodGet, "/ui/api/session", "", ck, nil)
	require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
	require.Equal(t, csrf, decodeBody(t, rec)["csrf_token"])
	body := `{"audience":{"type":"users","ids":["u1"]},"payload":{"title":"hi"}}`
	rec = two.browse(http.MethodPost, "/ui/api/messages", body, ck, map[string]string{csrfHeader: csrf})
	require.Equal(t, http.StatusAccepted, rec.Code, rec.Body.String())

	require.Equal(t, http.StatusNoContent, two.browse(http.MethodPost, "/logout", "", ck, map[string]string{csrfHeader: csrf}).Code)
	for _, b := range []*dashBundle{one, two} {
		require.Equal(t, http.StatusUnauthorized, b.browse(http.MethodGet, "/ui/api/session", "", ck, nil).Code)
	}
}

// TestAdminSessionsEndWithTheirPassword: a session of admin is valid only
// on a process whose HERALD_ADMIN_PASSWORD is the one it was opened with,
// so changing the password (or unsetting it) ends the sessions opened
// with the old one, as a restart used to.
func TestAdminSessionsEndWithTheirPassword(t *testing.T) {
	t.Parallel()
	tdb := dbtestNew(t)
	old := &dashBundle{bundle: setupWith(t, tdb, Config{AdminPassword: testAdminPassword, RiverUI: http.NotFoundHandler()})}
	ck, _ := old.login(t)
	changed := &dashBundle{bundle: setupWith(t, tdb, Config{AdminPassword: "a new admin password"})}
	unset := &dashBundle{bundle: setupWith(t, tdb, Config{})}
	require.Equal(t, http.StatusOK, old.browse(http.MethodGet, "/ui/api/session", "", ck, nil).Code)
	for _, b := range []*dashBundle{changed, unset} {
		require.Equal(t, http.StatusUnauthorized, b.browse(http.MethodGet, "/ui/api/session", "", ck, nil).Code)
	}
	rec := changed.postLogin(adminUser, "a new admin password", nil)
	require.Equal(t, http.StatusSeeOther, rec.Code)
	require.Equal(t, http.StatusUnauthorized, old.browse(http.MethodGet, "/ui/api/session", "", sessionCookieOf(t, rec), nil).Code)
}

// TestNamedOperatorSignsIn: an operator made with CreateOperator signs in
// with its own password (not admin's), the dashboard names it, and
// removing it ends its sessions.
func TestNamedOperatorSignsIn(t *testing.T) {
	t.Parallel()
	b := setupDashboard(t)
	ctx := context.Background()
	const password = "a long operator password"
	_, err := CreateOperator(ctx, b.db.Pool, "alice", password)
	require.NoError(t, err)

	for _, wrong := range [][2]string{{"alice", testAdminPassword}, {"alice", password + "x"}, {"bob", password}} {
		require.Equal(t, http.StatusUnauthorized, b.postLogin(wrong[0], wrong[1], nil).Code, wrong[0])
	}
	rec := b.postLogin("alice", password, nil)
	require.Equal(t, http.StatusSeeOther, rec.Code, rec.Body.String())
	ck := sessionCookieOf(t, rec)
	rec = b.browse(http.MethodGet, "/ui/api/session", "", ck, nil)
	require.Equal(t, http.StatusOK, rec.Code)
	require.Equal(t, "alice", decodeBody(t, rec)["user"])

	require.NoError(t, RemoveOperator(ctx, b.db.Pool, "alice"))
	require.Equal(t, http.StatusUnauthorized, b.browse(http.MethodGet, "/ui/api/session", "", ck, nil).Code)
	require.Equal(t, http.StatusUnauthorized, b.postLogin("alice", password, nil).Code)
	require.ErrorIs(t, RemoveOperator(ctx, b.db.Pool, "alice"), ErrNoSuchOperator)
}

// TestCreateOperatorRefusesBadInput: each refusal says what is wrong.
func TestCreateOperatorRefusesBadInput(t *testing.T) {
	t.Parallel()
	tdb := dbtestNew(t)
	ctx := context.Background()
	_, err := CreateOperator(ctx, tdb.Pool, "carol", "twelve chars")
	require.NoError(t, err)
	for _, tc := range []struct{ name, password, want string }{
		{"admin", "a long enough password", "HERALD_ADMIN_PASSWORD"},
		{"has space", "a long enough password", "letters, digits"},
		{"", "a long enough password", "letters, digits"},
		{"dave", "short", "at least 12"},
		{"dave", strings.Repeat("p", 2000), "longer than"},
		{"carol", "another long password", "exists already"},
	} {
		_, err := CreateOperator(ctx, tdb.Pool, tc.name, tc.password)
		require.ErrorContains(t, err, tc.want, tc.name)
	}
	ops, err := ListOperators(ctx, tdb.Pool)
	require.NoError(t, err)
	require.Len(t, ops, 1)
	require.Equal(t, "carol", ops[0].Name)
}

// TestSignInFloodIsToldToWait: while every turn to hash a password is
// taken, a sign-in is answered 503 with Retry-After rather than queued
// without bound; admin's, which hashes nothing, still gets in.
func TestSignInFloodIsToldToWait(t *testing.T) {
	t.Parallel()
	b := setupDashboard(t)
	_, err := CreateOperator(context.Background(), b.db.Pool, "erin", "erin's long password")
	require.NoError(t, err)
	b.srv.sessions.checkWait = 10 * time.Millisecond
	for range maxPasswordChecks {
		b.srv.sessions.passwordChecks <- struct{}{}
	}
	rec := b.postLogin("erin", "erin's long password", nil)
	require.Equal(t, http.StatusServiceUnavailable, rec.Code)
	require.Equal(t, "1", rec.Header().Get("Retry-After"))
	require.Contains(t, rec.Body.String(), "Too many sign-ins at once")
	require.Equal(t, http.StatusSeeOther, b.postLogin(adminUser, testAdminPassword, nil).Code)

	<-b.srv.sessions.passwordChecks
	require.Equal(t, http.StatusSeeOther, b.postLogin("erin", "erin's long password", nil).Code)
}

// TestPasswordHash: a password hashes to an argon2id PHC string that only
// it verifies, under a salt of its own; a hash that is not one is an error.
func TestPasswordHash(t *testing.T) {
	t.Parallel()
	h := hashPassword("correct horse")
	require.True(t, strings.HasPrefix(h, "$argon2id$v=19$m=19456,t=2,p=1$"), h)
	require.NotEqual(t, h, hashPassword("correct horse"), "each hash has its own salt")
	ok, err := verifyPassword(h, "correct horse")
	require.NoError(t, err)
	require.True(t, ok)
	ok, err = verifyPassword(h, "correct horsf")
	require.NoError(t, err)
	require.False(t, ok)
	parts := strings.Split(h, "$")
	for name, bad := range map[string]string{
		"bcrypt":      "$2a$10$abcdefghijklmnopqrstuv",
		"version":     strings.Replace(h, "v=19", "v=16", 1),
		"parameters":  strings.Replace(h, "m=19456", "m=0", 1),
		"salt":        strings.Join(append(parts[:4:4], "!!", parts[5]), "$"),
		"empty hash":  strings.Join(append(parts[:5:5], ""), "$"),
		"not a hash":  "plain text",
		"empty input": "",
	} {
		_, err := verifyPassword(bad, "correct horse")
		require.Error(t, err, name)
	}
}

// TestForgedSessionNeverReachesTheDatabase: a cookie this installation did
// not sign is refused without a query, so a flood of made-up sessions costs
// the database nothing.
func TestForgedSessionNeverReachesTheDatabase(t *testing.T) {
	t.Parallel()
	b := setupDashboard(t)
	ck, _ := b.login(t)
	nonce, _, _ := cutLast(ck.Value, ".")
	before := b.db.Pool.Stat().AcquireCount()
	for _, forged := range []string{nonce + ".forged", "no-dot-at-all", nonce + "x." + strings.Repeat("A", 43)} {
		rec := b.browse(http.MethodGet, "/ui/api/messages", "", &http.Cookie{Name: sessionCookie, Value: forged}, nil)
		require.Equal(t, http.StatusUnauthorized, rec.Code)
	}
	require.Equal(t, before, b.db.Pool.Stat().AcquireCount(), "a forged session used the database")
	var info map[string]any
	rec := b.browse(http.MethodGet, "/ui/api/session", "", ck, nil)
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &info))
	require.Equal(t, adminUser, info["user"])
}
