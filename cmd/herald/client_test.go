package main

import (
	"context"
	"go/ast"
	"go/parser"
	"go/token"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/heraldpush/herald/api"
	"github.com/heraldpush/herald/api/client"
)

// TestClientSegmentsCancelAndPause drives through the generated client
// the operations the other end-to-end tests have no reason to: the
// unauthenticated documents, a segment's members added and removed, a
// message to the segment cancelled before its instant and one sent, and a
// schedule paused and resumed, and the segment and a user read back and
// erased.
func TestClientSegmentsCancelAndPause(t *testing.T) {
	t.Parallel()
	e := startE2E(t, nil)
	ctx := t.Context()

	health, err := e.api.GetHealthWithResponse(ctx)
	require.Equal(t, "ok", *answered(t, http.StatusOK, health, err).JSON200.Status)
	doc, err := e.api.GetOpenAPIWithResponse(ctx)
	require.Equal(t, api.OpenAPI(), answered(t, http.StatusOK, doc, err).Body)

	e.register("ann", false)
	e.register("bob", false)
	seg, err := e.api.CreateSegmentWithResponse(ctx, "team", client.SegmentUpdate{Name: new("Team")})
	require.Equal(t, client.Segment{SegmentID: "team", Name: "Team"}, *answered(t, http.StatusCreated, seg, err).JSON201)
	added, err := e.api.AddSegmentMembersWithResponse(ctx, "team", client.MemberIDs{UserIDs: []string{"ann", "bob"}})
	require.Equal(t, client.MembersChange{SegmentID: "team", Added: new(2), MemberCount: 2}, *answered(t, http.StatusOK, added, err).JSON200)
	removed, err := e.api.RemoveSegmentMembersWithResponse(ctx, "team", client.MemberIDs{UserIDs: []string{"bob"}})
	require.Equal(t, client.MembersChange{SegmentID: "team", Removed: new(1), MemberCount: 1}, *answered(t, http.StatusOK, removed, err).JSON200)
	got, err := e.api.GetSegmentWithResponse(ctx, "team")
	require.Equal(t, 1, answered(t, http.StatusOK, got, err).JSON200.MemberCount)

	team := client.Audience{Type: client.AudienceTypeSegment, ID: new("team")}
	later := e.send(client.NewMessage{DispatchAt: new(time.Now().Add(time.Hour)), Audience: team, Payload: titled("later")})
	require.Equal(t, 3, later.DeviceCount, "ann's three devices; bob left the segment")
	cancelled, err := e.api.CancelMessageWithResponse(ctx, later.MessageID)
	answered(t, http.StatusNoContent, cancelled, err)
	st := e.message(later.MessageID)
	require.Equal(t, client.MessageStateCancelled, st.State)
	require.Equal(t, client.DeliveryCounts{Total: 3, Cancelled: 3}, st.Deliveries)
	require.Empty(t, e.fake.Receipts(later.MessageID))

	now := e.send(client.NewMessage{Audience: team, Payload: titled("now")})
	require.Equal(t, client.DeliveryCounts{Total: 3, Accepted: 3}, e.settle(now.MessageID, 30*time.Second).Deliveries)
	require.Len(t, e.fake.Receipts(now.MessageID), 3)

	sch := e.createSchedule(client.NewSchedule{Cron: "0 9 * * *", Audience: team, Payload: titled("daily")})
	require.False(t, sch.Paused)
	for _, paused := range []bool{true, false} {
		res, err := e.api.UpdateScheduleWithResponse(ctx, sch.ScheduleID, client.SchedulePatch{Paused: paused})
		require.Equal(t, paused, answered(t, http.StatusOK, res, err).JSON200.Paused)
	}

	// Read back, then erased: the segment, and a user with its devices.
	segments, err := e.api.ListSegmentsWithResponse(ctx, &client.ListSegmentsParams{})
	require.Equal(t, []client.Segment{{SegmentID: "team", Name: "Team", MemberCount: 1}}, answered(t, http.StatusOK, segments, err).JSON200.Items)
	members, err := e.api.ListSegmentMembersWithResponse(ctx, "team", &client.ListSegmentMembersParams{})
	page := answered(t, http.StatusOK, members, err).JSON200
	require.Len(t, page.Items, 1)
	require.Equal(t, "ann", page.Items[0].UserID)
	dropped, err := e.api.DeleteSegmentWithResponse(ctx, "team")
	answered(t, http.StatusNoContent, dropped, err)
	gone, err := e.api.GetSegmentWithResponse(ctx, "team")
	answered(t, http.StatusNotFound, gone, err)

	ann, err := e.api.GetUserWithResponse(ctx, "ann")
	require.Equal(t, 3, answered(t, http.StatusOK, ann, err).JSON200.DeviceCount)
	erased, err := e.api.DeleteUserWithResponse(ctx, "ann")
	answered(t, http.StatusNoContent, erased, err)
	ann, err = e.api.GetUserWithResponse(ctx, "ann")
	answered(t, http.StatusNotFound, ann, err)
	devices, err := e.api.ListUserDevicesWithResponse(ctx, "ann", nil)
	answered(t, http.StatusNotFound, devices, err)
}

// TestClientCallsEveryOperation holds the end-to-end tests (and herald
// bench) to driving the whole API through the generated client: each
// operation of openapi.yaml is called, by its method, somewhere in their
// code. A new operation needs an end-to-end call too.
func TestClientCallsEveryOperation(t *testing.T) {
	t.Parallel()
	var doc struct {
		Paths map[string]map[string]struct {
			OperationID string `yaml:"operationId"`
		} `yaml:"paths"`
	}
	require.NoError(t, yaml.Unmarshal(api.OpenAPI(), &doc))

	called := map[string]bool{}
	files, err := filepath.Glob("*_test.go")
	require.NoError(t, err)
	bench, err := filepath.Glob("heraldbench/*.go")
	require.NoError(t, err)
	for _, name := range append(files, bench...) {
		f, err := parser.ParseFile(token.NewFileSet(), name, nil, 0)
		require.NoError(t, err)
		ast.Inspect(f, func(n ast.Node) bool {
			if call, ok := n.(*ast.CallExpr); ok {
				if sel, ok := call.Fun.(*ast.SelectorExpr); ok {
					called[strings.TrimSuffix(sel.Sel.Name, "WithResponse")] = true
				}
			}
			return true
		})
	}
	operations := 0
	for path, methods := range doc.Paths {
		for method, op := range methods {
			switch method {
			case "get", "put", "post", "patch", "delete":
			default:
				continue // parameters shared by the path's operations
			}
			require.NotEmpty(t, op.OperationID, "%s %s", method, path)
			operations++
			goName := strings.ToUpper(op.OperationID[:1]) + op.OperationID[1:]
			require.True(t, called[goName], "no end-to-end test calls %s (%s %s) through the generated client", goName, strings.ToUpper(method), path)
		}
	}
	require.Positive(t, operations)
}

// TestHeadersTooLargeAsDocumented sends headers past net/http's limit
// (1 MB) to a route that takes no input: the answer is the 431 openapi.yaml
// documents for it, in plain text.
func TestHeadersTooLargeAsDocumented(t *testing.T) {
	t.Parallel()
	e := startE2E(t, nil)
	big := func(_ context.Context, req *http.Request) error {
		req.Header.Set("X-Padding", strings.Repeat("a", http.DefaultMaxHeaderBytes+8192))
		return nil
	}
	for range 3 {
		res, err := e.api.GetHealthWithResponse(t.Context(), big)
		answered(t, http.StatusRequestHeaderFieldsTooLarge, res, err)
		require.True(t, strings.HasPrefix(res.ContentType(), "text/plain"), res.ContentType())
	}
}
