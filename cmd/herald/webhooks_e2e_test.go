package main

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/heraldpush/herald/api/client"
	"github.com/heraldpush/herald/jobs"
	"github.com/heraldpush/herald/jobs/push"
)

// hookReceiver is a caller's webhook endpoint. It verifies every call's
// signature as the Standard Webhooks convention says, written here from the
// convention and not from Herald's signing code, and keeps every call.
type hookReceiver struct {
	t   *testing.T
	srv *httptest.Server
	// refuseFirst answers 500 to the first call of each webhook-id.
	refuseFirst bool
	// hang holds every call until it is closed, answering nothing.
	hang chan struct{}

	mu     sync.Mutex
	secret string
	calls  []hookCall
}

// hookCall is one call the receiver got.
type hookCall struct {
	id     string
	status int
	batch  hookBatch
}

type hookBatch struct {
	Type      string      `json:"type"`
	ID        string      `json:"id"`
	WebhookID string      `json:"webhook_id"`
	MessageID string      `json:"message_id"`
	Events    []hookEvent `json:"events"`
}

type hookEvent struct {
	Type     string          `json:"type"`
	DeviceID string          `json:"device_id"`
	UserID   string          `json:"user_id"`
	Reason   string          `json:"reason"`
	At       time.Time       `json:"at"`
	Data     json.RawMessage `json:"data"`
}

func newHookReceiver(t *testing.T) *hookReceiver {
	r := &hookReceiver{t: t}
	r.srv = httptest.NewServer(http.HandlerFunc(r.serve))
	t.Cleanup(func() {
		if r.hang != nil {
			close(r.hang)
		}
		r.srv.Close()
	})
	return r
}

// verified says whether the call's signature is the secret's.
func verified(secret string, h http.Header, body []byte) error {
	id, ts, sigs := h.Get("webhook-id"), h.Get("webhook-timestamp"), h.Get("webhook-signature")
	if id == "" || ts == "" || sigs == "" {
		return fmt.Errorf("missing headers: %v", h)
	}
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return fmt.Errorf("timestamp %q", ts)
	}
	if d := time.Since(time.Unix(sec, 0)); d > 5*time.Minute || d < -5*time.Minute {
		return fmt.Errorf("timestamp %s is %s off", ts, d)
	}
	key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(secret, "whsec_"))
	if err != nil {
		return err
	}
	mac := hmac.New(sha256.New, key)
	fmt.Fprintf(mac, "%s.%s.%s", id, ts, body)
	want := mac.Sum(nil)
	for _, sig := range strings.Fields(sigs) {
		v, b64, _ := strings.Cut(sig, ",")
		got, err := base64.StdEncoding.DecodeString(b64)
		if v == "v1" && err == nil && hmac.Equal(got, want) {
			return nil
		}
	}
	return fmt.Errorf("no signature of %q matches", sigs)
}

func (r *hookReceiver) serve(w http.ResponseWriter, req *http.Request) {
	body, err := io.ReadAll(req.Body)
	if err != nil {
		return
	}
	r.mu.Lock()
	secret := r.secret
	r.mu.Unlock()
	if err := verified(secret, req.Header, body); err != nil {
		r.t.Errorf("a webhook call that does not verify: %v", err)
		http.Error(w, err.Error(), http.StatusUnauthorized)
		return
	}
	var b hookBatch
	if err := json.Unmarshal(body, &b); err != nil {
		r.t.Errorf("a webhook body that is not a batch: %v: %s", err, body)
		return
	}
	id := req.Header.Get("webhook-id")
	if b.ID != id {
		r.t.Errorf("batch id %q is not the webhook-id %q", b.ID, id)
	}
	r.mu.Lock()
	status := http.StatusOK
	if r.refuseFirst && !r.seenLocked(id) {
		status = http.StatusInternalServerError
	}
	call := hookCall{id: id, status: status, batch: b}
	if r.hang != nil {
		call.status = 0
	}
	r.calls = append(r.calls, call)
	r.mu.Unlock()
	if r.hang != nil {
		select {
		case <-r.hang:
		case <-req.Context().Done():
		}
		return
	}
	w.WriteHeader(status)
}

func (r *hookReceiver) seenLocked(id string) bool {
	for _, c := range r.calls {
		if c.id == id {
			return true
		}
	}
	return false
}

// accepted are the events of the calls answered 2xx, in order.
func (r *hookReceiver) accepted() []hookEvent {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []hookEvent
	for _, c := range r.calls {
		if c.status == http.StatusOK {
			out = append(out, c.batch.Events...)
		}
	}
	return out
}

func (r *hookReceiver) snapshot() []hookCall {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]hookCall(nil), r.calls...)
}

// createWebhook makes a webhook to the receiver's path and tells it the
// secret.
func (e *e2e) createWebhook(r *hookReceiver, path string, events ...client.WebhookEventType) client.CreatedWebhook {
	e.t.Helper()
	res, err := e.api.CreateWebhookWithResponse(context.Background(), client.NewWebhook{URL: r.srv.URL + path, Events: events})
	made := *answered(e.t, http.StatusCreated, res, err).JSON201
	r.mu.Lock()
	r.secret = made.Secret
	r.mu.Unlock()
	return made
}

// fcmDevices registers one FCM device for each of users, with tokens
// fakepush refuses as unregistered when dead, and returns their ids.
func (e *e2e) fcmDevices(users []string, dead bool) []string {
	e.t.Helper()
	prefix := "live"
	if dead {
		prefix = "dead"
	}
	for start := 0; start < len(users); start += 10_000 {
		var batch []client.DeviceRegistration
		for i, u := range users[start:min(start+10_000, len(users))] {
			batch = append(batch, client.DeviceRegistration{UserID: u, Channel: client.ChannelFCM,
				Token: new(fmt.Sprintf("%s-%s-%d:APA91b%0140x", prefix, u, i, start+i))})
		}
		e.registerDevices(batch)
	}
	var ids []string
	rows, err := e.db.Pool.Query(context.Background(), "SELECT 'dev_' || id FROM devices WHERE user_id = ANY ($1) ORDER BY id", users)
	require.NoError(e.t, err)
	for rows.Next() {
		var id string
		require.NoError(e.t, rows.Scan(&id))
		ids = append(ids, id)
	}
	require.NoError(e.t, rows.Err())
	require.Len(e.t, ids, len(users))
	return ids
}

func users(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = prefix + strconv.Itoa(i)
	}
	return out
}

// soon is an instant a few seconds ahead: every worker has read a webhook
// made just now (it reads the webhooks' event types every second) before
// the message's failures are written.
func soon() *time.Time { return new(time.Now().Add(3 * time.Second)) }

// TestE2EWebhooks: a receiver that verifies every signature gets each
// failed device of a message once, across a 500 and the retry with the
// same webhook-id; device.evicted for each; message.settled once; the
// confirmed and opened deliveries once their receipts are written; and
// nothing more once its webhook is deleted.
func TestE2EWebhooks(t *testing.T) {
	t.Parallel()
	e := startE2E(t, map[string]string{"HERALD_WEBHOOK_HOSTS": "127.0.0.1"})
	hooks := newHookReceiver(t)
	hooks.refuseFirst = true
	w1 := e.createWebhook(hooks, "/w1", client.WebhookEventTypeDeliveryFailed, client.WebhookEventTypeDeviceEvicted,
		client.WebhookEventTypeMessageSettled, client.WebhookEventTypeDeliveryConfirmed, client.WebhookEventTypeDeliveryOpened)
	// Read back, listed and alone, without its secret.
	listed, err := e.api.ListWebhooksWithResponse(context.Background())
	answered(t, http.StatusOK, listed, err)
	require.Len(t, listed.JSON200.Items, 1)
	require.Equal(t, w1.WebhookID, listed.JSON200.Items[0].WebhookID)
	got, err := e.api.GetWebhookWithResponse(context.Background(), w1.WebhookID)
	answered(t, http.StatusOK, got, err)
	require.Len(t, got.JSON200.Events, 5)
	require.NotContains(t, string(listed.Body)+string(got.Body), "whsec_")

	dead := e.fcmDevices(users("dead", 7), true)
	live := e.fcmDevices(users("live", 3), false)
	msg := e.send(client.NewMessage{Audience: toUsers(append(users("dead", 7), users("live", 3)...)...), Payload: titled("hooked"), DispatchAt: soon()})
	st := e.settle(msg.MessageID, time.Minute)
	require.Equal(t, 7, st.Deliveries.Failed, "%+v", st)

	byType := func(typ string) map[string]int {
		n := map[string]int{}
		for _, ev := range hooks.accepted() {
			if ev.Type == typ {
				n[ev.DeviceID+ev.Reason]++
			}
		}
		return n
	}
	require.Eventually(t, func() bool {
		return len(byType("delivery.failed")) == len(dead) && len(byType("device.evicted")) == len(dead) && len(byType("message.settled")) == 1
	}, time.Minute, 50*time.Millisecond, "calls: %+v", hooks.snapshot())
	want := map[string]int{}
	for _, id := range dead {
		want[id+"unregistered"] = 1
	}
	require.Equal(t, want, byType("delivery.failed"), "each failed device once among the calls accepted")
	require.Equal(t, want, byType("device.evicted"))
	require.Equal(t, map[string]int{"": 1}, byType("message.settled"))

	// Every call was refused once, then accepted when retried with the
	// same webhook-id (and so the same events).
	calls := hooks.snapshot()
	answers := map[string][]int{}
	for _, c := range calls {
		require.Equal(t, msg.MessageID, c.batch.MessageID)
		require.Equal(t, w1.WebhookID, c.batch.WebhookID)
		answers[c.id] = append(answers[c.id], c.status)
	}
	for id, got := range answers {
		require.Equal(t, []int{http.StatusInternalServerError, http.StatusOK}, got, "the calls of batch %s", id)
	}
	for _, ev := range hooks.accepted() {
		if ev.Type == "message.settled" {
			var data map[string]any
			require.NoError(t, json.Unmarshal(ev.Data, &data))
			require.Equal(t, map[string]any{"state": "dispatched", "accepted": 3.0, "failed": 7.0, "expired": 0.0, "cancelled": 0.0}, data)
		}
	}

	// Receipts, as the receipt endpoint writes them: the first of a kind
	// counts, a replay inserts nothing.
	id := func(dev string) int64 {
		n, err := strconv.ParseInt(strings.TrimPrefix(dev, "dev_"), 10, 64)
		require.NoError(t, err)
		return n
	}
	m, ok := push.ParseMessageID(msg.MessageID)
	require.True(t, ok)
	for range 2 {
		_, err := e.db.Pool.Exec(context.Background(), `
			INSERT INTO receipts (message_id, device_id, event, received_at, skew_ms)
			VALUES ($1, $2, 'delivered', now(), 10), ($1, $3, 'delivered', now(), 12), ($1, $2, 'opened', now(), 900)
			ON CONFLICT DO NOTHING`, m, id(live[0]), id(live[1]))
		require.NoError(t, err)
	}
	require.Eventually(t, func() bool {
		return len(byType("delivery.confirmed")) == 2 && len(byType("delivery.opened")) == 1
	}, 30*time.Second, 50*time.Millisecond, "calls: %+v", hooks.snapshot())
	require.Equal(t, map[string]int{live[0]: 1, live[1]: 1}, byType("delivery.confirmed"))
	require.Equal(t, map[string]int{live[0]: 1}, byType("delivery.opened"))
	for _, ev := range hooks.accepted() {
		if ev.Type == "delivery.opened" {
			require.Equal(t, "live0", ev.UserID)
		}
	}

	// Deleted: nothing more reaches it. A second webhook, made before the
	// next message, shows when that message's events have been posted.
	other := newHookReceiver(t)
	e.createWebhook(other, "/w2", client.WebhookEventTypeDeliveryFailed, client.WebhookEventTypeMessageSettled)
	res, err := e.api.DeleteWebhookWithResponse(context.Background(), w1.WebhookID)
	answered(t, http.StatusNoContent, res, err)
	before := len(hooks.snapshot())
	more := e.fcmDevices(users("late", 2), true)
	msg2 := e.send(client.NewMessage{Audience: toUsers(users("late", 2)...), Payload: titled("after the delete"), DispatchAt: soon()})
	e.settle(msg2.MessageID, time.Minute)
	require.Eventually(t, func() bool {
		n := 0
		for _, ev := range other.accepted() {
			if ev.Type == "delivery.failed" || ev.Type == "message.settled" {
				n++
			}
		}
		return n == len(more)+1
	}, time.Minute, 50*time.Millisecond, "calls: %+v", other.snapshot())
	require.Len(t, hooks.snapshot(), before, "a deleted webhook got calls")
	// A batch's events are deleted once its call is answered, after the
	// receiver has them: a moment after the last one reached it.
	var left int
	require.Eventually(t, func() bool {
		require.NoError(t, e.db.Pool.QueryRow(context.Background(), "SELECT count(*) FROM webhook_events").Scan(&left))
		return left == 0
	}, 10*time.Second, 50*time.Millisecond, "delivered batches' events are deleted: %d left", left)
}

// TestE2EWebhookBatches: a 25,000-device message's failures arrive in
// batches of up to a thousand, each device once, in about as many calls
// as the batch size allows (a few more where the dispatcher's passes cut a
// message's events in parts).
func TestE2EWebhookBatches(t *testing.T) {
	t.Parallel()
	e := startE2E(t, map[string]string{"HERALD_WEBHOOK_HOSTS": "127.0.0.1"})
	hooks := newHookReceiver(t)
	e.createWebhook(hooks, "/batches", client.WebhookEventTypeDeliveryFailed)

	const n = 25_000
	members := users("many", n)
	dead := e.fcmDevices(members, true)
	seg, err := e.api.CreateSegmentWithResponse(context.Background(), "many", client.SegmentUpdate{Name: new("many")})
	answered(t, http.StatusCreated, seg, err)
	for start := 0; start < n; start += 10_000 {
		res, err := e.api.AddSegmentMembersWithResponse(context.Background(), "many", client.MemberIDs{UserIDs: members[start:min(start+10_000, n)]})
		answered(t, http.StatusOK, res, err)
	}
	msg := e.send(client.NewMessage{Audience: client.Audience{Type: client.AudienceTypeSegment, ID: new("many")}, Payload: titled("to many"), DispatchAt: soon()})
	st := e.settle(msg.MessageID, 3*time.Minute)
	require.Equal(t, n, st.Deliveries.Failed, "%+v", st)

	require.Eventually(t, func() bool { return len(hooks.accepted()) >= n }, 2*time.Minute, 100*time.Millisecond)
	seen := map[string]int{}
	for _, ev := range hooks.accepted() {
		seen[ev.DeviceID]++
	}
	require.Len(t, seen, n)
	for _, id := range dead {
		require.Equal(t, 1, seen[id], id)
	}
	calls := hooks.snapshot()
	var first, last time.Time
	for _, c := range calls {
		require.LessOrEqual(t, len(c.batch.Events), 1000)
		for _, ev := range c.batch.Events {
			if first.IsZero() || ev.At.Before(first) {
				first = ev.At
			}
			if ev.At.After(last) {
				last = ev.At
			}
		}
	}
	// Each dispatcher pass (one a second) while the failures were coming
	// may cut the message's events once more: on a loaded machine the
	// provider's timeouts park chunks, and their failures come over tens
	// of seconds.
	passes := int(last.Sub(first)/jobs.DefaultWebhookDispatchEvery) + 1
	t.Logf("%d failures in %d calls, over %s", n, len(calls), last.Sub(first))
	require.LessOrEqual(t, len(calls), n/1000+passes+5, "one call per thousand events, and one more a pass at most")
}

// TestE2EWebhookReceiverHangs: a receiver that never answers delays no
// send. Its calls take the webhooks queue's workers; a message sent while
// they hang still reaches every device and settles.
func TestE2EWebhookReceiverHangs(t *testing.T) {
	t.Parallel()
	e := startE2E(t, map[string]string{"HERALD_WEBHOOK_HOSTS": "127.0.0.1"})
	hooks := newHookReceiver(t)
	hooks.hang = make(chan struct{})
	e.createWebhook(hooks, "/hangs", client.WebhookEventTypeMessageSettled, client.WebhookEventTypeDeliveryFailed)

	// Enough hanging calls to take every webhook worker: each message's
	// settle is a batch of its own.
	e.fcmDevices(users("first", 1), false)
	for i := range 6 {
		e.send(client.NewMessage{Audience: toUsers("first0"), Payload: titled(fmt.Sprintf("first %d", i))})
	}
	require.Eventually(t, func() bool { return len(hooks.snapshot()) >= 4 }, time.Minute, 20*time.Millisecond,
		"the receiver holds a call of each webhook worker")

	live := users("later", 200)
	e.fcmDevices(live, false)
	msg := e.send(client.NewMessage{Audience: toUsers(live...), Payload: titled("sent while the receiver hangs")})
	st := e.settle(msg.MessageID, time.Minute)
	require.Equal(t, client.MessageStateDispatched, st.State)
	require.Equal(t, len(live), st.Deliveries.Accepted, "%+v", st)
	for _, c := range hooks.snapshot() {
		require.Zero(t, c.status, "the receiver has answered nothing, yet the message was sent")
	}
}
