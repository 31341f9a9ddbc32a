// Package push defines what Herald sends, independent of any provider: the
// message content, its encodings for each channel, and the outcome of a send.
// The provider packages (apns, fcm, webpush) send these encodings, each
// device's with its receipt token spliced in (SignReceipts, WithReceipt);
// the API checks their sizes with the same functions, room for the token
// kept, before it accepts a message, so that what was accepted is what can
// be sent.
package push

import (
	"cmp"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/heraldpush/herald/jobs/receipt"
)

// MessageIDKey is the data key under which every push carries the Herald
// message id, so that a client can drop a second copy of the same message.
const MessageIDKey = "herald_message_id"

// ReceiptKey is the key under which a push carries its receipt token
// (Target.Receipt), for the app to send back with what became of the push
// (POST /v1/receipts): a top-level key of the APNs payload, a data key of
// FCM's, a member of the Web Push plaintext.
const ReceiptKey = "herald_receipt"

// receiptReserve is the room every channel's size check keeps for the
// receipt token spliced into each device's payload (WithReceipt): the key,
// a token of the longest length, the quotes, colon and comma. A payload
// accepted is then never refused by a provider for its token.
const receiptReserve = len(`"`+ReceiptKey+`":"",`) + receipt.MaxLen

// MaxPayloadBytes is the providers' common payload limit: APNs and FCM take
// 4096 bytes, and a Web Push record is at most 4096 bytes once encrypted.
const MaxPayloadBytes = 4096

// webPushOverhead is what aes128gcm encryption (RFC 8188, RFC 8291) adds to a
// plaintext in one record: the header (16-byte salt, 4-byte record size,
// 1-byte key id length, 65-byte key), the padding delimiter and the 16-byte
// authentication tag.
const webPushOverhead = 16 + 4 + 1 + 65 + 1 + 16

// MaxMessageIDLen is the longest message id Herald mints ("msg_" and up to
// 19 digits). Size checks made before the id exists assume it.
const MaxMessageIDLen = 4 + 19

// Content is what a caller asks to show, as every channel's encoding is made
// from it. The common fields map to each provider's own (docs/api.md, "The
// payload"); APNs, FCM and WebPush hold what only one provider has. Data
// values are strings because FCM carries nothing else.
//
// A Content is encoded by pure functions of its fields (APNsPayload,
// WebPushPayload, FCMData), so that a variant of it (another language's
// title and body) is encoded the same way by replacing those fields.
type Content struct {
	Title    string            `json:"title,omitempty"`
	Subtitle string            `json:"subtitle,omitempty"`
	Body     string            `json:"body,omitempty"`
	Data     map[string]string `json:"data,omitempty"`
	// Image is an https URL of a picture shown with the notification.
	Image string `json:"image,omitempty"`
	// URL is the link opened when the notification is tapped.
	URL string `json:"url,omitempty"`
	// Sound is "default" or the name of a sound the app ships.
	Sound string `json:"sound,omitempty"`
	// Badge is the count shown on the app's icon; 0 clears it.
	Badge *int `json:"badge,omitempty"`
	// Silent makes a background push: nothing shown, the app woken with
	// the data.
	Silent            bool     `json:"silent,omitempty"`
	Category          string   `json:"category,omitempty"`
	ThreadID          string   `json:"thread_id,omitempty"`
	InterruptionLevel string   `json:"interruption_level,omitempty"`
	RelevanceScore    *float64 `json:"relevance_score,omitempty"`

	APNs    *APNsOptions    `json:"apns,omitempty"`
	FCM     *FCMOptions     `json:"fcm,omitempty"`
	WebPush *WebPushOptions `json:"webpush,omitempty"`

	// Localizations are the texts in other languages, by BCP 47 tag in
	// canonical case ("de", "pt-BR"); a device gets the one its user's
	// locale picks (PickLocalization), fixed when the message is scheduled.
	Localizations map[string]Text `json:"localizations,omitempty"`

	// Apps are what differs for the devices of some apps, by app name:
	// where two apps name the same thing differently (a notification
	// category, an Android channel).
	Apps map[string]AppOverride `json:"apps,omitempty"`
}

// AppOverride replaces, for the devices of one app, the fields that are
// the app's own names: each set field replaces the message's.
type AppOverride struct {
	// Category is the APNs category (UNNotificationCategory) the app
	// declares.
	Category string `json:"category,omitempty"`
	// ThreadID groups the app's notifications (APNs thread-id).
	ThreadID string `json:"thread_id,omitempty"`
	// AndroidChannelID is the app's Android notification channel.
	AndroidChannelID string `json:"android_channel_id,omitempty"`
	// Sound is a sound the app ships.
	Sound string `json:"sound,omitempty"`
}

// ForApp is c for the devices of app: its override applied, and no other
// app's.
func (c Content) ForApp(app string) Content {
	o, ok := c.Apps[app]
	c.Apps = nil
	if !ok {
		return c
	}
	if o.Category != "" {
		c.Category = o.Category
	}
	if o.ThreadID != "" {
		c.ThreadID = o.ThreadID
	}
	if o.Sound != "" {
		c.Sound = o.Sound
	}
	if o.AndroidChannelID != "" {
		f := FCMOptions{}
		if c.FCM != nil {
			f = *c.FCM
		}
		f.AndroidChannelID = o.AndroidChannelID
		c.FCM = &f
	}
	return c
}

// DataOnly reports whether c goes through FCM as a data message, with no
// notification: it is silent, or it has nothing a notification shows or
// sounds (no title, subtitle, body, image, sound or badge), only data for
// the app. FCM takes a data message to Apple devices only as APNs'
// background push, and an empty notification would make it a notification
// message that shows nothing.
//
// A payload that asks for data-only delivery (FCMOptions.DataOnly) but has
// something to show is not DataOnly: it goes to Apple devices as an alert,
// and to Android as a data message that carries its display fields
// (DrawnByApp).
func (c *Content) DataOnly() bool {
	return c.Silent || c.Title == "" && c.Subtitle == "" && c.Body == "" && c.Image == "" && c.Sound == "" && c.Badge == nil
}

// DrawnByApp reports whether c goes to Android devices through FCM as a
// data message whose display fields travel in its data (FCMData), for the
// app to draw the notification itself: it asks for data-only delivery
// (FCMOptions.DataOnly) and has something to show. Android then always
// hands it to the app's onMessageReceived, which can send its delivered
// receipt; a notification message to an app in the background is shown by
// the system without calling the app. Apple devices, which FCM reaches
// through APNs, still get the alert (the app's notification service
// extension sends their receipt).
func (c *Content) DrawnByApp() bool {
	return c.FCM != nil && c.FCM.DataOnly && !c.DataOnly()
}

// APNsOptions are the fields only APNs has.
type APNsOptions struct {
	// CriticalSoundVolume (0 to 1) plays Sound as a critical alert; it
	// needs interruption_level critical.
	CriticalSoundVolume *float64 `json:"critical_sound_volume,omitempty"`
	TargetContentID     string   `json:"target_content_id,omitempty"`
}

// FCMOptions are the fields only FCM (Android) has.
type FCMOptions struct {
	AndroidChannelID string `json:"android_channel_id,omitempty"`
	// AndroidPriority (high or normal) overrides the message's priority on
	// Android.
	AndroidPriority string `json:"android_priority,omitempty"`
	// Tag replaces an earlier notification with the same tag; the message
	// id when empty. On a data message (Content.DataOnly, or DrawnByApp) it
	// is the collapse key, which a data message has only when Tag asks for
	// one.
	Tag   string `json:"tag,omitempty"`
	Color string `json:"color,omitempty"`
	Icon  string `json:"icon,omitempty"`
	// DataOnly sends the message to Android as a data message, with no
	// notification for the system to show: its display fields travel in
	// the data (see DrawnByApp, FCMData) and the app draws the
	// notification.
	DataOnly bool `json:"data_only,omitempty"`
}

// WebPushOptions are the fields only Web Push has; their names in the
// plaintext are those of the Notification API's options.
type WebPushOptions struct {
	Icon               string          `json:"icon,omitempty"`
	BadgeIcon          string          `json:"badge_icon,omitempty"`
	Actions            []WebPushAction `json:"actions,omitempty"`
	Tag                string          `json:"tag,omitempty"`
	Renotify           bool            `json:"renotify,omitempty"`
	RequireInteraction bool            `json:"require_interaction,omitempty"`
	// Urgency (very-low, low, normal, high) overrides the Urgency header
	// the message's priority gives.
	Urgency string `json:"urgency,omitempty"`
}

// WebPushAction is a button of a Web Push notification.
type WebPushAction struct {
	Action string `json:"action"`
	Title  string `json:"title"`
}

// The custom keys Herald adds to what a channel carries beside the caller's
// data: the message id everywhere, and the link and image where the
// provider has no field of its own for them. Data may not use them, nor
// APSKey, the dictionary of APNs's own keys beside them (jobs' payload
// rules refuse them).
const (
	URLKey   = "url"
	ImageKey = "image"
	APSKey   = "aps"
)

// apnsAlert is the alert of an APNs payload.
type apnsAlert struct {
	Title    string `json:"title,omitempty"`
	Subtitle string `json:"subtitle,omitempty"`
	Body     string `json:"body,omitempty"`
}

// apnsSound is a critical alert's sound, which APNs takes as a dictionary.
type apnsSound struct {
	Critical int     `json:"critical"`
	Name     string  `json:"name"`
	Volume   float64 `json:"volume"`
}

// apnsAPS is the "aps" dictionary, with Apple's key names.
type apnsAPS struct {
	Alert             *apnsAlert `json:"alert,omitempty"`
	Badge             *int       `json:"badge,omitempty"`
	Sound             any        `json:"sound,omitempty"`
	ThreadID          string     `json:"thread-id,omitempty"`
	Category          string     `json:"category,omitempty"`
	ContentAvailable  int        `json:"content-available,omitempty"`
	MutableContent    int        `json:"mutable-content,omitempty"`
	TargetContentID   string     `json:"target-content-id,omitempty"`
	InterruptionLevel string     `json:"interruption-level,omitempty"`
	RelevanceScore    *float64   `json:"relevance-score,omitempty"`
}

// apnsAPSOf maps c to the aps dictionary. A silent push, or one with
// nothing to show (DataOnly), is content-available alone: a background
// push, which wakes the app, where an empty alert would show nothing and
// wake nothing. Anything else always has an alert, so that it is an alert
// push, and asks for the app's notification service extension
// (mutable-content).
func apnsAPSOf(c *Content) apnsAPS {
	if c.DataOnly() {
		return apnsAPS{ContentAvailable: 1}
	}
	aps := apnsAPS{
		Alert:    &apnsAlert{Title: c.Title, Subtitle: c.Subtitle, Body: c.Body},
		Badge:    c.Badge,
		ThreadID: c.ThreadID, Category: c.Category,
		InterruptionLevel: c.InterruptionLevel, RelevanceScore: c.RelevanceScore,
	}
	if c.Sound != "" {
		aps.Sound = c.Sound
	}
	if c.APNs != nil {
		aps.TargetContentID = c.APNs.TargetContentID
		if v := c.APNs.CriticalSoundVolume; v != nil {
			aps.Sound = apnsSound{Critical: 1, Name: cmp.Or(c.Sound, "default"), Volume: *v}
		}
	}
	// Every alert asks for the app's notification service extension: it
	// fetches an image, and it is where an iOS app sends the push's
	// delivered receipt (herald_receipt), the only code of the app that
	// runs when a push arrives while the app is not. An app without one
	// shows the alert as it came.
	aps.MutableContent = 1
	return aps
}

// APNsPayload encodes c for APNs: the aps dictionary, and the data keys,
// the link, the image and the message id as custom top-level keys.
func APNsPayload(c Content, messageID string) ([]byte, error) {
	body := make(map[string]any, len(c.Data)+4)
	for k, v := range c.Data {
		body[k] = v
	}
	body[APSKey] = apnsAPSOf(&c)
	if c.URL != "" {
		body[URLKey] = c.URL
	}
	if c.Image != "" && !c.Silent {
		body[ImageKey] = c.Image
	}
	body[MessageIDKey] = messageID
	return json.Marshal(body)
}

// APNsPushType is the apns-push-type a message is sent with: a silent or
// data-only push is a background push (which Apple takes only at priority
// 5), any other an alert.
func APNsPushType(c *Content) string {
	if c.DataOnly() {
		return "background"
	}
	return "alert"
}

// webPushBody is the plaintext of a Web Push message: the content as JSON,
// which the service worker reads. Display fields are named as the
// Notification API's options, so that a service worker can pass them to
// showNotification as they are; app_badge is the Badging API's count.
type webPushBody struct {
	Title              string            `json:"title,omitempty"`
	Subtitle           string            `json:"subtitle,omitempty"`
	Body               string            `json:"body,omitempty"`
	Icon               string            `json:"icon,omitempty"`
	Image              string            `json:"image,omitempty"`
	Badge              string            `json:"badge,omitempty"`
	Tag                string            `json:"tag,omitempty"`
	Renotify           bool              `json:"renotify,omitempty"`
	RequireInteraction bool              `json:"requireInteraction,omitempty"`
	Actions            []WebPushAction   `json:"actions,omitempty"`
	AppBadge           *int              `json:"app_badge,omitempty"`
	URL                string            `json:"url,omitempty"`
	Silent             bool              `json:"silent,omitempty"`
	Data               map[string]string `json:"data,omitempty"`
	MessageID          string            `json:"herald_message_id"`
}

// WebPushPayload encodes c as the plaintext of a Web Push message. A silent
// message carries its data, its link and "silent": true, and no display
// field.
func WebPushPayload(c Content, messageID string) ([]byte, error) {
	b := webPushBody{URL: c.URL, Data: c.Data, MessageID: messageID}
	if c.Silent {
		b.Silent = true
		return json.Marshal(b)
	}
	b.Title, b.Subtitle, b.Body, b.Image, b.AppBadge = c.Title, c.Subtitle, c.Body, c.Image, c.Badge
	if w := c.WebPush; w != nil {
		b.Icon, b.Badge, b.Tag, b.Renotify, b.RequireInteraction, b.Actions = w.Icon, w.BadgeIcon, w.Tag, w.Renotify, w.RequireInteraction, w.Actions
	}
	return json.Marshal(b)
}

// maxTopicLen is the longest Topic RFC 8030 allows: 32 base64url characters.
const maxTopicLen = 32

// WebPushTopic is the Web Push Topic that collapses message id's pushes,
// which FCM's webpush headers carry too: the id itself when it is a valid
// Topic, at most 32 base64url characters as Herald's ids are, else a
// 32-character digest of it, so that any id still collapses.
func WebPushTopic(id string) string {
	if len(id) <= maxTopicLen && isBase64URL(id) {
		return id
	}
	sum := sha256.Sum256([]byte(id))
	return base64.RawURLEncoding.EncodeToString(sum[:24])
}

// isBase64URL reports whether s is non-empty and all base64url characters.
func isBase64URL(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return s != ""
}

// fcmNotification is FCM's notification block as it counts against the size
// limit.
type fcmNotification struct {
	Title string `json:"title,omitempty"`
	Body  string `json:"body,omitempty"`
	Image string `json:"image,omitempty"`
}

// fcmPayload is the part of an FCM message that counts against its size
// limit: the notification and the data.
type fcmPayload struct {
	Notification *fcmNotification  `json:"notification,omitempty"`
	Data         map[string]string `json:"data"`
}

// The data keys under which a message drawn by the app (DrawnByApp)
// carries its display fields to Android, each under the name of the
// payload field it comes from (fcm's without their prefix), beside URLKey
// and ImageKey.
const (
	titleKey            = "title"
	subtitleKey         = "subtitle"
	bodyKey             = "body"
	soundKey            = "sound"
	badgeKey            = "badge"
	categoryKey         = "category"
	tagKey              = "tag"
	androidChannelIDKey = "android_channel_id"
	colorKey            = "color"
	iconKey             = "icon"
)

// IsFCMDisplayKey reports whether k is a data key under which a message
// drawn by the app (DrawnByApp) may carry a display field: such a
// message's data may not use it (jobs' payload rules), so that the app
// never reads the caller's data for a display field.
func IsFCMDisplayKey(k string) bool {
	switch k {
	case titleKey, subtitleKey, bodyKey, ImageKey, URLKey, soundKey, badgeKey, categoryKey,
		tagKey, androidChannelIDKey, colorKey, iconKey:
		return true
	}
	return false
}

// FCMData returns the data map an FCM message carries: the caller's data,
// the link (FCM has no field for it that an Android app reads) and the
// message id; for a message drawn by the app (DrawnByApp), its display
// fields too, each that is set as a string: title, subtitle, body, image,
// sound, badge (decimal), category, and fcm's tag, android_channel_id,
// color and icon. The tag is there only when fcm.tag names one: the app
// folds a second copy on herald_message_id otherwise, as Android folds a
// notification on its tag.
func FCMData(c Content, messageID string) map[string]string {
	data := make(map[string]string, len(c.Data)+2)
	for k, v := range c.Data {
		data[k] = v
	}
	if c.URL != "" {
		data[URLKey] = c.URL
	}
	if c.DrawnByApp() {
		set := func(k, v string) {
			if v != "" {
				data[k] = v
			}
		}
		set(titleKey, c.Title)
		set(subtitleKey, c.Subtitle)
		set(bodyKey, c.Body)
		set(ImageKey, c.Image)
		set(soundKey, c.Sound)
		if c.Badge != nil {
			data[badgeKey] = strconv.Itoa(*c.Badge)
		}
		set(categoryKey, c.Category)
		set(tagKey, c.FCM.Tag)
		set(androidChannelIDKey, c.FCM.AndroidChannelID)
		set(colorKey, c.FCM.Color)
		set(iconKey, c.FCM.Icon)
	}
	data[MessageIDKey] = messageID
	return data
}

// SizeError says which channel's encoding of a message is over the limit.
type SizeError struct {
	Channel string
	// Locale is the localization whose encoding is over; empty for the
	// message's own text.
	Locale string
	// App is the app whose overrides (Content.Apps) made the encoding
	// over; empty for the message's own.
	App   string
	Size  int
	Limit int
}

func (e *SizeError) Error() string {
	if e.Locale != "" {
		return fmt.Sprintf("the %s encoding of the payload's %q localization is %d bytes; the limit is %d", e.Channel, e.Locale, e.Size, e.Limit)
	}
	return fmt.Sprintf("the %s encoding of the payload is %d bytes; the limit is %d", e.Channel, e.Size, e.Limit)
}

// CheckSize returns a *SizeError when any channel's encoding of c, with the
// longest message id and room for the longest receipt token
// (receiptReserve), would exceed its provider's limit.
func CheckSize(c Content) error {
	id := make([]byte, MaxMessageIDLen)
	for i := range id {
		id[i] = '9'
	}
	messageID := string(id)

	apns, err := APNsPayload(c, messageID)
	if err != nil {
		return err
	}
	if n := len(apns) + receiptReserve; n > MaxPayloadBytes {
		return &SizeError{Channel: "apns", Size: n, Limit: MaxPayloadBytes}
	}
	f := fcmPayload{Data: FCMData(c, messageID)}
	switch {
	case c.DataOnly():
	case c.DrawnByApp():
		// The display fields are in the data; Apple devices get the
		// title and body a second time, as the alert of FCM's apns block.
		f.Notification = &fcmNotification{Title: c.Title, Body: c.Body}
	default:
		f.Notification = &fcmNotification{Title: c.Title, Body: c.Body, Image: c.Image}
	}
	fcm, err := json.Marshal(f)
	if err != nil {
		return err
	}
	if n := len(fcm) + receiptReserve; n > MaxPayloadBytes {
		return &SizeError{Channel: "fcm", Size: n, Limit: MaxPayloadBytes}
	}
	web, err := WebPushPayload(c, messageID)
	if err != nil {
		return err
	}
	if n := len(web) + receiptReserve + webPushOverhead; n > MaxPayloadBytes {
		return &SizeError{Channel: "webpush", Size: n, Limit: MaxPayloadBytes}
	}
	return nil
}

// WithReceipt appends to dst the JSON object obj (an APNs payload or a Web
// Push plaintext, encoded once for the message) with token spliced in as its
// first member, under ReceiptKey: one device's payload, made without
// decoding or encoding the message again. An empty token appends obj as it
// is. A token is base64url, which JSON needs no escape for.
func WithReceipt(dst, obj []byte, token string) []byte {
	if token == "" || len(obj) < 2 || obj[0] != '{' {
		return append(dst, obj...)
	}
	dst = append(dst, `{"`+ReceiptKey+`":"`...)
	dst = append(dst, token...)
	dst = append(dst, '"')
	if rest := obj[1:]; rest[0] != '}' {
		dst = append(dst, ',')
	}
	return append(dst, obj[1:]...)
}

// ReceiptLen is how many bytes WithReceipt adds to a non-empty object for
// token.
func ReceiptLen(token string) int {
	if token == "" {
		return 0
	}
	return len(`"`+ReceiptKey+`":"",`) + len(token)
}

// SignReceipts gives each of targets its receipt token for message
// messageID, made with signer; a nil signer leaves them without one, and
// their pushes carry none. A token is good until expires, the same second
// for every delivery of a chunk (the worker's receipt window after the
// chunk's expiry), so that a retried delivery carries the token of its
// first attempt. The tokens are written into one buffer and made strings at
// once: a few allocations for a slice of targets rather than two a device.
// The chunk worker and herald bench's blast both sign with it, so that the
// blast sends what a worker sends.
func SignReceipts(signer *receipt.Signer, messageID int64, expires time.Time, targets []Target) {
	if signer == nil || len(targets) == 0 {
		return
	}
	buf := make([]byte, 0, len(targets)*receipt.MaxLen)
	ends := make([]int32, len(targets))
	for i := range targets {
		buf = signer.AppendSign(buf, receipt.Delivery{MessageID: messageID, DeviceID: targets[i].DeviceID}, expires)
		ends[i] = int32(len(buf))
	}
	all := string(buf)
	start := int32(0)
	for i := range targets {
		targets[i].Receipt = all[start:ends[i]]
		start = ends[i]
	}
}
