package fcm

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"firebase.google.com/go/v4/errorutils"

	"github.com/heraldpush/herald/jobs/push"
)

// fcmErrorType marks the detail in which FCM names its own error code.
const fcmErrorType = "type.googleapis.com/google.firebase.fcm.v1.FcmError"

// classify maps an error from the SDK's Send to the contract's reasons and
// the provider's words. An error with an HTTP answer is judged by the answer,
// which reasonFor reads the way the SDK's messaging.Is... helpers do (those
// helpers need the SDK's own error value, unwrapped; reading the answer keeps
// the mapping a pure, table-tested function), and throttleOf reads for how
// long and for whom a 429 or 503 asks Herald to wait. Without an answer,
// only the request's context can have ended it (failFast turns every other
// transport failure into an answer); anything else failed in the SDK before
// a request was made, which is Herald's doing. The result's Unanswered says
// that the request may have reached FCM without an answer coming back (see
// push.Result). Its time is the caller's to set.
func classify(err error, now time.Time) push.Result {
	if resp := errorutils.HTTPResponse(err); resp != nil {
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body) // a buffered copy: cannot fail
		r := push.Result{Unanswered: resp.Header.Get(noAnswerHeader) != ""}
		r.Reason, r.Detail = reasonFor(resp.StatusCode, body)
		if r.Reason.Transient() {
			retryAfter := resp.Header.Get(retryAfterHeader)
			if retryAfter == "" && resp.StatusCode != http.StatusServiceUnavailable {
				// failFast replaced a 503's own; any other answer's is FCM's.
				retryAfter = resp.Header.Get("Retry-After")
			}
			r.RetryAfter, r.TargetThrottled = throttleOf(body, push.ParseRetryAfter(retryAfter, now))
		}
		return r
	}
	switch {
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled),
		errorutils.IsDeadlineExceeded(err), errorutils.IsUnavailable(err), errorutils.IsUnknown(err):
		return push.Result{Reason: push.ReasonProviderUnavailable, Detail: push.ErrorClass(err), Unanswered: true}
	}
	return push.Result{Reason: push.ReasonInternal, Detail: push.ScrubDetail(err.Error())}
}

// quotaFailureType marks the detail in which Google says which quota a 429
// exceeded (google.rpc.QuotaFailure).
const quotaFailureType = "type.googleapis.com/google.rpc.QuotaFailure"

// minQuotaBackoff is the least FCM asks a sender to wait after exceeding
// the project's sending rate: "exponential backoff with a minimum initial
// delay of 1 minute" (FCM's ErrorCode reference, QUOTA_EXCEEDED).
const minQuotaBackoff = time.Minute

// throttleOf says how long a transient FCM answer asks Herald to wait and
// whether it is about the one device. QUOTA_EXCEEDED is a sending-rate
// limit of one of three scopes, which its QuotaFailure detail names: the
// project's rate or a topic's, which Herald waits out for every FCM send,
// at least a minute whatever the Retry-After; or one device's rate
// ("device message rate exceeded"), which only that device's delivery
// waits out. Any other transient answer (503 UNAVAILABLE, 500) is FCM's
// own trouble, for as long as its Retry-After, if any, says.
func throttleOf(body []byte, retryAfter time.Duration) (time.Duration, bool) {
	var ge struct {
		Error struct {
			Details []struct {
				Type       string `json:"@type"`
				ErrorCode  string `json:"errorCode"`
				Violations []struct {
					Subject     string `json:"subject"`
					Description string `json:"description"`
				} `json:"violations"`
			} `json:"details"`
		} `json:"error"`
	}
	_ = json.Unmarshal(body, &ge) // a body that is not Google's names no scope
	quota, device := false, false
	for _, d := range ge.Error.Details {
		switch d.Type {
		case fcmErrorType:
			quota = quota || d.ErrorCode == "QUOTA_EXCEEDED"
		case quotaFailureType:
			for _, v := range d.Violations {
				if strings.Contains(strings.ToLower(v.Subject+" "+v.Description), "device") {
					device = true
				}
			}
		}
	}
	switch {
	case quota && device:
		return retryAfter, true
	case quota:
		return max(retryAfter, minQuotaBackoff), false
	}
	return retryAfter, false
}

// googleError is the error body of Google APIs, with FCM's detail.
type googleError struct {
	Error struct {
		Message string `json:"message"`
		Status  string `json:"status"`
		Details []struct {
			Type      string `json:"@type"`
			ErrorCode string `json:"errorCode"`
		} `json:"details"`
	} `json:"error"`
}

// reasonFor maps an FCM error answer to a reason, and says it in FCM's words:
// the status, FCM's own error code where it gives one, and the message.
//
// UNREGISTERED is the dead token. An INVALID_ARGUMENT about the registration
// token is bad_token: it will never deliver, so the device is evicted.
// SENDER_ID_MISMATCH (the token belongs to another Firebase project) is
// wrong_app: a token of another app, or a wrong credentials file, which says
// it for every device at once and must not evict them all.
// Any other INVALID_ARGUMENT is about the message: payload_rejected.
// QUOTA_EXCEEDED and 429 are rate_limited; UNAVAILABLE, INTERNAL and 5xx are
// provider_unavailable. Authentication and permission failures (401, 403)
// refuse the app's service account: credentials_refused, never an
// eviction; THIRD_PARTY_AUTH_ERROR (the APNs key held by Firebase) is
// internal.
func reasonFor(status int, body []byte) (push.Reason, string) {
	var ge googleError
	_ = json.Unmarshal(body, &ge) // a body that is not Google's leaves the status to decide
	code := ""
	for _, d := range ge.Error.Details {
		if d.Type == fcmErrorType {
			code = d.ErrorCode
			break
		}
	}
	detail := strconv.Itoa(status)
	for _, part := range []string{ge.Error.Status, code} {
		if part != "" && !strings.Contains(detail, part) {
			detail += " " + part
		}
	}
	if msg := ge.Error.Message; msg != "" {
		detail += ": " + msg
	}

	switch code {
	case "UNREGISTERED":
		return push.ReasonUnregistered, detail
	case "SENDER_ID_MISMATCH":
		return push.ReasonWrongApp, detail
	case "QUOTA_EXCEEDED":
		return push.ReasonRateLimited, detail
	case "UNAVAILABLE", "INTERNAL":
		return push.ReasonProviderUnavailable, detail
	case "THIRD_PARTY_AUTH_ERROR", "APNS_AUTH_ERROR":
		return push.ReasonInternal, detail
	}
	switch {
	case code == "INVALID_ARGUMENT" || ge.Error.Status == "INVALID_ARGUMENT" || status == http.StatusBadRequest:
		if strings.Contains(strings.ToLower(ge.Error.Message), "registration token") {
			return push.ReasonBadToken, detail
		}
		return push.ReasonPayloadRejected, detail
	case status == http.StatusRequestEntityTooLarge:
		return push.ReasonPayloadRejected, detail
	case status == http.StatusTooManyRequests || ge.Error.Status == "RESOURCE_EXHAUSTED":
		return push.ReasonRateLimited, detail
	case status >= 500:
		return push.ReasonProviderUnavailable, detail
	case status == http.StatusUnauthorized || status == http.StatusForbidden ||
		ge.Error.Status == "UNAUTHENTICATED" || ge.Error.Status == "PERMISSION_DENIED":
		return push.ReasonCredentialsRefused, detail
	}
	return push.ReasonInternal, detail
}
