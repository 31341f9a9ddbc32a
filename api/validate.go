package api

import (
	"encoding/base64"
	"encoding/hex"
	"strconv"
	"strings"

	"github.com/heraldpush/herald/jobs"
	"github.com/heraldpush/herald/jobs/push"
)

// checkID validates a caller-chosen id (jobs.CheckID).
func checkID(field, id string) error { return jobs.CheckID(field, id) }

// checkTimezone validates an IANA zone name (jobs.CheckTimezone).
func checkTimezone(field, name string) error { return jobs.CheckTimezone(field, name) }

// Token length limits. APNs tokens are 32 bytes today and Apple reserves the
// right to lengthen them; FCM registration tokens run to about 160
// characters. The caps keep a token inside one btree index entry.
const (
	minAPNsTokenHex = 32
	maxAPNsTokenHex = 200
	maxFCMToken     = 1024
	maxEndpoint     = 2048
)

// normalizeAPNsToken checks an APNs device token (hex) and returns it in
// lower case, so that the same token in another case is the same device.
func normalizeAPNsToken(field, token string) (string, error) {
	if token == "" {
		return "", invalid(field, "%s is required for channel apns", field)
	}
	if len(token) < minAPNsTokenHex || len(token) > maxAPNsTokenHex || len(token)%2 != 0 {
		return "", invalid(field, "%s must be an APNs device token: %d to %d hex digits, an even number", field, minAPNsTokenHex, maxAPNsTokenHex)
	}
	if _, err := hex.DecodeString(token); err != nil {
		return "", invalid(field, "%s must be an APNs device token in hex", field)
	}
	return strings.ToLower(token), nil
}

func checkFCMToken(field, token string) error {
	if token == "" {
		return invalid(field, "%s is required for channel fcm", field)
	}
	if len(token) > maxFCMToken {
		return invalid(field, "%s is longer than %d characters", field, maxFCMToken)
	}
	for _, r := range token {
		if r <= ' ' || r > '~' {
			return invalid(field, "%s must be printable ASCII without spaces", field)
		}
	}
	return nil
}

// checkEndpoint validates a Web Push endpoint: an absolute https URL on a
// push service that egress admits, so that an endpoint Herald would refuse
// to post to is refused now, naming the field, rather than failing every
// delivery later. What only DNS can tell is checked when sending.
func checkEndpoint(field, endpoint string, egress *push.EgressPolicy) error {
	if endpoint == "" {
		return invalid(field, "%s is required", field)
	}
	if len(endpoint) > maxEndpoint {
		return invalid(field, "%s is longer than %d characters", field, maxEndpoint)
	}
	if err := egress.CheckEndpoint(endpoint); err != nil {
		return invalid(field, "%s is refused: %v", field, err)
	}
	return nil
}

// normalizeKey decodes a Web Push subscription key given in base64url (as
// browsers give it) or standard base64, padded or not, checks its length,
// and returns it as unpadded base64url.
func normalizeKey(field, value string, size int) (string, []byte, error) {
	if value == "" {
		return "", nil, invalid(field, "%s is required", field)
	}
	trimmed := strings.TrimRight(value, "=")
	raw, err := base64.RawURLEncoding.DecodeString(trimmed)
	if err != nil {
		raw, err = base64.RawStdEncoding.DecodeString(trimmed)
	}
	if err != nil {
		return "", nil, invalid(field, "%s must be base64url", field)
	}
	if len(raw) != size {
		return "", nil, invalid(field, "%s must decode to %d bytes, not %d", field, size, len(raw))
	}
	return base64.RawURLEncoding.EncodeToString(raw), raw, nil
}

// External ids of rows Herald numbers itself carry a prefix that says what
// they are, so that a device id is never mistaken for a message id.
const devicePrefix = "dev_"

func formatDeviceID(id int64) string { return devicePrefix + strconv.FormatInt(id, 10) }

// parseID reads an external id; ok is false for anything that is not one,
// which callers answer with 404, since no such resource can exist.
func parseID(prefix, s string) (int64, bool) { return push.ParseID(prefix, s) }

const schedulePrefix = "sch_"

func formatScheduleID(id int64) string { return schedulePrefix + strconv.FormatInt(id, 10) }
