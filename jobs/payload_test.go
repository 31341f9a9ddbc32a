package jobs

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/heraldpush/herald/jobs/push"
	"github.com/heraldpush/herald/jobs/push/fake"
	"github.com/heraldpush/herald/jobs/push/fcm"
	"github.com/heraldpush/herald/jobs/push/pushtest"
)

// TestCheckSizesNamesTheLocalization: a payload too large names the
// localization whose encoding is over the limit, or none for the message's
// own text.
func TestCheckSizesNamesTheLocalization(t *testing.T) {
	t.Parallel()
	c := push.Content{Title: "Hello", Localizations: map[string]push.Text{
		"de": {Title: "Hallo"},
		"fr": {Body: strings.Repeat("é", 2100)},
	}}
	err := checkSizes(c)
	var size *push.SizeError
	require.ErrorAs(t, err, &size)
	require.Equal(t, "fr", size.Locale)
	require.Contains(t, err.Error(), `"fr" localization`)

	delete(c.Localizations, "fr")
	require.NoError(t, checkSizes(c))

	// Every localization alone fits, but the message's own text does not.
	c.Body = strings.Repeat("x", 4100)
	require.ErrorAs(t, checkSizes(c), &size)
	require.Empty(t, size.Locale)
}

// TestFCMReservedDataKeysRefused: every data key FCM refuses (fakepush,
// as strict as Firebase, answers a push carrying it 400 INVALID_ARGUMENT,
// payload_rejected for every device) is refused before a message is made,
// naming the key, and so are the words FCM's documentation reserves beside
// them; a key that merely contains one of them is the caller's own.
func TestFCMReservedDataKeysRefused(t *testing.T) {
	t.Parallel()
	fp := pushtest.Start(t)
	p, err := fcm.New(context.Background(), fcm.Config{
		CredentialsFile: fp.Env[fake.EnvFCMCredentialsFile], Endpoint: fp.Env[fake.EnvFCMEndpoint], RootCAs: fp.CertPool(),
	})
	require.NoError(t, err)
	t.Cleanup(p.Close)
	// FCM's verdict on a push with data key k: true when it refuses it.
	fcmRefuses := func(k string) bool {
		m, err := push.NewMessage("msg_1", true, push.Content{Title: "Hi", Data: map[string]string{k: "v"}}, time.Now().Add(time.Hour))
		require.NoError(t, err)
		results := make([]push.Result, 1)
		p.Send(context.Background(), m, pushtest.Targets("fcm:0001"), results, pushtest.AllowAll, nil)
		require.True(t, results[0].Accepted || results[0].Reason == push.ReasonPayloadRejected, "%s: %+v", k, results[0])
		return !results[0].Accepted
	}

	for _, tc := range []struct {
		key              string
		herald, firebase bool // refused by CheckPayload, by FCM
	}{
		{"from", true, true},
		{"message_type", true, true},
		{"google.c.a.e", true, true},
		{"google", true, true},
		{"googleAnalytics", true, true},
		{"gcm.notification.title", true, true},
		{"gcm", true, true},
		{"collapse_key", true, false},
		{"notification", true, false},
		{"kind", false, false},
		{"from_user", false, false},
		{"my_google_id", false, false},
		{"Google", false, false},
		{"notifications", false, false},
	} {
		err := CheckPayload(&push.Content{Title: "Hi", Data: map[string]string{tc.key: "v"}})
		if tc.herald {
			var inv *InvalidError
			require.ErrorAs(t, err, &inv, tc.key)
			require.Equal(t, "payload.data."+tc.key, inv.Field)
		} else {
			require.NoError(t, err, tc.key)
		}
		require.Equal(t, tc.firebase, fcmRefuses(tc.key), "FCM's verdict on %q", tc.key)
	}
}

// TestFCMDataOnlyRules: with fcm.data_only the data may not use the keys
// the display fields travel under (400 naming payload.data.KEY), which are
// the caller's without it; data_only on a silent payload, a data message
// already, is refused naming payload.fcm.data_only; on data alone it is
// taken, since a localization can give that payload a title; and the size
// check counts the data-only encoding.
func TestFCMDataOnlyRules(t *testing.T) {
	t.Parallel()
	dataOnly := func(c push.Content) *push.Content {
		c.FCM = &push.FCMOptions{DataOnly: true}
		return &c
	}
	for _, tc := range []struct {
		name    string
		content *push.Content
		field   string // empty: accepted
	}{
		{"a title", dataOnly(push.Content{Title: "Hi", Body: "there"}), ""},
		{"data key title", dataOnly(push.Content{Title: "Hi", Data: map[string]string{"title": "x"}}), "payload.data.title"},
		{"data key android_channel_id", dataOnly(push.Content{Title: "Hi", Data: map[string]string{"android_channel_id": "x"}}), "payload.data.android_channel_id"},
		{"data key url without a url", dataOnly(push.Content{Title: "Hi", Data: map[string]string{"url": "x"}}), "payload.data.url"},
		{"data key badge", dataOnly(push.Content{Title: "Hi", Data: map[string]string{"badge": "1"}}), "payload.data.badge"},
		{"data key title without data_only", &push.Content{Title: "Hi", Data: map[string]string{"title": "x"}}, ""},
		{"data key of the caller's own", dataOnly(push.Content{Title: "Hi", Data: map[string]string{"titles": "x"}}), ""},
		{"silent", dataOnly(push.Content{Silent: true, Data: map[string]string{"sync": "inbox"}}), "payload.fcm.data_only"},
		{"data alone, localized", dataOnly(push.Content{Data: map[string]string{"sync": "inbox"}, Localizations: map[string]push.Text{"de": {Title: "Hallo"}}}), ""},
		{"over FCM's limit drawn by the app", dataOnly(push.Content{Title: strings.Repeat("t", 1300), Body: strings.Repeat("b", 1300), Subtitle: strings.Repeat("s", 300)}), "payload"},
		{"within it as a notification", &push.Content{Title: strings.Repeat("t", 1300), Body: strings.Repeat("b", 1300), Subtitle: strings.Repeat("s", 300)}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			err := CheckPayload(tc.content)
			if tc.field == "" {
				require.NoError(t, err)
				return
			}
			var inv *InvalidError
			require.ErrorAs(t, err, &inv)
			require.Equal(t, tc.field, inv.Field, inv.Message)
			if tc.field == "payload" {
				require.Contains(t, inv.Message, "the fcm encoding")
			}
		})
	}
}
