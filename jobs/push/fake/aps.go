package fake

import (
	"strconv"
)

// checkAPS checks the aps dictionary of an APNs payload against the push
// type and priority it came with, as Apple documents them ("Generating a
// remote notification", "Sending notification requests to APNs"), and
// returns Apple's reason for the first problem, or "". Keys Apple defines are
// checked for their type and range; other keys are Apple's to add and are
// let through.
//
// A background push must be content-available alone at priority 5: Apple
// refuses one with an alert, a sound or a badge, and throttles or refuses one
// sent at 10.
func checkAPS(aps []byte, pushType, priority string) string {
	bad := false
	var alert, badge, sound, contentAvailable bool
	forEachField(aps, func(k, v []byte) {
		switch string(k) {
		case "alert":
			alert = true
			bad = bad || !validAlert(v)
		case "badge":
			badge = true
			bad = bad || !isNonNegativeInt(v)
		case "sound":
			sound = true
			bad = bad || !validSound(v)
		case "content-available", "mutable-content":
			bad = bad || string(v) != "1" && string(v) != "0"
			contentAvailable = contentAvailable || string(k) == "content-available" && string(v) == "1"
		case "thread-id", "category", "target-content-id":
			bad = bad || v[0] != '"'
		case "interruption-level":
			switch jsonString(v) {
			case "passive", "active", "time-sensitive", "critical":
			default:
				bad = true
			}
		case "relevance-score":
			bad = bad || !inUnitRange(v)
		}
	})
	switch {
	case bad:
		return reasonBadPayload
	case pushType == "background" && (alert || badge || sound || !contentAvailable):
		return reasonInvalidPushType
	case pushType == "background" && priority != "5":
		return reasonBadPriority
	}
	return ""
}

// validAlert accepts a string or a dictionary whose text fields are strings.
func validAlert(v []byte) bool {
	if v[0] == '"' {
		return true
	}
	if v[0] != '{' {
		return false
	}
	ok := true
	forEachField(v, func(k, v []byte) {
		switch string(k) {
		case "title", "subtitle", "body", "launch-image", "title-loc-key", "subtitle-loc-key", "loc-key":
			ok = ok && v[0] == '"'
		}
	})
	return ok
}

// validSound accepts a sound's name, or a critical alert's dictionary:
// critical 0 or 1, a name, and a volume from 0 to 1.
func validSound(v []byte) bool {
	if v[0] == '"' {
		return len(v) > 2
	}
	if v[0] != '{' {
		return false
	}
	ok := true
	forEachField(v, func(k, v []byte) {
		switch string(k) {
		case "critical":
			ok = ok && (string(v) == "0" || string(v) == "1")
		case "name":
			ok = ok && v[0] == '"'
		case "volume":
			ok = ok && inUnitRange(v)
		}
	})
	return ok
}

func isNonNegativeInt(v []byte) bool {
	return allDigits(string(v)) && len(v) > 0 && len(v) <= 10
}

func inUnitRange(v []byte) bool {
	f, err := strconv.ParseFloat(string(v), 64)
	return err == nil && v[0] != '"' && f >= 0 && f <= 1
}
