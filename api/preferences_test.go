package api

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/heraldpush/herald/db"
	"github.com/heraldpush/herald/jobs"
	"github.com/heraldpush/herald/jobs/push"
)

// audited counts the audit log's entries of a call: its method, its route
// as openapi.yaml writes it, its status and its target (nil: none).
func (b *bundle) audited(t testing.TB, method, route string, status int, target *string) int {
	t.Helper()
	var n int
	require.NoError(t, b.db.Pool.QueryRow(context.Background(), `
		SELECT count(*) FROM audit_log
		WHERE method = $1 AND route = $2 AND status = $3 AND target_id IS NOT DISTINCT FROM $4`,
		method, route, status, target).Scan(&n))
	return n
}

func TestCategories(t *testing.T) {
	t.Parallel()
	b := setup(t)
	capped := map[string]any{"cap": map[string]any{"count": 3, "period_seconds": 86400}}

	status, got := b.do(t, http.MethodGet, "/v1/categories", nil)
	require.Equal(t, http.StatusOK, status)
	require.Equal(t, []any{}, got["items"])
	requireError(t, b.call(t, request{method: http.MethodGet, path: "/v1/categories/marketing"}), http.StatusNotFound, "not_found", "")

	status, got = b.do(t, http.MethodPut, "/v1/categories/marketing", capped)
	require.Equal(t, http.StatusCreated, status, got)
	require.Equal(t, "marketing", got["name"])
	require.Equal(t, false, got["critical"])
	require.Equal(t, map[string]any{"count": 3.0, "period_seconds": 86400.0}, got["cap"])
	created := got["created_at"]

	// PUT replaces the whole rule: without a cap, it has none.
	status, got = b.do(t, http.MethodPut, "/v1/categories/marketing", map[string]any{})
	require.Equal(t, http.StatusOK, status, got)
	require.Nil(t, got["cap"])
	require.Equal(t, created, got["created_at"])
	status, got = b.do(t, http.MethodPut, "/v1/categories/medication", map[string]any{"critical": true})
	require.Equal(t, http.StatusCreated, status, got)
	require.Equal(t, true, got["critical"])

	status, got = b.do(t, http.MethodGet, "/v1/categories/medication", nil)
	require.Equal(t, http.StatusOK, status)
	require.Equal(t, true, got["critical"])
	_, got = b.do(t, http.MethodGet, "/v1/categories", nil)
	var names []string
	for _, it := range got["items"].([]any) {
		names = append(names, it.(map[string]any)["name"].(string))
	}
	require.Equal(t, []string{"marketing", "medication"}, names, "by name")

	require.Equal(t, http.StatusNoContent, b.call(t, request{method: http.MethodDelete, path: "/v1/categories/marketing"}).Code)
	requireError(t, b.call(t, request{method: http.MethodDelete, path: "/v1/categories/marketing"}), http.StatusNotFound, "not_found", "")
	requireError(t, b.call(t, request{method: http.MethodGet, path: "/v1/categories/marketing"}), http.StatusNotFound, "not_found", "")

	// Each change is in the audit log under the category's name.
	marketing := "marketing"
	require.Equal(t, 1, b.audited(t, http.MethodPut, "/v1/categories/{category}", http.StatusCreated, &marketing))
	require.Equal(t, 1, b.audited(t, http.MethodPut, "/v1/categories/{category}", http.StatusOK, &marketing))
	require.Equal(t, 1, b.audited(t, http.MethodDelete, "/v1/categories/{category}", http.StatusNoContent, &marketing))
	require.Equal(t, 1, b.audited(t, http.MethodDelete, "/v1/categories/{category}", http.StatusNotFound, &marketing))
}

func TestCategoriesRejectBadInput(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, tc := range []struct {
		path  string
		body  any
		field string
	}{
		{"/v1/categories/Marketing", map[string]any{}, "category"},
		{"/v1/categories/-news", map[string]any{}, "category"},
		{"/v1/categories/" + strings.Repeat("a", 64), map[string]any{}, "category"},
		{"/v1/categories/promo", map[string]any{"critical": true, "cap": map[string]any{"count": 1, "period_seconds": 3600}}, "cap"},
		{"/v1/categories/promo", map[string]any{"cap": map[string]any{"count": 0, "period_seconds": 3600}}, "cap.count"},
		{"/v1/categories/promo", map[string]any{"cap": map[string]any{"count": 10001, "period_seconds": 3600}}, "cap.count"},
		{"/v1/categories/promo", map[string]any{"cap": map[string]any{"count": 1, "period_seconds": 59}}, "cap.period_seconds"},
		{"/v1/categories/promo", map[string]any{"cap": map[string]any{"count": 1, "period_seconds": 31622401}}, "cap.period_seconds"},
		{"/v1/categories/promo", map[string]any{"cap": map[string]any{"count": 1}}, "cap.period_seconds"},
		{"/v1/categories/promo", map[string]any{"critical": "yes"}, "critical"},
		{"/v1/categories/promo", map[string]any{"limit": 3}, ""},
	} {
		rec := b.call(t, request{method: http.MethodPut, path: tc.path, body: tc.body})
		require.Equal(t, http.StatusBadRequest, rec.Code, "%s %v: %s", tc.path, tc.body, rec.Body.String())
		if tc.field != "" {
			require.Equal(t, tc.field, decodeBody(t, rec)["error"].(map[string]any)["field"], "%s %v", tc.path, tc.body)
		}
	}
	// The bounds themselves are taken.
	for _, bound := range []map[string]any{{"count": 1, "period_seconds": 60}, {"count": 10000, "period_seconds": 31622400}} {
		rec := b.call(t, request{method: http.MethodPut, path: "/v1/categories/promo", body: map[string]any{"cap": bound}})
		require.Contains(t, []int{http.StatusCreated, http.StatusOK}, rec.Code, rec.Body.String())
	}
	// A name no category could have names none.
	requireError(t, b.call(t, request{method: http.MethodGet, path: "/v1/categories/Promo"}), http.StatusNotFound, "not_found", "")
	requireError(t, b.call(t, request{method: http.MethodDelete, path: "/v1/categories/Promo"}), http.StatusNotFound, "not_found", "")
}

// TestCategoriesAndQuietHoursAreConfiguredAsAppsAre: they bind every
// app's messages, so a send key may read them but not change them, and an
// apps key may change them unless it is limited to some apps.
func TestCategoriesAndQuietHoursAreConfiguredAsAppsAre(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rec := b.call(t, request{method: http.MethodPost, path: "/v1/apps", body: map[string]string{"name": "brand-b"}})
	require.Equal(t, http.StatusCreated, rec.Code, rec.Body.String())
	send := b.makeKey(t, "backend", ScopeSend, nil)
	manager := b.makeKey(t, "operator", ScopeApps, nil)
	_, limited, err := CreateKey(context.Background(), b.db.Pool, NewKey{Name: "brand-b-ops", Scope: ScopeApps, Apps: []string{"brand-b"}})
	require.NoError(t, err)
	require.NoError(t, b.srv.keys.refresh(context.Background()))

	changes := []request{
		{method: http.MethodPut, path: "/v1/categories/news", body: map[string]any{}},
		{method: http.MethodPut, path: "/v1/quiet-hours", body: map[string]any{"start": "22:00", "end": "07:00"}},
		{method: http.MethodDelete, path: "/v1/quiet-hours"},
		{method: http.MethodDelete, path: "/v1/categories/news"},
	}
	for _, r := range changes {
		rec := b.call(t, as(send, r))
		requireError(t, rec, http.StatusForbidden, "forbidden", "")
		require.Equal(t, "apps", decodeBody(t, rec)["error"].(map[string]any)["scope_needed"], "%s %s", r.method, r.path)
		rec = b.call(t, as(limited, r))
		requireError(t, rec, http.StatusForbidden, "forbidden", "")
		require.Contains(t, rec.Body.String(), "cannot change what applies to every app", "%s %s", r.method, r.path)
	}
	for _, r := range changes {
		rec := b.call(t, as(manager, r))
		require.Less(t, rec.Code, 300, "%s %s: %s", r.method, r.path, rec.Body.String())
	}
	for _, path := range []string{"/v1/categories", "/v1/users/u1/preferences"} {
		require.NotEqual(t, http.StatusForbidden, b.call(t, as(send, request{method: http.MethodGet, path: path})).Code, path)
	}
}

func TestUserPreferences(t *testing.T) {
	t.Parallel()
	b := setup(t)
	requireError(t, b.call(t, request{method: http.MethodGet, path: "/v1/users/u1/preferences"}), http.StatusNotFound, "not_found", "")
	rec := b.call(t, request{method: http.MethodPut, path: "/v1/users/u1/preferences", body: map[string]any{}})
	requireError(t, rec, http.StatusNotFound, "not_found", "")
	require.Contains(t, rec.Body.String(), `user \"u1\" does not exist`)
	var rows int
	require.NoError(t, b.db.Pool.QueryRow(context.Background(), "SELECT count(*) FROM users").Scan(&rows))
	require.Zero(t, rows, "a user's preferences make no user")

	status, _ := b.do(t, http.MethodPut, "/v1/users/u1", map[string]any{"timezone": "Europe/Berlin"})
	require.Equal(t, http.StatusCreated, status)
	// A user who never set any has none: the installation's quiet hours.
	status, got := b.do(t, http.MethodGet, "/v1/users/u1/preferences", nil)
	require.Equal(t, http.StatusOK, status)
	require.Equal(t, map[string]any{"user_id": "u1", "opt_outs": []any{}, "quiet_hours": nil, "timezone": "Europe/Berlin", "updated_at": nil}, got)

	// Opt-outs come back in one order, once each.
	status, got = b.do(t, http.MethodPut, "/v1/users/u1/preferences", map[string]any{
		"opt_outs": []map[string]any{
			{"category": "news", "channel": "webpush"}, {"category": "marketing"}, {"category": "news", "channel": "webpush"},
		},
		"quiet_hours": map[string]any{"start": "22:00", "end": "07:00"},
	})
	require.Equal(t, http.StatusOK, status, got)
	require.Equal(t, []any{map[string]any{"category": "marketing"}, map[string]any{"category": "news", "channel": "webpush"}}, got["opt_outs"])
	require.Equal(t, map[string]any{"start": "22:00", "end": "07:00"}, got["quiet_hours"])
	require.NotNil(t, got["updated_at"])
	status, again := b.do(t, http.MethodGet, "/v1/users/u1/preferences", nil)
	require.Equal(t, http.StatusOK, status)
	require.Equal(t, got, again)
	var stored []string
	var start, end *string
	require.NoError(t, b.db.Pool.QueryRow(context.Background(),
		"SELECT opt_outs, quiet_start::text, quiet_end::text FROM user_preferences WHERE user_id = 'u1'").Scan(&stored, &start, &end))
	require.Equal(t, []string{"marketing", "news:webpush"}, stored)
	require.Equal(t, []string{"22:00:00", "07:00:00"}, []string{*start, *end})

	// PUT replaces: equal ends are no quiet hours at all, and then none
	// given is the installation's again.
	_, got = b.do(t, http.MethodPut, "/v1/users/u1/preferences", map[string]any{"quiet_hours": map[string]any{"start": "00:00", "end": "00:00"}})
	require.Equal(t, []any{}, got["opt_outs"])
	require.Equal(t, map[string]any{"start": "00:00", "end": "00:00"}, got["quiet_hours"])
	_, got = b.do(t, http.MethodPut, "/v1/users/u1/preferences", map[string]any{"opt_outs": []map[string]any{{"category": "marketing"}}, "quiet_hours": nil})
	require.Nil(t, got["quiet_hours"])
	require.Len(t, got["opt_outs"], 1)

	// Written by a send key, as a user is, and recorded.
	user := "u1"
	require.Equal(t, 3, b.audited(t, http.MethodPut, "/v1/users/{user_id}/preferences", http.StatusOK, &user))
	send := b.makeKey(t, "backend", ScopeSend, nil)
	rec = b.call(t, as(send, request{method: http.MethodPut, path: "/v1/users/u1/preferences", body: map[string]any{}}))
	require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
	read := b.makeKey(t, "dashboards", ScopeRead, nil)
	requireError(t, b.call(t, as(read, request{method: http.MethodPut, path: "/v1/users/u1/preferences", body: map[string]any{}})),
		http.StatusForbidden, "forbidden", "")
}

func TestUserPreferencesRejectBadInput(t *testing.T) {
	t.Parallel()
	b := setup(t)
	status, _ := b.do(t, http.MethodPut, "/v1/users/u1", map[string]any{})
	require.Equal(t, http.StatusCreated, status)
	tooMany := make([]map[string]any, 201)
	for i := range tooMany {
		tooMany[i] = map[string]any{"category": fmt.Sprintf("c%d", i)}
	}
	for _, tc := range []struct {
		body  any
		field string
	}{
		{map[string]any{"opt_outs": []map[string]any{{"category": "news"}, {"category": "News"}}}, "opt_outs[1].category"},
		{map[string]any{"opt_outs": []map[string]any{{"category": ""}}}, "opt_outs[0].category"},
		{map[string]any{"opt_outs": []map[string]any{{"category": "news", "channel": "sms"}}}, "opt_outs[0].channel"},
		{map[string]any{"opt_outs": []map[string]any{{"category": "news", "app": "x"}}}, ""},
		{map[string]any{"opt_outs": tooMany}, "opt_outs"},
		{map[string]any{"quiet_hours": map[string]any{"start": "22:00"}}, "quiet_hours"},
		{map[string]any{"quiet_hours": map[string]any{"start": "24:00", "end": "07:00"}}, "quiet_hours"},
		{map[string]any{"quiet_hours": map[string]any{"start": "7:00", "end": "22:00"}}, "quiet_hours"},
		{map[string]any{"quiet_hours": "22:00-07:00"}, "quiet_hours"},
		{map[string]any{"timezone": "Europe/Berlin"}, ""},
	} {
		rec := b.call(t, request{method: http.MethodPut, path: "/v1/users/u1/preferences", body: tc.body})
		require.Equal(t, http.StatusBadRequest, rec.Code, "%v: %s", tc.body, rec.Body.String())
		if tc.field != "" {
			require.Equal(t, tc.field, decodeBody(t, rec)["error"].(map[string]any)["field"], "%v", tc.body)
		}
	}
	_, got := b.do(t, http.MethodGet, "/v1/users/u1/preferences", nil)
	require.Nil(t, got["updated_at"], "nothing was written")
	requireError(t, b.call(t, request{method: http.MethodGet, path: "/v1/users/bad%21id/preferences"}), http.StatusNotFound, "not_found", "")
	requireError(t, b.call(t, request{method: http.MethodPut, path: "/v1/users/bad%21id/preferences", body: map[string]any{}}), http.StatusNotFound, "not_found", "")
}

// TestErasureDeletesPreferences: a user's preferences and cap history go
// with the user, and what is written for a user erased at the same time
// is refused, never left behind.
func TestErasureDeletesPreferences(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	status, _ := b.do(t, http.MethodPut, "/v1/users/u1", map[string]any{})
	require.Equal(t, http.StatusCreated, status)
	status, _ = b.do(t, http.MethodPut, "/v1/users/u1/preferences", map[string]any{"opt_outs": []map[string]any{{"category": "news"}}})
	require.Equal(t, http.StatusOK, status)
	_, err := db.ClaimFrequencyCaps(ctx, b.db.Pool, db.CategoryCap{Category: "news", Count: 1, PeriodS: 3600}, 1, []string{"u1"})
	require.NoError(t, err)

	// The erasure holds the user while a PUT of its preferences comes: the
	// PUT waits, and finds no user once the erasure commits.
	tx, err := b.db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = db.On(tx).LockUser(ctx, "u1")
	require.NoError(t, err)
	done := make(chan int)
	go func() {
		rec := b.call(t, request{method: http.MethodPut, path: "/v1/users/u1/preferences", body: map[string]any{"opt_outs": []map[string]any{{"category": "promo"}}}})
		done <- rec.Code
	}()
	select {
	case code := <-done:
		t.Fatalf("the PUT did not wait for the erasure: %d", code)
	case <-time.After(100 * time.Millisecond):
	}
	_, err = tx.Exec(ctx, "DELETE FROM users WHERE id = 'u1'")
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	require.Equal(t, http.StatusNotFound, <-done)

	var prefs, caps int
	require.NoError(t, b.db.Pool.QueryRow(ctx,
		"SELECT (SELECT count(*) FROM user_preferences), (SELECT count(*) FROM frequency_caps)").Scan(&prefs, &caps))
	require.Equal(t, []int{0, 0}, []int{prefs, caps})

	// Through the API too.
	status, _ = b.do(t, http.MethodPut, "/v1/users/u2", map[string]any{})
	require.Equal(t, http.StatusCreated, status)
	status, _ = b.do(t, http.MethodPut, "/v1/users/u2/preferences", map[string]any{"quiet_hours": map[string]any{"start": "22:00", "end": "07:00"}})
	require.Equal(t, http.StatusOK, status)
	require.Equal(t, http.StatusNoContent, b.call(t, request{method: http.MethodDelete, path: "/v1/users/u2"}).Code)
	requireError(t, b.call(t, request{method: http.MethodGet, path: "/v1/users/u2/preferences"}), http.StatusNotFound, "not_found", "")
	require.NoError(t, b.db.Pool.QueryRow(ctx, "SELECT count(*) FROM user_preferences").Scan(&prefs))
	require.Zero(t, prefs)
}

func TestQuietHoursDefault(t *testing.T) {
	t.Parallel()
	b := setup(t)
	requireError(t, b.call(t, request{method: http.MethodGet, path: "/v1/quiet-hours"}), http.StatusNotFound, "not_found", "")
	requireError(t, b.call(t, request{method: http.MethodDelete, path: "/v1/quiet-hours"}), http.StatusNotFound, "not_found", "")

	status, got := b.do(t, http.MethodPut, "/v1/quiet-hours", map[string]any{"start": "22:00", "end": "07:00"})
	require.Equal(t, http.StatusOK, status, got)
	require.Equal(t, "UTC", got["timezone"], "the zone of users without one, by default")
	status, got = b.do(t, http.MethodPut, "/v1/quiet-hours", map[string]any{"start": "21:30", "end": "06:45", "timezone": "Europe/Berlin"})
	require.Equal(t, http.StatusOK, status, got)
	status, again := b.do(t, http.MethodGet, "/v1/quiet-hours", nil)
	require.Equal(t, http.StatusOK, status)
	require.Equal(t, got, again)
	require.Equal(t, []any{"21:30", "06:45", "Europe/Berlin"}, []any{got["start"], got["end"], got["timezone"]})

	for _, tc := range []struct {
		body  any
		field string
	}{
		{map[string]any{"start": "22:00", "end": "22:00"}, "end"},
		{map[string]any{"start": "22:00"}, "end"},
		{map[string]any{"end": "07:00"}, "start"},
		{map[string]any{"start": "10pm", "end": "07:00"}, "start"},
		{map[string]any{"start": "22:00", "end": "07:60"}, "end"},
		{map[string]any{"start": "22:00", "end": "07:00", "timezone": "Mars/Olympus_Mons"}, "timezone"},
		{map[string]any{"start": "22:00", "end": "07:00", "timezone": ""}, "timezone"},
		{map[string]any{"start": "22:00", "end": "07:00", "timezone": "Local"}, "timezone"},
		{map[string]any{"start": "22:00", "end": "07:00", "updated_at": "2026-01-01T00:00:00Z"}, ""},
	} {
		rec := b.call(t, request{method: http.MethodPut, path: "/v1/quiet-hours", body: tc.body})
		require.Equal(t, http.StatusBadRequest, rec.Code, "%v: %s", tc.body, rec.Body.String())
		if tc.field != "" {
			require.Equal(t, tc.field, decodeBody(t, rec)["error"].(map[string]any)["field"], "%v", tc.body)
		}
	}
	_, still := b.do(t, http.MethodGet, "/v1/quiet-hours", nil)
	require.Equal(t, got, still, "a refused PUT changes nothing")

	require.Equal(t, http.StatusNoContent, b.call(t, request{method: http.MethodDelete, path: "/v1/quiet-hours"}).Code)
	requireError(t, b.call(t, request{method: http.MethodGet, path: "/v1/quiet-hours"}), http.StatusNotFound, "not_found", "")
	require.Equal(t, 2, b.audited(t, http.MethodPut, "/v1/quiet-hours", http.StatusOK, nil))
	require.Equal(t, 1, b.audited(t, http.MethodDelete, "/v1/quiet-hours", http.StatusNoContent, nil))
}

func TestMessageCategoryAndQuietMode(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.population(t, "c", 2, 1)
	audience := map[string]any{"type": "users", "ids": []string{"c0", "c1"}}

	body := messageBody(audience)
	body["category"], body["quiet_hours"] = "marketing", "skip"
	status, head := b.do(t, http.MethodPost, "/v1/messages", body)
	require.Equal(t, http.StatusAccepted, status, head)
	require.Equal(t, []any{"marketing", "skip"}, []any{head["category"], head["quiet_hours"]})
	id := head["message_id"].(string)
	_, st := b.do(t, http.MethodGet, "/v1/messages/"+id, nil)
	require.Equal(t, []any{"marketing", "skip"}, []any{st["category"], st["quiet_hours"]})
	var category, mode string
	n, _ := parsePrefixed(id)
	require.NoError(t, b.db.Pool.QueryRow(context.Background(), "SELECT category, quiet_hours FROM messages WHERE id = $1", n).Scan(&category, &mode))
	require.Equal(t, []string{"marketing", "skip"}, []string{category, mode})

	// Without them, the defaults; in the listing too. Said or not, they
	// are one request to an idempotency key.
	body = messageBody(audience)
	key := map[string]string{"Idempotency-Key": "defaults"}
	rec := b.call(t, request{method: http.MethodPost, path: "/v1/messages", body: body, header: key})
	require.Equal(t, http.StatusAccepted, rec.Code, rec.Body.String())
	head = decodeBody(t, rec)
	require.Equal(t, []any{"default", "hold"}, []any{head["category"], head["quiet_hours"]})
	body["category"], body["quiet_hours"] = "default", "hold"
	rec = b.call(t, request{method: http.MethodPost, path: "/v1/messages", body: body, header: key})
	require.Equal(t, http.StatusAccepted, rec.Code, rec.Body.String())
	require.Equal(t, head["message_id"], decodeBody(t, rec)["message_id"])
	_, page := b.do(t, http.MethodGet, "/v1/messages", nil)
	items := page["items"].([]any)
	require.Len(t, items, 2)
	require.Equal(t, "default", items[0].(map[string]any)["category"])
	require.Equal(t, "marketing", items[1].(map[string]any)["category"])

	for _, tc := range []struct {
		field string
		value any
	}{
		{"category", "Marketing"}, {"category", "a b"}, {"category", strings.Repeat("a", 64)}, {"category", 7},
		{"quiet_hours", "defer"}, {"quiet_hours", "HOLD"}, {"quiet_hours", true},
	} {
		body := messageBody(audience)
		body[tc.field] = tc.value
		rec := b.call(t, request{method: http.MethodPost, path: "/v1/messages", body: body})
		require.Equal(t, http.StatusBadRequest, rec.Code, "%s %v: %s", tc.field, tc.value, rec.Body.String())
		require.Equal(t, tc.field, decodeBody(t, rec)["error"].(map[string]any)["field"], "%s %v", tc.field, tc.value)
	}
}

func TestScheduleCategoryAndQuietMode(t *testing.T) {
	t.Parallel()
	b := setup(t)
	body := scheduleBody()
	body["category"], body["quiet_hours"] = "digest", "skip"
	rec := b.call(t, request{method: http.MethodPost, path: "/v1/schedules", body: body})
	require.Equal(t, http.StatusCreated, rec.Code, rec.Body.String())
	sch := decodeBody(t, rec)
	require.Equal(t, []any{"digest", "skip"}, []any{sch["category"], sch["quiet_hours"]})
	_, got := b.do(t, http.MethodGet, "/v1/schedules/"+sch["schedule_id"].(string), nil)
	require.Equal(t, []any{"digest", "skip"}, []any{got["category"], got["quiet_hours"]})
	var category, mode string
	require.NoError(t, b.db.Pool.QueryRow(context.Background(), "SELECT category, quiet_hours FROM schedules").Scan(&category, &mode))
	require.Equal(t, []string{"digest", "skip"}, []string{category, mode})

	// The defaults said or not are one request to an idempotency key.
	key := map[string]string{"Idempotency-Key": "daily"}
	rec = b.call(t, request{method: http.MethodPost, path: "/v1/schedules", body: scheduleBody(), header: key})
	require.Equal(t, http.StatusCreated, rec.Code, rec.Body.String())
	made := decodeBody(t, rec)
	require.Equal(t, []any{"default", "hold"}, []any{made["category"], made["quiet_hours"]})
	explicit := scheduleBody()
	explicit["category"], explicit["quiet_hours"] = "default", "hold"
	rec = b.call(t, request{method: http.MethodPost, path: "/v1/schedules", body: explicit, header: key})
	require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
	require.Equal(t, made["schedule_id"], decodeBody(t, rec)["schedule_id"])

	for _, tc := range []struct{ field, value string }{{"category", "Digest"}, {"quiet_hours", "later"}} {
		body := scheduleBody()
		body[tc.field] = tc.value
		requireError(t, b.call(t, request{method: http.MethodPost, path: "/v1/schedules", body: body}), http.StatusBadRequest, "invalid_field", tc.field)
	}
}

// TestWithheldDeliveries: a message counts the deliveries withheld for
// their users' sake among its counters (each also under its status), and
// those its users' quiet hours hold now; its deliveries can be listed by
// reason, which only ledger rows have, and its counts by app say the same.
func TestWithheldDeliveries(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id, n, ledger := startedMessage(t, b, "w", 6)
	ctx := context.Background()
	now := time.Now()
	var r db.RecordResultsParams
	addResult(&r, n, ledger[0], "accepted", "", now)
	addResult(&r, n, ledger[1], "cancelled", string(push.ReasonOptedOut), now)
	addResult(&r, n, ledger[2], "cancelled", string(push.ReasonCapped), now)
	addResult(&r, n, ledger[3], "cancelled", string(push.ReasonQuietHours), now)
	d := ledger[4]
	r.AddThrottled(db.DeliveryKey{MessageID: n, DeviceID: d.ID, UserID: d.UserID, Channel: d.Channel, Chunk: d.Chunk, DueUs: now.Add(time.Hour).UnixMicro()},
		string(push.ReasonQuietHours), 0, now.Add(time.Hour).UnixMicro())
	_, err := b.q.RecordResults(ctx, r)
	require.NoError(t, err)
	// The chunk's attempt that held it says so as it closes.
	require.NoError(t, b.q.RecordChunk(ctx, db.RecordChunkParams{MessageID: n, Chunk: d.Chunk, StartedAt: &now, Held: 1}))

	want := map[string]any{"total": 6.0, "accepted": 1.0, "failed": 0.0, "expired": 0.0, "cancelled": 3.0, "pending": 2.0,
		"opted_out": 1.0, "capped": 1.0, "quiet_hours": 1.0, "held": 1.0}
	_, st := b.do(t, http.MethodGet, "/v1/messages/"+id, nil)
	require.Equal(t, want, st["deliveries"])
	_, page := b.do(t, http.MethodGet, "/v1/messages?limit=10", nil)
	require.Equal(t, want, page["items"].([]any)[0].(map[string]any)["deliveries"], "the listing counts the same")
	_, apps := b.do(t, http.MethodGet, "/v1/messages/"+id+"/apps", nil)
	require.Equal(t, want, apps["items"].([]any)[0].(map[string]any)["deliveries"], "by app, counted from the ledger")

	devicesOf := func(query string) []string {
		t.Helper()
		status, page := b.do(t, http.MethodGet, "/v1/messages/"+id+"/deliveries?"+query, nil)
		require.Equal(t, http.StatusOK, status, page)
		var out []string
		for _, it := range page["items"].([]any) {
			out = append(out, it.(map[string]any)["device_id"].(string))
		}
		return out
	}
	dev := func(i int) string { return formatDeviceID(ledger[i].ID) }
	require.Equal(t, []string{dev(1)}, devicesOf("reason=opted_out"))
	require.Equal(t, []string{dev(3), dev(4)}, devicesOf("reason=quiet_hours"))
	require.Equal(t, []string{dev(4)}, devicesOf("status=pending&reason=quiet_hours"), "the one held, not the snapshot's pending device")
	require.Equal(t, []string{dev(3)}, devicesOf("status=cancelled&reason=quiet_hours"))
	require.Nil(t, devicesOf("reason=unregistered"))
	require.Len(t, devicesOf("status=pending"), 2, "the held row and the device still in its snapshot")
	// A page by reason goes on from its cursor.
	status, first := b.do(t, http.MethodGet, "/v1/messages/"+id+"/deliveries?reason=quiet_hours&limit=1", nil)
	require.Equal(t, http.StatusOK, status)
	cursor := first["next_cursor"].(string)
	require.Equal(t, []string{dev(4)}, devicesOf("reason=quiet_hours&limit=1&cursor="+cursor))
	requireError(t, b.call(t, request{method: http.MethodGet, path: "/v1/messages/" + id + "/deliveries?reason=opted_out&cursor=" + cursor}),
		http.StatusBadRequest, "invalid_cursor", "cursor")
	requireError(t, b.call(t, request{method: http.MethodGet, path: "/v1/messages/" + id + "/deliveries?reason=asleep"}),
		http.StatusBadRequest, "invalid_field", "reason")
}

// TestDeliveryReasonsAreTheSpecs: the reasons a listing may be filtered by
// are those openapi.yaml's Reason names, and the webhook event types those
// it lists.
func TestDeliveryReasonsAreTheSpecs(t *testing.T) {
	t.Parallel()
	doc, _ := openAPIRouter(t)
	var documented []string
	for _, v := range doc.Components.Schemas["Reason"].Value.Enum {
		documented = append(documented, v.(string))
	}
	var served []string
	for _, r := range deliveryReasons {
		served = append(served, string(r))
	}
	require.ElementsMatch(t, documented, served)
	var events []string
	for _, v := range doc.Components.Schemas["WebhookEventType"].Value.Enum {
		events = append(events, v.(string))
	}
	require.ElementsMatch(t, jobs.WebhookEvents, events)
	newWebhook := doc.Components.Schemas["NewWebhook"].Value.Properties["events"].Value
	require.Equal(t, uint64(len(events)), *newWebhook.MaxItems, "a webhook may want every type")
	require.True(t, slices.ContainsFunc(doc.Components.Schemas["QuietMode"].Value.Enum, func(v any) bool { return v == "skip" }))
}

// TestWebhookMayWantWithheld: a webhook may want delivery.withheld, beside
// every other type.
func TestWebhookMayWantWithheld(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rec := b.call(t, request{method: http.MethodPost, path: "/v1/webhooks",
		body: map[string]any{"url": "https://hooks.example.com/herald", "events": jobs.WebhookEvents}})
	require.Equal(t, http.StatusCreated, rec.Code, rec.Body.String())
	require.Contains(t, decodeBody(t, rec)["events"], "delivery.withheld")
}
