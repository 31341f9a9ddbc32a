package fake

import (
	"bytes"
	"encoding/json"
)

// forEachField calls fn with the key and raw value of each member of the JSON
// object obj, and reports false if obj is not valid JSON or not an object.
//
// fakepush needs one or two top-level fields of a payload (aps,
// herald_message_id). json.Unmarshal would decode every nested value and, on the
// fresh goroutine HTTP/2 gives each request, grow its stack on the way: in
// profiles that was most of an APNs request's handler time. json.Valid is an
// iterative scanner, and once it has passed, finding the members is a flat walk.
func forEachField(obj []byte, fn func(key, value []byte)) bool {
	if !json.Valid(obj) {
		return false
	}
	i := skipSpace(obj, 0)
	if obj[i] != '{' {
		return false
	}
	i++
	for {
		i = skipSpace(obj, i)
		switch obj[i] {
		case '}':
			return true
		case ',':
			i++
			continue
		}
		end := skipString(obj, i)
		key := obj[i+1 : end-1]
		if bytes.IndexByte(key, '\\') >= 0 {
			var k string
			_ = json.Unmarshal(obj[i:end], &k) // valid, so it cannot fail
			key = []byte(k)
		}
		i = skipSpace(obj, end) + 1 // past ':'
		i = skipSpace(obj, i)
		vend := skipValue(obj, i)
		fn(key, obj[i:vend])
		i = vend
	}
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// skipString returns the index just past the string starting at b[i] == '"'.
func skipString(b []byte, i int) int {
	for j := i + 1; ; j++ {
		switch b[j] {
		case '\\':
			j++
		case '"':
			return j + 1
		}
	}
}

// skipValue returns the index just past the value starting at b[i].
func skipValue(b []byte, i int) int {
	switch b[i] {
	case '"':
		return skipString(b, i)
	case '{', '[':
		depth := 0
		for j := i; ; j++ {
			switch b[j] {
			case '"':
				j = skipString(b, j) - 1
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return j + 1
				}
			}
		}
	}
	j := i // a number, true, false or null
	for j < len(b) && b[j] != ',' && b[j] != '}' && b[j] != ']' && b[j] != ' ' && b[j] != '\t' && b[j] != '\n' && b[j] != '\r' {
		j++
	}
	return j
}
