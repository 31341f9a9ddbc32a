package api

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/heraldpush/herald/jobs"
)

func scheduleBody() map[string]any {
	return map[string]any{
		"cron":        "0 9 * * MON-FRI",
		"timezone":    "Europe/Berlin",
		"audience":    map[string]any{"type": "users", "ids": []string{"p0", "p1"}},
		"payload":     map[string]any{"title": "Standup", "body": "in five minutes"},
		"priority":    "bulk",
		"ttl_seconds": 600,
	}
}

func TestScheduleLifecycle(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.population(t, "p", 2, 1)

	rec := b.call(t, request{method: http.MethodPost, path: "/v1/schedules", body: scheduleBody()})
	require.Equal(t, http.StatusCreated, rec.Code, rec.Body.String())
	sch := decodeBody(t, rec)
	id := sch["schedule_id"].(string)
	require.Equal(t, "/v1/schedules/"+id, rec.Header().Get("Location"))
	runs := sch["next_runs"].([]any)
	require.Len(t, runs, 5)
	berlin, err := time.LoadLocation("Europe/Berlin")
	require.NoError(t, err)
	var prev time.Time
	for _, r := range runs {
		at, err := time.Parse(time.RFC3339Nano, r.(string))
		require.NoError(t, err)
		local := at.In(berlin)
		require.Equal(t, 9, local.Hour())
		require.NotContains(t, []time.Weekday{time.Saturday, time.Sunday}, local.Weekday())
		require.True(t, at.After(prev))
		prev = at
	}

	status, got := b.do(t, http.MethodGet, "/v1/schedules/"+id, nil)
	require.Equal(t, http.StatusOK, status)
	require.Equal(t, sch["next_runs"], got["next_runs"])
	require.Equal(t, []any{}, got["pending_runs"], "no run is made yet")
	_, list := b.do(t, http.MethodGet, "/v1/schedules", nil)
	require.Len(t, list["items"], 1)

	// Make the next run into a message, as the materializer does ahead of
	// time, then pause: that run is cancelled, and no runs are listed.
	first, err := time.Parse(time.RFC3339Nano, runs[0].(string))
	require.NoError(t, err)
	m, err := jobs.NewMaterializer(&jobs.MaterializerConfig{Pool: b.db.Pool, Logger: discard, Lead: time.Minute,
		Now: func(context.Context) (time.Time, error) { return first.Add(-30 * time.Second), nil }})
	require.NoError(t, err)
	made, err := m.Run(context.Background(), b.srv.cfg.River)
	require.NoError(t, err)
	require.Equal(t, 1, made)
	_, msgs := b.do(t, http.MethodGet, "/v1/messages?schedule_id="+id, nil)
	require.Len(t, msgs["items"], 1)
	run := msgs["items"].([]any)[0].(map[string]any)
	require.Equal(t, "scheduled", run["state"])
	require.Equal(t, id, run["schedule_id"])

	// The run made into a message is still the schedule's next run, and
	// says which message it is; the runs after it follow.
	wantPending := []any{map[string]any{"run_at": runs[0], "message_id": run["message_id"]}}
	status, got = b.do(t, http.MethodGet, "/v1/schedules/"+id, nil)
	require.Equal(t, http.StatusOK, status)
	require.Equal(t, runs, got["next_runs"], "next_runs starts at the first run not yet sent")
	require.Equal(t, wantPending, got["pending_runs"])
	_, list = b.do(t, http.MethodGet, "/v1/schedules", nil)
	require.Equal(t, runs, list["items"].([]any)[0].(map[string]any)["next_runs"])
	require.Equal(t, wantPending, list["items"].([]any)[0].(map[string]any)["pending_runs"])

	status, paused := b.do(t, http.MethodPatch, "/v1/schedules/"+id, map[string]any{"paused": true})
	require.Equal(t, http.StatusOK, status, paused)
	require.Equal(t, true, paused["paused"])
	require.Empty(t, paused["next_runs"])
	require.Empty(t, paused["pending_runs"])
	_, st := b.do(t, http.MethodGet, "/v1/messages/"+run["message_id"].(string), nil)
	require.Equal(t, "cancelled", st["state"], "pausing cancels runs made but not started")

	status, resumed := b.do(t, http.MethodPatch, "/v1/schedules/"+id, map[string]any{"paused": false})
	require.Equal(t, http.StatusOK, status)
	require.Equal(t, false, resumed["paused"])
	require.Len(t, resumed["next_runs"], 5)

	rec = b.call(t, request{method: http.MethodDelete, path: "/v1/schedules/" + id})
	require.Equal(t, http.StatusNoContent, rec.Code)
	requireError(t, b.call(t, request{method: http.MethodGet, path: "/v1/schedules/" + id}), http.StatusNotFound, "not_found", "")
	requireError(t, b.call(t, request{method: http.MethodDelete, path: "/v1/schedules/" + id}), http.StatusNotFound, "not_found", "")
	// Its past runs stay listable.
	_, msgs = b.do(t, http.MethodGet, "/v1/messages?schedule_id="+id, nil)
	require.Len(t, msgs["items"], 1)
}

func TestScheduleRejectsBadInput(t *testing.T) {
	t.Parallel()
	b := setup(t)
	with := func(k string, v any) map[string]any {
		m := scheduleBody()
		if v == nil {
			delete(m, k)
		} else {
			m[k] = v
		}
		return m
	}
	cases := []struct {
		name  string
		body  any
		field string
	}{
		{"no cron", with("cron", nil), "cron"},
		{"bad cron", with("cron", "61 9 * * *"), "cron"},
		{"every", with("cron", "@every 1m"), "cron"},
		{"bad zone", with("timezone", "Mars/Base"), "timezone"},
		{"bad priority", with("priority", "now"), "priority"},
		{"ttl zero", with("ttl_seconds", 0), "ttl_seconds"},
		{"starts without offset", with("starts_at", "2026-12-01T09:00:00"), "starts_at"},
		{"if_passed without local time", with("if_passed", "skip"), "local_time"},
		{"local time bad fallback", func() map[string]any { m := with("local_time", true); m["fallback_timezone"] = "X/Y"; return m }(), "fallback_timezone"},
		{"local time bad policy", func() map[string]any { m := with("local_time", true); m["if_passed"] = "later"; return m }(), "if_passed"},
		{"no audience", with("audience", nil), "audience"},
		{"unknown segment", with("audience", map[string]any{"type": "segment", "id": "nope"}), "audience.id"},
		{"no payload", with("payload", nil), "payload"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			requireError(t, b.call(t, request{method: http.MethodPost, path: "/v1/schedules", body: tc.body}), http.StatusBadRequest, "invalid_field", tc.field)
		})
	}
	m := scheduleBody()
	m["starts_at"], m["ends_at"] = "2027-01-02T00:00:00Z", "2027-01-01T00:00:00Z"
	requireError(t, b.call(t, request{method: http.MethodPost, path: "/v1/schedules", body: m}), http.StatusBadRequest, "invalid_field", "ends_at")
	requireError(t, b.call(t, request{method: http.MethodPatch, path: "/v1/schedules/sch_1", body: map[string]any{}}), http.StatusBadRequest, "invalid_field", "paused")
	requireError(t, b.call(t, request{method: http.MethodPatch, path: "/v1/schedules/sch_99", body: map[string]any{"paused": true}}), http.StatusNotFound, "not_found", "")
	requireError(t, b.call(t, request{method: http.MethodGet, path: "/v1/schedules/nope"}), http.StatusNotFound, "not_found", "")
}

func TestScheduleRefusedWhenItRunsTooOften(t *testing.T) {
	t.Parallel()
	b := setupWith(t, dbtestNew(t), Config{ScheduleLimits: jobs.ScheduleLimits{MinInterval: 5 * time.Minute, MaxAhead: 30}})
	b.population(t, "p", 2, 1)
	create := func(cron string, localTime bool, startsAt string) *httptest.ResponseRecorder {
		body := scheduleBody()
		body["cron"], body["local_time"] = cron, localTime
		if startsAt != "" {
			body["starts_at"] = startsAt
		}
		return b.call(t, request{method: http.MethodPost, path: "/v1/schedules", body: body})
	}
	rec := create("* * * * *", false, "")
	requireError(t, rec, http.StatusBadRequest, "invalid_field", "cron")
	require.Contains(t, rec.Body.String(), "at most once every 5m0s")
	require.Equal(t, http.StatusCreated, create("*/5 * * * *", false, "").Code)

	rec = create("*/30 * * * *", true, "")
	requireError(t, rec, http.StatusBadRequest, "invalid_field", "cron")
	require.Contains(t, rec.Body.String(), "at most 30 may wait")
	require.Equal(t, http.StatusCreated, create("0 * * * *", true, "").Code)

	// A dense day weeks after the schedule starts is seen too.
	requireError(t, create("* 3 1 * *", false, "2031-05-02T00:00:00Z"), http.StatusBadRequest, "invalid_field", "cron")
}

func TestScheduleIdempotencyKey(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.population(t, "p", 2, 1)
	withKey := func(key string, body any) request {
		return request{method: http.MethodPost, path: "/v1/schedules", body: body, header: map[string]string{"Idempotency-Key": key}}
	}

	first := b.call(t, withKey("daily", scheduleBody()))
	require.Equal(t, http.StatusCreated, first.Code, first.Body.String())
	again := b.call(t, withKey("daily", scheduleBody()))
	require.Equal(t, http.StatusOK, again.Code, "a retry answers the schedule it made: %s", again.Body.String())
	require.JSONEq(t, first.Body.String(), again.Body.String())
	require.Equal(t, first.Header().Get("Location"), again.Header().Get("Location"))

	// The same schedule said otherwise (the defaults spelt out, starts_at
	// in another offset) is the same request.
	body := scheduleBody()
	body["starts_at"] = "2026-01-01T01:00:00+01:00"
	require.Equal(t, http.StatusCreated, b.call(t, withKey("starts", body)).Code)
	body["starts_at"], body["local_time"] = "2026-01-01T00:00:00Z", false
	require.Equal(t, http.StatusOK, b.call(t, withKey("starts", body)).Code)

	other := scheduleBody()
	other["cron"] = "0 10 * * MON-FRI"
	requireError(t, b.call(t, withKey("daily", other)), http.StatusConflict, "idempotency_key_reused", "")

	// A key a message used is not a schedule's, nor the other way round.
	msg := b.call(t, request{method: http.MethodPost, path: "/v1/messages", header: map[string]string{"Idempotency-Key": "shared"},
		body: messageBody(map[string]any{"type": "users", "ids": []string{"p0"}})})
	require.Equal(t, http.StatusAccepted, msg.Code, msg.Body.String())
	sch := b.call(t, withKey("shared", scheduleBody()))
	require.Equal(t, http.StatusCreated, sch.Code, sch.Body.String())
	require.NotEmpty(t, decodeBody(t, sch)["schedule_id"])
	msg = b.call(t, request{method: http.MethodPost, path: "/v1/messages", header: map[string]string{"Idempotency-Key": "daily"},
		body: messageBody(map[string]any{"type": "users", "ids": []string{"p0"}})})
	require.Equal(t, http.StatusAccepted, msg.Code, msg.Body.String())

	// Keys are the API key's own: another caller's same key is its own.
	rec := b.call(t, request{method: http.MethodPost, path: "/v1/schedules", body: scheduleBody(),
		header: map[string]string{"Idempotency-Key": "daily", "Authorization": "Bearer another-key-0123456789"}})
	require.Equal(t, http.StatusCreated, rec.Code, rec.Body.String())
	require.NotEqual(t, decodeBody(t, first)["schedule_id"], decodeBody(t, rec)["schedule_id"])

	// A key must be text a header can carry.
	requireError(t, b.call(t, withKey(strings.Repeat("k", 256), scheduleBody())), http.StatusBadRequest, "invalid_field", "Idempotency-Key")

	var schedules int
	require.NoError(t, b.db.Pool.QueryRow(context.Background(), "SELECT count(*) FROM schedules").Scan(&schedules))
	require.Equal(t, 4, schedules, "daily, starts, shared, and another caller's daily")
}

func TestScheduleIdempotencyKeyConcurrentRetries(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.population(t, "c", 2, 1)
	const retries = 10
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		ids      = map[string]int{}
		statuses = map[int]int{}
	)
	for range retries {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rec := b.call(t, request{method: http.MethodPost, path: "/v1/schedules", body: scheduleBody(),
				header: map[string]string{"Idempotency-Key": "same"}})
			mu.Lock()
			defer mu.Unlock()
			statuses[rec.Code]++
			if rec.Code == http.StatusCreated || rec.Code == http.StatusOK {
				ids[decodeBody(t, rec)["schedule_id"].(string)]++
			}
		}()
	}
	wg.Wait()
	require.Equal(t, map[int]int{http.StatusCreated: 1, http.StatusOK: retries - 1}, statuses)
	require.Len(t, ids, 1, "every retry gets the one schedule")
	var schedules int
	require.NoError(t, b.db.Pool.QueryRow(context.Background(), "SELECT count(*) FROM schedules").Scan(&schedules))
	require.Equal(t, 1, schedules)
}
