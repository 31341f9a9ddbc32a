package apns

import (
	"encoding/json"
	"errors"
	"net/http"

	"github.com/sideshow/apns2"

	"github.com/heraldpush/herald/jobs/push"
)

// reasonFor maps an APNs answer other than 200 to the contract's reasons.
// Apple's reason string decides where it is specific; the status code
// decides the rest.
//
// The permanent token failures evict the device: 410 (Unregistered,
// ExpiredToken) and MissingDeviceToken. BadDeviceToken, which Apple answers
// both for a token that is not one and for a token of the other APNs
// environment, is wrong_environment and does not evict: Herald's tokens are
// checked before they are sent, so the device's registered environment is
// the likely fault, and a registration with the right one fixes it. Failures of our own request or
// credentials (403 token problems, a bad topic, priority or collapse id) are
// internal, or credentials_refused when Apple refuses the app's key or its
// topic (InvalidProviderToken, TopicDisallowed): evicting a device for them
// would punish it for Herald's misconfiguration. ExpiredProviderToken is
// internal once a new token has been tried (Provider.push sends once more
// with one). DeviceTokenNotForTopic is wrong_app: a token of another app
// than the device's, or a wrong topic, which says it for every device at
// once and must not evict them all.
func reasonFor(status int, reason string) push.Reason {
	switch reason {
	case apns2.ReasonUnregistered, apns2.ReasonExpiredToken:
		return push.ReasonUnregistered
	case apns2.ReasonBadDeviceToken:
		// Herald sends only well-formed tokens (rejectToken), so a token
		// the host does not know is most likely of the other environment.
		return push.ReasonWrongEnvironment
	case apns2.ReasonMissingDeviceToken:
		return push.ReasonBadToken
	case apns2.ReasonInvalidProviderToken, apns2.ReasonTopicDisallowed:
		// The app's key, or its topic under that key's team.
		return push.ReasonCredentialsRefused
	case apns2.ReasonDeviceTokenNotForTopic:
		return push.ReasonWrongApp
	case apns2.ReasonPayloadTooLarge, apns2.ReasonPayloadEmpty, "BadPayload":
		return push.ReasonPayloadRejected
	case apns2.ReasonTooManyRequests, apns2.ReasonTooManyProviderTokenUpdates:
		// TooManyRequests is one device token's (push marks it
		// TargetThrottled, and only that delivery waits). Too many
		// provider token updates is Herald's doing for every device, but
		// it passes by itself; backing off through the breaker is the
		// right response.
		return push.ReasonRateLimited
	case apns2.ReasonServiceUnavailable, apns2.ReasonShutdown, apns2.ReasonInternalServerError, apns2.ReasonIdleTimeout:
		return push.ReasonProviderUnavailable
	}
	switch status {
	case http.StatusGone:
		return push.ReasonUnregistered
	case http.StatusRequestEntityTooLarge:
		return push.ReasonPayloadRejected
	}
	return push.StatusReason(status)
}

// errorReason maps an error from apns2, which means no answer was read: the
// connection failed, the request timed out, or the context ended. The one
// exception is a payload apns2 could not encode, which no retry will fix.
func errorReason(err error) push.Reason {
	// A response body apns2 cannot decode is a *json.SyntaxError without
	// the MarshalerError around it: the provider's fault, not the payload's.
	var marshal *json.MarshalerError
	if errors.As(err, &marshal) {
		return push.ReasonPayloadRejected
	}
	return push.ReasonProviderUnavailable
}
