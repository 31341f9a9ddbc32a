package push

import (
	"strconv"
	"strings"
)

// messageIDPrefix marks Herald's message ids, which double as collapse keys.
const messageIDPrefix = "msg_"

// FormatMessageID returns the external id of message n, as the API shows it
// and as every push carries it.
func FormatMessageID(n int64) string { return messageIDPrefix + strconv.FormatInt(n, 10) }

// FormatDeviceID returns the external id of device n, as the API shows it
// and webhooks' events name it.
func FormatDeviceID(n int64) string { return "dev_" + strconv.FormatInt(n, 10) }

// ParseMessageID reads an external message id; ok is false for anything
// that is not one.
func ParseMessageID(s string) (int64, bool) { return ParseID(messageIDPrefix, s) }

// ParseID reads an external id of the form prefix + a positive decimal
// number written without leading zeros; ok is false for anything else.
func ParseID(prefix, s string) (int64, bool) {
	rest, ok := strings.CutPrefix(s, prefix)
	if !ok {
		return 0, false
	}
	n, err := strconv.ParseInt(rest, 10, 64)
	if err != nil || n <= 0 || strconv.FormatInt(n, 10) != rest {
		return 0, false
	}
	return n, true
}
