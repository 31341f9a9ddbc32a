// Package push defines what Herald sends, independent of any provider: the
// message content, its encodings for each channel, and the outcome of a send.
// The provider packages (apns, fcm, webpush) send these encodings; the API
// checks their sizes with the same functions before it accepts a message, so
// that what was accepted is what can be sent.
package push

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
)

// MessageIDKey is the data key under which every push carries the Herald
// message id, so that a client can drop a second copy of the same message.
const MessageIDKey = "herald_message_id"

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

// Content is what a caller asks to show: a title, a body and string data.
// Data values are strings because FCM carries nothing else.
type Content struct {
	Title    string            `json:"title,omitempty"`
	Subtitle string            `json:"subtitle,omitempty"`
	Body     string            `json:"body,omitempty"`
	Data     map[string]string `json:"data,omitempty"`
	// Localizations are the texts in other languages, by BCP 47 tag in
	// canonical case ("de", "pt-BR"); a device gets the one its user's
	// locale picks (PickLocalization), fixed when the message is scheduled.
	Localizations map[string]Text `json:"localizations,omitempty"`
}

// apnsAlert and apnsAPS are the standard part of an APNs payload.
type apnsAlert struct {
	Title string `json:"title,omitempty"`
	Body  string `json:"body,omitempty"`
}

type apnsAPS struct {
	Alert apnsAlert `json:"alert"`
}

// APNsPayload encodes c for APNs: the alert under "aps", and the data keys
// and the message id as custom top-level keys.
func APNsPayload(c Content, messageID string) ([]byte, error) {
	body := make(map[string]any, len(c.Data)+2)
	for k, v := range c.Data {
		body[k] = v
	}
	body["aps"] = apnsAPS{Alert: apnsAlert{Title: c.Title, Body: c.Body}}
	body[MessageIDKey] = messageID
	return json.Marshal(body)
}

// webPushBody is the plaintext of a Web Push message: the content as JSON,
// which the service worker reads.
type webPushBody struct {
	Title     string            `json:"title,omitempty"`
	Body      string            `json:"body,omitempty"`
	Data      map[string]string `json:"data,omitempty"`
	MessageID string            `json:"herald_message_id"`
}

// WebPushPayload encodes c as the plaintext of a Web Push message.
func WebPushPayload(c Content, messageID string) ([]byte, error) {
	return json.Marshal(webPushBody{Title: c.Title, Body: c.Body, Data: c.Data, MessageID: messageID})
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

// fcmPayload is the part of an FCM message that counts against its size
// limit: the notification and the data.
type fcmPayload struct {
	Notification apnsAlert         `json:"notification"`
	Data         map[string]string `json:"data"`
}

// FCMData returns the data map an FCM message carries: the caller's data
// and the message id.
func FCMData(c Content, messageID string) map[string]string {
	data := make(map[string]string, len(c.Data)+1)
	for k, v := range c.Data {
		data[k] = v
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
	Size   int
	Limit  int
}

func (e *SizeError) Error() string {
	if e.Locale != "" {
		return fmt.Sprintf("the %s encoding of the payload's %q localization is %d bytes; the limit is %d", e.Channel, e.Locale, e.Size, e.Limit)
	}
	return fmt.Sprintf("the %s encoding of the payload is %d bytes; the limit is %d", e.Channel, e.Size, e.Limit)
}

// CheckSize returns a *SizeError when any channel's encoding of c, with the
// longest message id, would exceed its provider's limit.
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
	if len(apns) > MaxPayloadBytes {
		return &SizeError{Channel: "apns", Size: len(apns), Limit: MaxPayloadBytes}
	}
	fcm, err := json.Marshal(fcmPayload{Notification: apnsAlert{Title: c.Title, Body: c.Body}, Data: FCMData(c, messageID)})
	if err != nil {
		return err
	}
	if len(fcm) > MaxPayloadBytes {
		return &SizeError{Channel: "fcm", Size: len(fcm), Limit: MaxPayloadBytes}
	}
	web, err := WebPushPayload(c, messageID)
	if err != nil {
		return err
	}
	if len(web)+webPushOverhead > MaxPayloadBytes {
		return &SizeError{Channel: "webpush", Size: len(web) + webPushOverhead, Limit: MaxPayloadBytes}
	}
	return nil
}
