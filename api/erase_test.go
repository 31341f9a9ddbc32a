package api

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/heraldpush/herald/jobs"
)

// chunkArgs is the args of every chunk job River holds, as text.
func chunkArgs(t *testing.T, b *bundle) string {
	t.Helper()
	var args string
	require.NoError(t, b.db.Pool.QueryRow(context.Background(),
		`SELECT coalesce(string_agg(args::text, ' '), '') FROM river_job WHERE kind LIKE 'fan_out%'`).Scan(&args))
	return args
}

// TestDeleteUserErasesIt reads a user back, erases it, and checks that its
// devices, memberships and tokens are gone everywhere Herald keeps them (the
// chunk jobs included), that what was pending for it is cancelled, and that
// a user sharing its chunk keeps everything.
func TestDeleteUserErasesIt(t *testing.T) {
	t.Parallel()
	b := setup(t)
	gone, kept := strings.Repeat("ab", 32), strings.Repeat("cd", 32)
	for _, d := range []map[string]any{
		{"user_id": "u_gone", "channel": "apns", "token": gone},
		{"user_id": "u_gone", "channel": "fcm", "token": "fcm-token-of-u_gone"},
		{"user_id": "u_kept", "channel": "apns", "token": kept},
	} {
		status, resp := b.do(t, http.MethodPost, "/v1/devices", d)
		require.Equal(t, http.StatusCreated, status, resp)
	}
	status, resp := b.do(t, http.MethodPut, "/v1/users/u_gone", map[string]any{"timezone": "Asia/Kolkata"})
	require.Equal(t, http.StatusOK, status, resp)
	status, resp = b.do(t, http.MethodPut, "/v1/segments/seg", map[string]any{"name": "s"})
	require.Equal(t, http.StatusCreated, status, resp)
	status, resp = b.do(t, http.MethodPost, "/v1/segments/seg/members", map[string]any{"user_ids": []string{"u_gone", "u_kept"}})
	require.Equal(t, http.StatusOK, status, resp)

	status, resp = b.do(t, http.MethodGet, "/v1/users/u_gone", nil)
	require.Equal(t, http.StatusOK, status, resp)
	require.Equal(t, "Asia/Kolkata", resp["timezone"])
	require.EqualValues(t, 2, resp["device_count"])
	require.EqualValues(t, 2, resp["active_device_count"])

	// A message for later, one chunk holding both users' devices.
	later := time.Now().Add(time.Hour).UTC().Format(time.RFC3339)
	status, resp = b.do(t, http.MethodPost, "/v1/messages", map[string]any{
		"dispatch_at": later, "audience": map[string]any{"type": "segment", "id": "seg"}, "payload": map[string]any{"title": "t"}})
	require.Equal(t, http.StatusAccepted, status, resp)
	msg := resp["message_id"].(string)
	require.EqualValues(t, 1, resp["chunk_count"])
	// A chunk job names a range of the ledger and holds no token.
	require.NotContains(t, chunkArgs(t, b), gone)
	require.NotContains(t, chunkArgs(t, b), kept)

	rec := b.call(t, request{method: http.MethodDelete, path: "/v1/users/u_gone"})
	require.Equal(t, http.StatusNoContent, rec.Code, rec.Body.String())

	requireError(t, b.call(t, request{method: http.MethodGet, path: "/v1/users/u_gone"}), http.StatusNotFound, "not_found", "")
	requireError(t, b.call(t, request{method: http.MethodGet, path: "/v1/users/u_gone/devices"}), http.StatusNotFound, "not_found", "")
	requireError(t, b.call(t, request{method: http.MethodDelete, path: "/v1/users/u_gone"}), http.StatusNotFound, "not_found", "")
	status, resp = b.do(t, http.MethodGet, "/v1/segments/seg/members", nil)
	require.Equal(t, http.StatusOK, status, resp)
	require.Len(t, resp["items"], 1)
	require.Equal(t, "u_kept", resp["items"].([]any)[0].(map[string]any)["user_id"])

	// Pending deliveries cancelled; the other user's still pending.
	status, resp = b.do(t, http.MethodGet, "/v1/messages/"+msg, nil)
	require.Equal(t, http.StatusOK, status, resp)
	deliveries := resp["deliveries"].(map[string]any)
	require.EqualValues(t, 2, deliveries["cancelled"], resp)
	require.EqualValues(t, 1, deliveries["pending"], resp)

	// No token of the user is left: not in devices (the chunk job never
	// held one).
	var tokens int
	require.NoError(t, b.db.Pool.QueryRow(context.Background(),
		`SELECT count(*) FROM devices WHERE token IN ($1, 'fcm-token-of-u_gone')`, gone).Scan(&tokens))
	require.Zero(t, tokens)

	// The user can come back, as new.
	status, resp = b.do(t, http.MethodPost, "/v1/devices", map[string]any{"user_id": "u_gone", "channel": "fcm", "token": "fcm-token-2"})
	require.Equal(t, http.StatusCreated, status, resp)
	status, resp = b.do(t, http.MethodGet, "/v1/users/u_gone", nil)
	require.Equal(t, http.StatusOK, status, resp)
	require.Nil(t, resp["timezone"])
	require.EqualValues(t, 1, resp["device_count"])
}

// TestDeleteUserWaitsForMessagesBeingMade: a message whose transaction read
// the user's devices before the erasure committed has its pending
// deliveries cancelled by the erasure, not left to be sent.
func TestDeleteUserWaitsForMessagesBeingMade(t *testing.T) {
	t.Parallel()
	b := setup(t)
	status, resp := b.do(t, http.MethodPost, "/v1/devices", map[string]any{"user_id": "u_race", "channel": "fcm", "token": "fcm-race"})
	require.Equal(t, http.StatusCreated, status, resp)
	ctx := context.Background()

	// A message being made: its audience is expanded, its transaction open.
	tx, err := b.db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	enq := jobs.NewEnqueuer(insertOnlyRiver(t, b.db), 500)
	m, err := enq.Create(ctx, tx, jobs.MessageSpec{
		Priority: jobs.PriorityBulk, DispatchAt: time.Now().Add(time.Hour), ExpiresAt: time.Now().Add(2 * time.Hour),
		Audience: jobs.Audience{UserIDs: []string{"u_race"}}, AudienceJSON: []byte(`{}`),
	})
	require.NoError(t, err)
	require.EqualValues(t, 1, m.DeviceCount)

	deleted := make(chan int, 1)
	go func() { deleted <- b.call(t, request{method: http.MethodDelete, path: "/v1/users/u_race"}).Code }()
	// The erasure waits for the message; without that wait it would be
	// done well within this.
	select {
	case code := <-deleted:
		t.Fatalf("the erasure answered %d while a message holding the user's device was being made", code)
	case <-time.After(300 * time.Millisecond):
	}
	require.NoError(t, tx.Commit(ctx))
	require.Equal(t, http.StatusNoContent, <-deleted)

	got, err := b.q.GetMessage(ctx, m.ID)
	require.NoError(t, err)
	require.EqualValues(t, 0, got.PendingCount)
	require.EqualValues(t, 1, got.CancelledCount)
}

func TestSegmentsReadBackAndDelete(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, id := range []string{"seg_c", "seg_a", "seg_b"} {
		status, resp := b.do(t, http.MethodPut, "/v1/segments/"+id, map[string]any{"name": "name of " + id})
		require.Equal(t, http.StatusCreated, status, resp)
	}
	status, resp := b.do(t, http.MethodPost, "/v1/segments/seg_a/members", map[string]any{"user_ids": userIDs("m", 5)})
	require.Equal(t, http.StatusOK, status, resp)

	// Segments, two a page, in id order.
	var segs []string
	path := "/v1/segments?limit=2"
	for pages := 0; ; pages++ {
		require.Less(t, pages, 3)
		status, resp = b.do(t, http.MethodGet, path, nil)
		require.Equal(t, http.StatusOK, status, resp)
		for _, it := range resp["items"].([]any) {
			item := it.(map[string]any)
			segs = append(segs, item["segment_id"].(string))
			if item["segment_id"] == "seg_a" {
				require.EqualValues(t, 5, item["member_count"])
				require.Equal(t, "name of seg_a", item["name"])
			}
		}
		if resp["next_cursor"] == nil {
			break
		}
		path = "/v1/segments?limit=2&cursor=" + resp["next_cursor"].(string)
	}
	require.Equal(t, []string{"seg_a", "seg_b", "seg_c"}, segs)

	// Members, two a page, in user id order.
	var members []string
	path = "/v1/segments/seg_a/members?limit=2"
	var memberCursor string
	for pages := 0; ; pages++ {
		require.Less(t, pages, 4)
		status, resp = b.do(t, http.MethodGet, path, nil)
		require.Equal(t, http.StatusOK, status, resp)
		require.Equal(t, "seg_a", resp["segment_id"])
		for _, it := range resp["items"].([]any) {
			members = append(members, it.(map[string]any)["user_id"].(string))
		}
		if resp["next_cursor"] == nil {
			break
		}
		memberCursor = resp["next_cursor"].(string)
		path = "/v1/segments/seg_a/members?limit=2&cursor=" + memberCursor
	}
	require.Equal(t, userIDs("m", 5), members)

	// A cursor is for its own listing only.
	requireError(t, b.call(t, request{method: http.MethodGet, path: "/v1/segments/seg_b/members?cursor=" + memberCursor}),
		http.StatusBadRequest, "invalid_cursor", "cursor")
	requireError(t, b.call(t, request{method: http.MethodGet, path: "/v1/segments?cursor=" + memberCursor}),
		http.StatusBadRequest, "invalid_cursor", "cursor")
	requireError(t, b.call(t, request{method: http.MethodGet, path: "/v1/segments?limit=0"}), http.StatusBadRequest, "invalid_field", "limit")
	requireError(t, b.call(t, request{method: http.MethodGet, path: "/v1/segments/nope/members"}), http.StatusNotFound, "not_found", "")

	// Deleting a segment removes it and its memberships, not its users.
	rec := b.call(t, request{method: http.MethodDelete, path: "/v1/segments/seg_a"})
	require.Equal(t, http.StatusNoContent, rec.Code, rec.Body.String())
	requireError(t, b.call(t, request{method: http.MethodGet, path: "/v1/segments/seg_a"}), http.StatusNotFound, "not_found", "")
	requireError(t, b.call(t, request{method: http.MethodGet, path: "/v1/segments/seg_a/members"}), http.StatusNotFound, "not_found", "")
	requireError(t, b.call(t, request{method: http.MethodDelete, path: "/v1/segments/seg_a"}), http.StatusNotFound, "not_found", "")
	requireError(t, b.call(t, request{method: http.MethodDelete, path: "/v1/segments/bad%21id"}), http.StatusNotFound, "not_found", "")
	status, resp = b.do(t, http.MethodGet, "/v1/users/m3", nil)
	require.Equal(t, http.StatusOK, status, resp)
	var memberships int
	require.NoError(t, b.db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM segment_members`).Scan(&memberships))
	require.Zero(t, memberships)

	// A message to a deleted segment is refused as to an unknown one.
	status, resp = b.do(t, http.MethodPost, "/v1/messages", map[string]any{
		"audience": map[string]any{"type": "segment", "id": "seg_a"}, "payload": map[string]any{"title": "t"}})
	require.Equal(t, http.StatusBadRequest, status, resp)
	require.Equal(t, "audience.id", resp["error"].(map[string]any)["field"])
}

// TestDeleteUserOfManyDevicesInManyChunks erases a user whose devices are
// spread over many chunks, and checks that the chunks, read as their
// workers read them, hold every other device exactly once and none of
// the user's.
func TestDeleteUserOfManyDevicesInManyChunks(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	var devices []map[string]any
	for i := range 40 {
		devices = append(devices, map[string]any{"user_id": fmt.Sprintf("u%02d", i%20), "channel": "fcm", "token": fmt.Sprintf("tok-%02d-%d", i%20, i)})
	}
	status, resp := b.do(t, http.MethodPost, "/v1/devices/batch", map[string]any{"devices": devices})
	require.Equal(t, http.StatusOK, status, resp)
	srv := setupWith(t, b.db, Config{ChunkSize: 3})
	// Every user as the audience.
	ids := make([]string, 20)
	for i := range ids {
		ids[i] = fmt.Sprintf("u%02d", i)
	}
	status, resp = srv.do(t, http.MethodPost, "/v1/messages", map[string]any{
		"dispatch_at": time.Now().Add(time.Hour).UTC().Format(time.RFC3339),
		"audience":    map[string]any{"type": "users", "ids": ids}, "payload": map[string]any{"title": "t"}})
	require.Equal(t, http.StatusAccepted, status, resp)
	require.EqualValues(t, 14, resp["chunk_count"])

	rec := srv.call(t, request{method: http.MethodDelete, path: "/v1/users/u07"})
	require.Equal(t, http.StatusNoContent, rec.Code, rec.Body.String())

	rows, err := b.db.Pool.Query(ctx, `SELECT kind, args FROM river_job WHERE kind LIKE 'fan_out%'`)
	require.NoError(t, err)
	all, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (jobs.FanOutArgs, error) {
		var kind string
		var raw []byte
		if err := r.Scan(&kind, &raw); err != nil {
			return jobs.FanOutArgs{}, err
		}
		return jobs.ChunkArgs(kind, raw)
	})
	require.NoError(t, err)
	require.Len(t, all, 14)
	seen := map[string]int{}
	for _, a := range all {
		pending := chunkTargets(t, b.db.Pool, a)
		require.LessOrEqual(t, len(pending), 3)
		for _, p := range pending {
			seen[p.Token]++
		}
	}
	require.Len(t, seen, 38)
	for tok, n := range seen {
		require.NotContains(t, tok, "tok-07-")
		require.Equal(t, 1, n, tok)
	}
}
