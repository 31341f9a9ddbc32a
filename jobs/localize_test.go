package jobs

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/heraldpush/herald/db"
	"github.com/heraldpush/herald/jobs/push"
)

// textSender is a provider that accepts every push and keeps, per token,
// the encoded message it was sent, so that a test sees which variant each
// device got.
type textSender struct {
	mu   sync.Mutex
	sent map[string]*push.Message
	// sandbox holds the tokens sent as sandbox ones.
	sandbox map[string]bool
}

func (s *textSender) Send(_ context.Context, m *push.Message, targets []push.Target, results []push.Result, _ func() bool, answered func(int)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.sent == nil {
		s.sent, s.sandbox = map[string]*push.Message{}, map[string]bool{}
	}
	for i, t := range targets {
		s.sent[t.Token], s.sandbox[t.Token] = m, t.Sandbox
		results[i] = push.Result{Accepted: true, At: time.Now(), Latency: time.Millisecond}
		if answered != nil {
			answered(i)
		}
	}
}

// localizedContent is a message in English with German and Brazilian
// Portuguese localizations.
var localizedContent = push.Content{
	Title: "Hello", Body: "Your reminder",
	Localizations: map[string]push.Text{
		"de":    {Title: "Hallo", Body: "Deine Erinnerung"},
		"pt-BR": {Title: "Olá", Body: "Seu lembrete"},
	},
}

// registerLocalized gives three users, in de-AT, pt-BR and no locale, an
// APNs and an FCM device each; the de-AT user's APNs device is a sandbox
// one.
func registerLocalized(t *testing.T, q *db.Queries) []string {
	t.Helper()
	ctx := context.Background()
	users := []string{"u-at", "u-br", "u-none"}
	require.NoError(t, q.EnsureUsers(ctx, users))
	for user, locale := range map[string]string{"u-at": "de-AT", "u-br": "pt-BR"} {
		_, err := q.UpsertUser(ctx, db.UpsertUserParams{ID: user, Locale: &locale})
		require.NoError(t, err)
	}
	p := db.RegisterDevicesParams{}
	for _, u := range users {
		for _, ch := range []string{ChannelAPNs, ChannelFCM} {
			env := "production"
			if u == "u-at" && ch == ChannelAPNs {
				env = "sandbox"
			}
			p.UserIds, p.Channels, p.Tokens = append(p.UserIds, u), append(p.Channels, ch), append(p.Tokens, ch+"-"+u)
			p.P256dhs, p.Auths, p.Environments = append(p.P256dhs, ""), append(p.Auths, ""), append(p.Environments, env)
		}
	}
	_, err := q.RegisterDevices(ctx, p)
	require.NoError(t, err)
	return users
}

// localizedMessage schedules localizedContent to users, due now, and
// returns its one chunk.
func (b *fanOutBundle) localizedMessage(users []string) chunkJob {
	b.t.Helper()
	ctx := context.Background()
	var msg db.Message
	require.NoError(b.t, db.InTx(ctx, b.db.Pool, func(tx pgx.Tx) error {
		var err error
		now := b.clock.Now()
		msg, err = NewEnqueuer(b.client, 0).Create(ctx, tx, MessageSpec{
			Priority: PriorityBulk, DispatchAt: now, ExpiresAt: now.Add(time.Hour),
			Audience: Audience{UserIDs: users}, AudienceJSON: []byte(`{}`), Content: localizedContent,
		})
		return err
	}))
	jobIDs, err := b.q.MessageChunkJobs(ctx, msg.ID)
	require.NoError(b.t, err)
	require.Len(b.t, jobIDs, 1)
	c := chunkJob{msg: msg, job: b.job(jobIDs[0])}
	c.args, err = ChunkArgs(c.job.Kind, c.job.EncodedArgs)
	require.NoError(b.t, err)
	c.targets = chunkTargets(b.t, b.q, c.args)
	return c
}

// TestFanOutSendsEachUserTheirLanguage is issue 14's case: users in de-AT,
// pt-BR and no locale, a message with de and pt-BR localizations. Each
// device's variant is fixed in its delivery when the message is made (de-AT
// falls back to de), and the worker sends each its variant, encoded once per
// channel; the sandbox device is marked so for its provider.
func TestFanOutSendsEachUserTheirLanguage(t *testing.T) {
	t.Parallel()
	b := setupFanOut(t)
	c := b.localizedMessage(registerLocalized(t, b.q))

	picked := map[string]string{}
	for _, tg := range c.targets {
		picked[tg.Token] = tg.Locale
	}
	require.Equal(t, map[string]string{
		"apns-u-at": "de", "fcm-u-at": "de", "apns-u-br": "pt-BR", "fcm-u-br": "pt-BR", "apns-u-none": "", "fcm-u-none": "",
	}, picked, "each device's localization, fixed when the message was made")

	apns, fcm := &textSender{}, &textSender{}
	w := b.worker(map[string]Sender{ChannelAPNs: apns, ChannelFCM: fcm}, FanOutConfig{})
	b.work(w, c)

	want := map[string]string{"u-at": "Hallo|Deine Erinnerung", "u-br": "Olá|Seu lembrete", "u-none": "Hello|Your reminder"}
	for _, s := range []*textSender{apns, fcm} {
		require.Len(t, s.sent, 3)
	}
	for user, text := range want {
		for _, s := range []*textSender{apns, fcm} {
			m := s.sent[map[*textSender]string{apns: "apns-", fcm: "fcm-"}[s]+user]
			require.NotNil(t, m, user)
			require.Equal(t, text, m.Content.Title+"|"+m.Content.Body, user)
		}
		// What APNs is given is the variant's own encoding.
		var payload struct {
			APS struct {
				Alert struct{ Title, Body string } `json:"alert"`
			} `json:"aps"`
		}
		require.NoError(t, json.Unmarshal(apns.sent["apns-"+user].APNs, &payload))
		require.Equal(t, text, payload.APS.Alert.Title+"|"+payload.APS.Alert.Body, user)
	}
	require.Equal(t, map[string]bool{"apns-u-at": true, "apns-u-br": false, "apns-u-none": false}, apns.sandbox,
		"the sandbox device reaches its provider marked sandbox")
	b.settled(c.msg.ID)
}

// TestScheduledAndLocalTimeRunsAreLocalized checks the two other ways a
// message is made: a schedule's run reuses its stored payload, whose
// localizations are read when the run is made; and a local-time message
// keeps each device's pick in its wave's chunk.
func TestScheduledAndLocalTimeRunsAreLocalized(t *testing.T) {
	t.Parallel()
	b := setupFanOut(t)
	users := registerLocalized(t, b.q)
	ctx := context.Background()
	raw, err := json.Marshal(localizedContent)
	require.NoError(t, err)
	payloadID, err := b.q.InsertPayload(ctx, raw)
	require.NoError(t, err)

	now := b.clock.Now()
	for name, spec := range map[string]MessageSpec{
		"schedule run": {PayloadID: payloadID},
		"local time": {Content: localizedContent, LocalTime: &LocalTime{
			Wall: now.Add(2 * time.Hour), Fallback: time.UTC, Now: now, Lifetime: time.Hour, JSON: []byte(`{}`),
		}},
	} {
		spec.Priority, spec.DispatchAt, spec.ExpiresAt = PriorityBulk, now, now.Add(time.Hour)
		spec.Audience, spec.AudienceJSON = Audience{UserIDs: users}, []byte(`{}`)
		var msg db.Message
		require.NoError(t, db.InTx(ctx, b.db.Pool, func(tx pgx.Tx) error {
			msg, err = NewEnqueuer(b.client, 0).Create(ctx, tx, spec)
			return err
		}), name)
		jobIDs, err := b.q.MessageChunkJobs(ctx, msg.ID)
		require.NoError(t, err)
		picked := map[string]string{}
		for _, id := range jobIDs {
			var args FanOutArgs
			job := b.job(id)
			args, err := ChunkArgs(job.Kind, job.EncodedArgs)
			require.NoError(t, err)
			for _, tg := range chunkTargets(t, b.q, args) {
				picked[tg.Token] = tg.Locale
			}
		}
		require.Equal(t, map[string]string{
			"apns-u-at": "de", "fcm-u-at": "de", "apns-u-br": "pt-BR", "fcm-u-br": "pt-BR", "apns-u-none": "", "fcm-u-none": "",
		}, picked, name)
	}
}

// TestFanOutSandboxOutageParksOnlySandboxDevices checks that the worker
// sends a sandbox device under the APNs sandbox's own breaker: the sandbox
// host failing parks its device alone, and production APNs stays closed.
func TestFanOutSandboxOutageParksOnlySandboxDevices(t *testing.T) {
	t.Parallel()
	b := setupFanOut(t)
	c := b.localizedMessage(registerLocalized(t, b.q))
	apns := &recordingSender{script: map[string][]push.Result{"apns-u-at": {failing(push.ReasonProviderUnavailable)}}}
	breakers := openBreakers(time.Minute)
	w := b.worker(map[string]Sender{ChannelAPNs: apns, ChannelFCM: &recordingSender{}}, FanOutConfig{Breakers: breakers})
	b.work(w, c)

	b.requireStatus(c, "apns-u-at", "pending", push.ReasonProviderUnavailable)
	b.requireStatus(c, "apns-u-br", "accepted", push.ReasonNone)
	b.requireStatus(c, "apns-u-none", "accepted", push.ReasonNone)
	require.Equal(t, BreakerClosed, breakers.For(ChannelAPNs, "apns-u-br").Status().State, "production APNs is not parked")
	st, _ := breakers.Status(ChannelAPNs)
	require.Equal(t, BreakerOpen, st.State, "the channel shows its sandbox open")
}
