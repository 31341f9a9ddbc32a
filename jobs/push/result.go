package push

import (
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Reason says why a delivery failed, in the contract's words.
type Reason string

// The reasons a delivery can fail. Unregistered and BadToken are permanent
// and evict the device; RateLimited and ProviderUnavailable are transient
// and feed the provider's circuit breaker instead of being retried at once.
const (
	ReasonNone                Reason = ""
	ReasonUnregistered        Reason = "unregistered"
	ReasonBadToken            Reason = "bad_token"
	ReasonPayloadRejected     Reason = "payload_rejected"
	ReasonRateLimited         Reason = "rate_limited"
	ReasonProviderUnavailable Reason = "provider_unavailable"
	ReasonChannelDisabled     Reason = "channel_disabled"
	ReasonInternal            Reason = "internal"
	// ReasonWrongEnvironment is an APNs token that the host it was sent to
	// does not know: a sandbox token registered as production, or the other
	// way round. Apple says BadDeviceToken for it, as for a malformed
	// token, but Herald sends only well-formed tokens, so the likelier
	// cause is the device's environment, which a registration with the
	// right one fixes; the device is not evicted.
	ReasonWrongEnvironment Reason = "wrong_environment"
	// ReasonCredentialsRefused is the provider refusing the credentials
	// of the device's app: APNs InvalidProviderToken or TopicDisallowed,
	// FCM UNAUTHENTICATED or PERMISSION_DENIED, a Web Push 401. Every
	// device of the app fails so until its credentials are replaced; the
	// device is not evicted, and an alert names the app.
	ReasonCredentialsRefused Reason = "credentials_refused"
	// ReasonWrongApp is a token of another app than the device's: APNs
	// DeviceTokenNotForTopic, FCM SENDER_ID_MISMATCH, a Web Push 403 (the
	// subscription was made with another application server key). A
	// registration under the right app fixes it; the device is not
	// evicted.
	ReasonWrongApp Reason = "wrong_app"
)

// The reasons a delivery is cancelled unsent because of its device: found
// by its chunk when it read its devices, before anything was sent (see
// db.ChunkPending), or by a registration or an erasure.
const (
	// ReasonDeviceMoved: the device's token was registered for another
	// user after the message was scheduled.
	ReasonDeviceMoved Reason = "device_moved"
	// ReasonDeviceDeleted: the device was deleted, alone or with its user.
	ReasonDeviceDeleted Reason = "device_deleted"
	// ReasonDeviceEvicted: a provider called the device's token dead after
	// the message was scheduled.
	ReasonDeviceEvicted Reason = "device_evicted"
	// ReasonDeviceReplaced: another device of the same installation took
	// the token over.
	ReasonDeviceReplaced Reason = "device_replaced"
)

// The reasons a delivery is withheld for its user's sake, decided when it
// is sent (jobs/preferences): cancelled, or for quiet hours that outlast
// its message, expired.
const (
	// ReasonOptedOut: the user opted out of the message's category, on
	// every channel or on the device's.
	ReasonOptedOut Reason = "opted_out"
	// ReasonQuietHours: due in the user's quiet hours, and the message
	// asked to skip such deliveries (cancelled), or the hours end after the
	// message expires (expired). A delivery held until they end is pending
	// with it.
	ReasonQuietHours Reason = "quiet_hours"
	// ReasonCapped: the category's frequency cap for the user was reached
	// by other messages within its period.
	ReasonCapped Reason = "capped"
)

// Withholds reports whether the delivery was withheld for its user's sake
// (opted out, quiet hours, capped).
func (r Reason) Withholds() bool {
	return r == ReasonOptedOut || r == ReasonQuietHours || r == ReasonCapped
}

// Cancels reports whether the delivery is cancelled, not failed: nothing
// was sent, because the device is no longer the delivery's to send to, or
// its user's preferences withheld it.
func (r Reason) Cancels() bool {
	switch r {
	case ReasonDeviceMoved, ReasonDeviceDeleted, ReasonDeviceEvicted, ReasonDeviceReplaced,
		ReasonOptedOut, ReasonQuietHours, ReasonCapped:
		return true
	}
	return false
}

// Transient reports whether a failure may go away by itself: the provider
// was down, slow or rate limiting, and the same send may succeed later.
func (r Reason) Transient() bool {
	return r == ReasonRateLimited || r == ReasonProviderUnavailable
}

// StatusReason is the reason an HTTP answer other than 2xx gives when the
// provider said nothing more specific: 429 asks Herald to slow down, 5xx is
// the provider's own trouble, and anything else is taken for a fault in
// Herald's request or credentials, which must never evict a device.
func StatusReason(status int) Reason {
	switch {
	case status == http.StatusTooManyRequests:
		return ReasonRateLimited
	case status >= 500:
		return ReasonProviderUnavailable
	}
	return ReasonInternal
}

// Evicts reports whether the failure means the device's token is dead.
func (r Reason) Evicts() bool {
	return r == ReasonUnregistered || r == ReasonBadToken
}

// Message is what a provider sends to every device of one message (one
// chunk's worth at a time), encoded once and shared.
type Message struct {
	// ID is the Herald message id ("msg_42"); it collapses a message's
	// second copy on a device (apns-collapse-id, the notification's tag on
	// Android, the Web Push Topic) and travels as herald_message_id in its
	// data, by which an app drops a second copy of a data message.
	ID string
	// Urgent selects the providers' high priority.
	Urgent  bool
	Content Content
	// ExpiresAt bounds the providers' time to live.
	ExpiresAt time.Time
	// APNs and WebPush are Content encoded once for those channels (see
	// APNsPayload and WebPushPayload); FCMData is the FCM data map.
	APNs    []byte
	WebPush []byte
	FCMData map[string]string
}

// NewMessage encodes content for every channel, once.
func NewMessage(id string, urgent bool, content Content, expiresAt time.Time) (*Message, error) {
	apns, err := APNsPayload(content, id)
	if err != nil {
		return nil, err
	}
	web, err := WebPushPayload(content, id)
	if err != nil {
		return nil, err
	}
	return &Message{
		ID: id, Urgent: urgent, Content: content, ExpiresAt: expiresAt,
		APNs: apns, WebPush: web, FCMData: FCMData(content, id),
	}, nil
}

// TTL is the message's remaining lifetime at now, never negative, which
// providers carry so that a device offline until after expiry never shows it.
func (m *Message) TTL(now time.Time) time.Duration {
	return max(m.ExpiresAt.Sub(now), 0)
}

// Target is one device to send to.
type Target struct {
	DeviceID int64
	// Token is the APNs or FCM token, or the Web Push endpoint.
	Token string
	// P256dh and Auth are a Web Push subscription's keys (base64url).
	P256dh, Auth string
	// Sandbox marks an APNs token from Apple's sandbox environment (a
	// debug build), which only the sandbox host knows.
	Sandbox bool
	// Receipt is the delivery's receipt token (jobs/receipt), which the
	// push carries under ReceiptKey for the app to send back; empty when
	// receipts are off, and then the push carries none.
	Receipt string
}

// Result is the outcome of one send.
type Result struct {
	// Accepted is true when the provider took the push.
	Accepted bool
	// At is when the provider answered, by the host's clock.
	At time.Time
	// Reason says why it was not accepted.
	Reason Reason
	// Detail is the provider's own words, for logs.
	Detail string
	// Unanswered is true when the request may have reached the provider but
	// no answer came back (a timeout, a broken connection): the provider may
	// have taken the push, and a retry may reach the device a second time,
	// where the message's collapse id makes it replace the first.
	Unanswered bool
	// Latency is how long the request took, for the provider latency
	// histogram; zero when nothing was sent.
	Latency time.Duration
	// RetryAfter is how long the provider asked for before the next send
	// (its Retry-After), zero when it named no time.
	RetryAfter time.Duration
	// TargetThrottled says that a rate limit was about this target alone:
	// APNs' TooManyRequests (too many pushes to one device token), a Web
	// Push service's 429 (RFC 8030 section 8.4: one push resource), FCM's
	// QUOTA_EXCEEDED for one device. The provider is up and other targets
	// may be sent; only this one waits, RetryAfter or a backoff.
	TargetThrottled bool
}

// ParseRetryAfter reads an HTTP Retry-After value (RFC 9110 section
// 10.2.3): a number of seconds, or a date, which is taken relative to now.
// It is zero for an absent, malformed or past value.
func ParseRetryAfter(v string, now time.Time) time.Duration {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0
	}
	if n, err := strconv.ParseInt(v, 10, 64); err == nil {
		// A day at most: a longer wait outlives any message's lifetime,
		// and an absurd number must not overflow a Duration.
		return time.Duration(min(max(n, 0), 86400)) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil && t.After(now) {
		return min(t.Sub(now), 24*time.Hour)
	}
	return 0
}
