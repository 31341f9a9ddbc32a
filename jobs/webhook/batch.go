package webhook

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"
)

// Batch is the body of one call: events of one message for one webhook, in
// the order they happened (a message's failures over its ledger writes,
// its receipts, its settle). Type is always "batch".
type Batch struct {
	Type string `json:"type"`
	// ID is the batch's, the same as the webhook-id header: a receiver
	// that has seen it has seen these events.
	ID        string  `json:"id"`
	WebhookID string  `json:"webhook_id"`
	MessageID string  `json:"message_id"`
	Events    []Event `json:"events"`
}

// Event is one fact. DeviceID, UserID and Reason are set for the delivery
// and device events; Data for message.settled (its state and counters).
type Event struct {
	Type     string          `json:"type"`
	DeviceID string          `json:"device_id,omitempty"`
	UserID   string          `json:"user_id,omitempty"`
	Reason   string          `json:"reason,omitempty"`
	At       time.Time       `json:"at"`
	Data     json.RawMessage `json:"data,omitempty"`
}

// BatchID is the external id of batch n, the webhook-id of its calls.
func BatchID(n int64) string { return "whb_" + strconv.FormatInt(n, 10) }

// WebhookID is the external id of webhook n.
func WebhookID(n int64) string { return "whk_" + strconv.FormatInt(n, 10) }

// Post signs body and posts it to url, at now, and returns the answer's
// status; the answer's body is read (at most a little, so the connection
// can be reused) and ignored. An error is a call that got no answer.
func Post(ctx context.Context, client *http.Client, url, secret, id string, now time.Time, body []byte) (int, error) {
	ts := now.Unix()
	sig, err := Sign(secret, id, ts, body)
	if err != nil {
		return 0, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return 0, fmt.Errorf("webhook request: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "Herald-Webhooks")
	req.Header.Set(HeaderID, id)
	req.Header.Set(HeaderTimestamp, strconv.FormatInt(ts, 10))
	req.Header.Set(HeaderSignature, sig)
	res, err := client.Do(req)
	if err != nil {
		return 0, err
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(res.Body, 64<<10))
	_ = res.Body.Close()
	return res.StatusCode, nil
}
