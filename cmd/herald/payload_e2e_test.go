package main

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/heraldpush/herald/api/client"
)

// TestRichAndSilentPayloads sends a rich and a silent payload through
// the whole of Herald (the API, the stored payload, the fan-out worker's
// encoding) and reads, in fakepush's detailed receipts, what each channel
// received: the rich fields where each provider documents them, and a
// silent push that shows nothing anywhere.
func TestRichAndSilentPayloads(t *testing.T) {
	t.Parallel()
	e := startE2E(t, nil)
	e.register("ann", false)

	level, urgency := client.PayloadInterruptionLevelTimeSensitive, client.WebPushOptionsUrgencyHigh
	rich := e.send(client.NewMessage{
		Audience: toUsers("ann"),
		Payload: client.Payload{
			Title: new("Standup"), Subtitle: new("Team Blue"), Body: new("now"), Badge: new(3), Sound: new("default"),
			URL: new("https://app.example.com/standup"), InterruptionLevel: &level,
			Fcm:     &client.FCMOptions{AndroidChannelID: new("meetings")},
			Webpush: &client.WebPushOptions{Tag: new("standup"), Urgency: &urgency},
		},
	})
	silent := e.send(client.NewMessage{
		Priority: new(client.PriorityUrgent),
		Audience: toUsers("ann"),
		Payload:  client.Payload{Silent: new(true), Data: &map[string]string{"sync": "inbox"}},
	})
	bodies := func(id string) map[string]map[string]any {
		require.Equal(t, client.MessageStateDispatched, e.settle(id, 30*time.Second).State)
		out := map[string]map[string]any{}
		for _, r := range e.fake.DetailedReceipts(id) {
			var body map[string]any
			require.NoError(t, json.Unmarshal(r.Body, &body), "%s: %s", r.Channel, r.Body)
			out[r.Channel] = body
			if r.Channel == "apns" {
				body["headers"] = r.Headers
			}
		}
		require.Len(t, out, 3, "one push per channel")
		return out
	}

	got := bodies(rich.MessageID)
	aps := got["apns"]["aps"].(map[string]any)
	require.Equal(t, map[string]any{"title": "Standup", "subtitle": "Team Blue", "body": "now"}, aps["alert"])
	require.Equal(t, 3.0, aps["badge"])
	require.Equal(t, "time-sensitive", aps["interruption-level"])
	require.Equal(t, "https://app.example.com/standup", got["apns"]["url"])
	android := got["fcm"]["android"].(map[string]any)["notification"].(map[string]any)
	require.Equal(t, "meetings", android["channel_id"])
	require.Equal(t, 3.0, android["notification_count"])
	require.Equal(t, "https://app.example.com/standup", got["fcm"]["data"].(map[string]any)["url"])
	require.Equal(t, "standup", got["webpush"]["tag"])
	require.Equal(t, 3.0, got["webpush"]["app_badge"])

	got = bodies(silent.MessageID)
	require.Equal(t, map[string]any{"content-available": 1.0}, got["apns"]["aps"])
	require.Equal(t, "background", got["apns"]["headers"].(map[string]string)["apns-push-type"])
	require.Equal(t, "5", got["apns"]["headers"].(map[string]string)["apns-priority"], "urgent, but a background push")
	require.NotContains(t, got["fcm"], "notification")
	require.Equal(t, true, got["webpush"]["silent"])
	require.NotContains(t, got["webpush"], "title")
}

// TestLocalizedMessages sends one message with German and Brazilian
// Portuguese localizations to three users, in de-AT, pt-BR and no locale,
// and reads in fakepush's detailed receipts what each of their devices
// received on every channel: German (de-AT falls back to de), Portuguese,
// and the message's own text.
func TestLocalizedMessages(t *testing.T) {
	t.Parallel()
	e := startE2E(t, nil)
	ctx := context.Background()
	want := map[string]string{"anna": "Erinnerung", "joao": "Lembrete", "sam": "Reminder"}
	for user, locale := range map[string]*string{"anna": new("de-AT"), "joao": new("pt-br"), "sam": nil} {
		res, err := e.api.PutUserWithResponse(ctx, user, client.UserUpdate{Locale: locale})
		answered(t, http.StatusCreated, res, err)
		e.register(user, false)
	}
	id := e.send(client.NewMessage{
		Audience: toUsers("anna", "joao", "sam"),
		Payload: client.Payload{Title: new("Reminder"), Body: new("at nine"), Localizations: &map[string]client.Text{
			"de": {Title: new("Erinnerung"), Body: new("um neun")}, "pt-BR": {Title: new("Lembrete")},
		}},
	}).MessageID
	require.Equal(t, client.MessageStateDispatched, e.settle(id, 30*time.Second).State)

	titles := map[string]string{}
	for _, r := range e.fake.DetailedReceipts(id) {
		var body struct {
			APS          struct{ Alert struct{ Title string } } `json:"aps"`
			Notification struct{ Title string }
			Title        string
		}
		require.NoError(t, json.Unmarshal(r.Body, &body), "%s: %s", r.Channel, r.Body)
		titles[r.Token] = body.APS.Alert.Title + body.Notification.Title + body.Title
	}
	for user, title := range want {
		devices := e.userDevices(user)
		require.Len(t, devices, 3, user)
		for _, d := range devices {
			token := d.Token
			if token == nil {
				token = d.Endpoint
			}
			require.Equal(t, title, titles[*token], "%s's %s device", user, d.Channel)
		}
	}
}
