package pushtest

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/heraldpush/herald/jobs/push"
)

// RichContent is a payload with every common field and every provider's
// section set, which the provider tests follow to fakepush field by field.
func RichContent() push.Content {
	badge, relevance, volume := 7, 0.75, 0.5
	return push.Content{
		Title: "Standup", Subtitle: "Team Blue", Body: "In five minutes",
		Data:  map[string]string{"room": "blue"},
		Image: "https://cdn.example.com/standup.png", URL: "https://app.example.com/standup/42",
		Sound: "chime.caf", Badge: &badge, Category: "MEETING", ThreadID: "standups",
		InterruptionLevel: "critical", RelevanceScore: &relevance,
		APNs: &push.APNsOptions{CriticalSoundVolume: &volume, TargetContentID: "standup-42"},
		FCM: &push.FCMOptions{AndroidChannelID: "meetings", AndroidPriority: "high", Tag: "standup",
			Color: "#ff8800", Icon: "ic_meeting"},
		WebPush: &push.WebPushOptions{Icon: "https://cdn.example.com/icon.png", BadgeIcon: "https://cdn.example.com/badge.png",
			Actions: []push.WebPushAction{{Action: "join", Title: "Join"}, {Action: "snooze", Title: "Snooze"}},
			Tag:     "standup", Renotify: true, RequireInteraction: true, Urgency: "low"},
	}
}

// SilentContent is a background push: data only.
func SilentContent() push.Content {
	return push.Content{Silent: true, Data: map[string]string{"sync": "inbox"}, URL: "https://app.example.com/inbox"}
}

// NewContentMessage is a message of c, not urgent, expiring in ttl.
func NewContentMessage(t testing.TB, id string, c push.Content, ttl time.Duration) *push.Message {
	t.Helper()
	m, err := push.NewMessage(id, false, c, time.Now().Add(ttl))
	require.NoError(t, err)
	return m
}

// Received is what fakepush received of one push: its request headers and
// its decoded body, as GET /_receipts?detail=1 shows them.
type Received struct {
	Headers map[string]string
	Body    map[string]any
}

// SendDetailed sends m to one target, requires it accepted, and returns
// what fakepush received of it.
func (b *Bundle[C, P]) SendDetailed(t testing.TB, m *push.Message) Received {
	t.Helper()
	results := b.Send(m, b.Targets(t, 1))
	require.True(t, results[0].Accepted, "%+v", results[0])
	rs := b.DetailedReceipts(t, m.ID)
	require.Len(t, rs, 1)
	require.NotEmpty(t, rs[0].Headers, "fakepush keeps the details of recent pushes")
	var body map[string]any
	require.NoError(t, json.Unmarshal(rs[0].Body, &body), "body %s", rs[0].Body)
	return Received{Headers: rs[0].Headers, Body: body}
}

// JSON decodes a JSON literal for comparing with a received body.
func JSON(t testing.TB, s string) map[string]any {
	t.Helper()
	var v map[string]any
	require.NoError(t, json.Unmarshal([]byte(s), &v))
	return v
}
