package api

import (
	"errors"
	"fmt"
	"net/http"
	"slices"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/heraldpush/herald/db"
	"github.com/heraldpush/herald/jobs"
	"github.com/heraldpush/herald/jobs/webhook"
)

// MaxWebhooks bounds the webhooks an installation holds: each is a call per
// batch of every message's events, so a few receivers, not one per
// customer.
const MaxWebhooks = 10

// webhookPrefix starts a webhook's external id.
const webhookPrefix = "whk_"

// Webhook is a webhook as it is listed: never its secret.
type Webhook struct {
	WebhookID string    `json:"webhook_id"`
	URL       string    `json:"url"`
	Events    []string  `json:"events"`
	CreatedAt time.Time `json:"created_at"`
}

// createdWebhook is a webhook as POST /v1/webhooks answers it: with its
// secret, once.
type createdWebhook struct {
	Webhook
	Secret string `json:"secret"`
}

// newWebhook is POST /v1/webhooks's body.
type newWebhook struct {
	URL    string   `json:"url"`
	Events []string `json:"events"`

	policy *webhook.Policy
}

func (w *newWebhook) validate() error {
	if w.URL == "" {
		return invalid("url", "url is required")
	}
	if err := w.policy.CheckURL(w.URL); err != nil {
		return invalid("url", "url: %v", err)
	}
	if len(w.Events) == 0 {
		return invalid("events", "events is required: one or more of %v", jobs.WebhookEvents)
	}
	seen := map[string]bool{}
	for _, e := range w.Events {
		if !slices.Contains(jobs.WebhookEvents, e) {
			return invalid("events", "unknown event %q: the events are %v", e, jobs.WebhookEvents)
		}
		if seen[e] {
			return invalid("events", "event %q is named twice", e)
		}
		seen[e] = true
	}
	return nil
}

func webhookOf(id int64, url string, events []string, createdAt time.Time) Webhook {
	return Webhook{WebhookID: webhook.WebhookID(id), URL: url, Events: events, CreatedAt: createdAt.UTC()}
}

// createWebhook makes a webhook; every worker posts to it from about a
// second on.
func (s *Server) createWebhook(c echo.Context) error {
	req := newWebhook{policy: s.cfg.WebhookEgress}
	if err := decode(c, smallBodyLimit, &req); err != nil {
		return err
	}
	secret := webhook.NewSecret()
	row, err := db.On(s.pool).CreateWebhook(c.Request().Context(), db.CreateWebhookParams{
		Url: req.URL, Events: req.Events, Secret: secret, MaxWebhooks: MaxWebhooks,
	})
	if errors.Is(err, db.ErrNotFound) {
		return &Error{Status: http.StatusConflict, Code: "too_many_webhooks",
			Message: fmt.Sprintf("there are %d webhooks already, the most Herald holds: delete one first", MaxWebhooks)}
	}
	if err != nil {
		return fmt.Errorf("create webhook: %w", err)
	}
	w := webhookOf(row.ID, row.Url, row.Events, row.CreatedAt)
	setAuditTarget(c, w.WebhookID)
	return c.JSON(http.StatusCreated, createdWebhook{Webhook: w, Secret: secret})
}

type webhookList struct {
	Items []Webhook `json:"items"`
}

// listWebhooks lists every webhook (there are at most MaxWebhooks), oldest
// first, never their secrets.
func (s *Server) listWebhooks(c echo.Context) error {
	rows, err := db.On(s.pool).ListWebhooks(c.Request().Context())
	if err != nil {
		return fmt.Errorf("list webhooks: %w", err)
	}
	out := webhookList{Items: make([]Webhook, 0, len(rows))}
	for _, r := range rows {
		out.Items = append(out.Items, webhookOf(r.ID, r.Url, r.Events, r.CreatedAt))
	}
	return c.JSON(http.StatusOK, out)
}

func (s *Server) getWebhook(c echo.Context) error {
	raw := c.Param("webhook_id")
	id, ok := parseID(webhookPrefix, raw)
	if !ok {
		return notFound("webhook", raw)
	}
	row, err := db.On(s.pool).GetWebhook(c.Request().Context(), id)
	if errors.Is(err, db.ErrNotFound) {
		return notFound("webhook", raw)
	}
	if err != nil {
		return fmt.Errorf("get webhook: %w", err)
	}
	return c.JSON(http.StatusOK, webhookOf(row.ID, row.Url, row.Events, row.CreatedAt))
}

// deleteWebhook deletes a webhook and the events not yet posted to it:
// nothing more is.
func (s *Server) deleteWebhook(c echo.Context) error {
	raw := c.Param("webhook_id")
	setAuditTarget(c, raw)
	id, ok := parseID(webhookPrefix, raw)
	if !ok {
		return notFound("webhook", raw)
	}
	n, err := db.On(s.pool).DeleteWebhook(c.Request().Context(), id)
	if err != nil {
		return fmt.Errorf("delete webhook: %w", err)
	}
	if n == 0 {
		return notFound("webhook", raw)
	}
	return c.NoContent(http.StatusNoContent)
}
