package api

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/heraldpush/herald/jobs/webhook"
)

func TestWebhooksAPI(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rec := b.call(t, request{method: http.MethodPost, path: "/v1/webhooks",
		body: map[string]any{"url": "https://hooks.example.com/herald", "events": []string{"delivery.failed", "message.settled"}}})
	require.Equal(t, http.StatusCreated, rec.Code, rec.Body.String())
	var made createdWebhook
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &made))
	require.True(t, strings.HasPrefix(made.WebhookID, webhookPrefix), made.WebhookID)
	require.True(t, strings.HasPrefix(made.Secret, "whsec_"), made.Secret)
	_, err := webhook.Sign(made.Secret, "whb_1", 1, nil)
	require.NoError(t, err, "the secret is one Sign takes")
	require.Equal(t, []string{"delivery.failed", "message.settled"}, made.Events)

	// An admin's: a send key can neither make nor read one.
	send := b.makeKey(t, "app", ScopeSend, nil)
	for _, r := range []request{
		{method: http.MethodPost, path: "/v1/webhooks", body: map[string]any{"url": "https://hooks.example.com/", "events": []string{"delivery.failed"}}},
		{method: http.MethodGet, path: "/v1/webhooks"},
		{method: http.MethodGet, path: "/v1/webhooks/" + made.WebhookID},
		{method: http.MethodDelete, path: "/v1/webhooks/" + made.WebhookID},
	} {
		requireError(t, b.call(t, as(send, r)), http.StatusForbidden, "forbidden", "")
	}
	// Made, it is in the audit log under its id.
	var audited int
	require.NoError(t, b.db.Pool.QueryRow(context.Background(),
		"SELECT count(*) FROM audit_log WHERE route = '/v1/webhooks' AND method = 'POST' AND status = 201 AND target_id = $1", made.WebhookID).Scan(&audited))
	require.Equal(t, 1, audited)

	// The secret is shown once: neither the list nor the webhook shows it.
	rec = b.call(t, request{method: http.MethodGet, path: "/v1/webhooks"})
	require.Equal(t, http.StatusOK, rec.Code)
	require.NotContains(t, rec.Body.String(), made.Secret)
	var list webhookList
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &list))
	require.Equal(t, []Webhook{made.Webhook}, list.Items)
	rec = b.call(t, request{method: http.MethodGet, path: "/v1/webhooks/" + made.WebhookID})
	require.Equal(t, http.StatusOK, rec.Code)
	require.NotContains(t, rec.Body.String(), made.Secret)

	for _, tc := range []struct {
		body map[string]any
		why  string
	}{
		{map[string]any{"url": "https://10.0.0.7/hook", "events": []string{"delivery.failed"}}, "a private address"},
		{map[string]any{"url": "https://127.0.0.1:8443/hook", "events": []string{"delivery.failed"}}, "a loopback address"},
		{map[string]any{"url": "https://[::1]/hook", "events": []string{"delivery.failed"}}, "a loopback address"},
		{map[string]any{"url": "https://169.254.169.254/latest/meta-data", "events": []string{"delivery.failed"}}, "a link-local address"},
		{map[string]any{"url": "https://localhost/hook", "events": []string{"delivery.failed"}}, "localhost"},
		{map[string]any{"url": "http://hooks.example.com/herald", "events": []string{"delivery.failed"}}, "https"},
		{map[string]any{"url": "https://user:pw@hooks.example.com/", "events": []string{"delivery.failed"}}, "credentials"},
		{map[string]any{"url": "https://hooks.example.com/" + strings.Repeat("a", 2048), "events": []string{"delivery.failed"}}, "longer than 2048"},
		{map[string]any{"url": "/relative", "events": []string{"delivery.failed"}}, "absolute"},
	} {
		rec := b.call(t, request{method: http.MethodPost, path: "/v1/webhooks", body: tc.body})
		requireError(t, rec, http.StatusBadRequest, "invalid_field", "url")
		require.Contains(t, rec.Body.String(), tc.why, tc.body["url"])
	}
	for _, events := range [][]string{nil, {}, {"delivery.sent"}, {"delivery.failed", "delivery.failed"}} {
		rec := b.call(t, request{method: http.MethodPost, path: "/v1/webhooks", body: map[string]any{"url": "https://hooks.example.com/", "events": events}})
		requireError(t, rec, http.StatusBadRequest, "invalid_field", "events")
	}

	// A bounded number.
	for i := 1; i < MaxWebhooks; i++ {
		rec := b.call(t, request{method: http.MethodPost, path: "/v1/webhooks",
			body: map[string]any{"url": fmt.Sprintf("https://hooks.example.com/%d", i), "events": []string{"device.evicted"}}})
		require.Equal(t, http.StatusCreated, rec.Code, rec.Body.String())
	}
	rec = b.call(t, request{method: http.MethodPost, path: "/v1/webhooks",
		body: map[string]any{"url": "https://hooks.example.com/one-more", "events": []string{"device.evicted"}}})
	requireError(t, rec, http.StatusConflict, "too_many_webhooks", "")

	require.Equal(t, http.StatusNoContent, b.call(t, request{method: http.MethodDelete, path: "/v1/webhooks/" + made.WebhookID}).Code)
	requireError(t, b.call(t, request{method: http.MethodGet, path: "/v1/webhooks/" + made.WebhookID}), http.StatusNotFound, "not_found", "")
	requireError(t, b.call(t, request{method: http.MethodDelete, path: "/v1/webhooks/" + made.WebhookID}), http.StatusNotFound, "not_found", "")
	requireError(t, b.call(t, request{method: http.MethodDelete, path: "/v1/webhooks/whk_x"}), http.StatusNotFound, "not_found", "")
	rec = b.call(t, request{method: http.MethodPost, path: "/v1/webhooks",
		body: map[string]any{"url": "https://hooks.example.com/one-more", "events": []string{"device.evicted"}}})
	require.Equal(t, http.StatusCreated, rec.Code, "a deleted webhook frees its place: %s", rec.Body.String())
}

// TestWebhookHostsTheOperatorTrusts: a host the operator trusts may be
// inside the network, and over plain http.
func TestWebhookHostsTheOperatorTrusts(t *testing.T) {
	t.Parallel()
	policy, err := webhook.NewPolicy([]string{"127.0.0.1", "hooks.internal:8080"})
	require.NoError(t, err)
	b := setupWith(t, dbtestNew(t), Config{WebhookEgress: policy})
	for url, status := range map[string]int{
		"http://127.0.0.1:9999/hook":       http.StatusCreated,
		"https://127.0.0.1/hook":           http.StatusCreated,
		"http://hooks.internal:8080/hook":  http.StatusCreated,
		"http://hooks.internal:8081/hook":  http.StatusBadRequest,
		"https://10.1.2.3/hook":            http.StatusBadRequest,
		"http://hooks.example.com/herald/": http.StatusBadRequest,
	} {
		rec := b.call(t, request{method: http.MethodPost, path: "/v1/webhooks", body: map[string]any{"url": url, "events": []string{"delivery.failed"}}})
		require.Equal(t, status, rec.Code, "%s: %s", url, rec.Body.String())
	}
}
