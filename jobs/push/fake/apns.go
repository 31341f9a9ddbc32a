package fake

import (
	"cmp"
	"encoding/json"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
)

// APNs limits, from Apple's "Sending notification requests to APNs".
const (
	apnsMaxPayload     = 4096
	apnsMaxVoIPPayload = 5120
	apnsMaxCollapseID  = 64
	apnsTokenLifetime  = 3600 // seconds; older provider tokens are ExpiredProviderToken
	apnsClockSkew      = 60   // seconds of future iat tolerated
	// apnsTokenRefresh is the least time between the issue times of two
	// provider tokens on one connection: Apple asks for a new token no more
	// often than every 20 minutes and answers TooManyProviderTokenUpdates
	// to a connection that changes it sooner.
	apnsTokenRefresh = 20 * 60
)

// The reasons fakepush answers with, spelled as Apple spells them.
const (
	reasonBadCollapseID          = "BadCollapseId"
	reasonBadDeviceToken         = "BadDeviceToken"
	reasonBadExpirationDate      = "BadExpirationDate"
	reasonBadMessageID           = "BadMessageId"
	reasonBadPriority            = "BadPriority"
	reasonBadPayload             = "BadPayload"
	reasonBadPath                = "BadPath"
	reasonExpiredProviderToken   = "ExpiredProviderToken"
	reasonInvalidProviderToken   = "InvalidProviderToken"
	reasonInvalidPushType        = "InvalidPushType"
	reasonMethodNotAllowed       = "MethodNotAllowed"
	reasonMissingDeviceToken     = "MissingDeviceToken"
	reasonMissingProviderToken   = "MissingProviderToken"
	reasonMissingTopic           = "MissingTopic"
	reasonPayloadEmpty           = "PayloadEmpty"
	reasonPayloadTooLarge        = "PayloadTooLarge"
	reasonServiceUnavailable     = "ServiceUnavailable"
	reasonTooManyRequests        = "TooManyRequests"
	reasonTopicDisallowed        = "TopicDisallowed"
	reasonUnregistered           = "Unregistered"
	reasonInternalServerError    = "InternalServerError"
	reasonIdleTimeout            = "IdleTimeout"
	reasonDeviceTokenNotForTopic = "DeviceTokenNotForTopic"
	reasonDuplicateHeaders       = "DuplicateHeaders"
	reasonTooManyTokenUpdates    = "TooManyProviderTokenUpdates"
)

// apnsErrorBodies pre-renders {"reason":...} for every reason, so that a rejection
// costs no encoding.
func apnsErrorBodies() map[string][]byte {
	m := make(map[string][]byte)
	for _, r := range []string{
		reasonBadCollapseID, reasonBadDeviceToken, reasonBadExpirationDate, reasonBadMessageID,
		reasonBadPriority, reasonBadPayload, reasonBadPath, reasonExpiredProviderToken,
		reasonInvalidProviderToken, reasonInvalidPushType, reasonMethodNotAllowed,
		reasonMissingDeviceToken, reasonMissingProviderToken, reasonMissingTopic, reasonPayloadEmpty,
		reasonPayloadTooLarge, reasonServiceUnavailable, reasonTooManyRequests, reasonTopicDisallowed,
		reasonInternalServerError, reasonIdleTimeout, reasonDeviceTokenNotForTopic,
		reasonDuplicateHeaders, reasonTooManyTokenUpdates,
	} {
		m[r] = []byte(`{"reason":"` + r + `"}`)
	}
	return m
}

// apnsTopicSuffix maps each push type to the suffix Apple requires on the bundle
// id in apns-topic.
func apnsTopicSuffix(pushType string) (suffix string, ok bool) {
	switch pushType {
	case "", "alert", "background", "mdm":
		return "", true
	case "location":
		return ".location-query", true
	case "widgets":
		return ".push-type.widgets", true
	case "voip":
		return ".voip", true
	case "complication":
		return ".complication", true
	case "fileprovider":
		return ".pushkit.fileprovider", true
	case "liveactivity":
		return ".push-type.liveactivity", true
	case "pushtotalk":
		return ".voip-ptt", true
	}
	return "", false
}

func (s *Server) handleAPNs(w http.ResponseWriter, r *http.Request) {
	pushType := headerValue(r.Header, "Apns-Push-Type")
	limit := apnsMaxPayload
	if pushType == "voip" {
		limit = apnsMaxVoIPPayload
	}
	// Apple sends no Retry-After.
	ad, ok := s.admit(w, r, APNs, limit, func(w http.ResponseWriter, status, _ int) {
		reason := reasonServiceUnavailable
		if status == http.StatusTooManyRequests {
			reason = reasonTooManyRequests
		}
		s.apnsReject(w, status, reason)
	})
	if !ok {
		return
	}
	defer s.putBuffer(ad.buf)
	at, cnt, body, tooLarge := ad.at, ad.cnt, ad.body, ad.tooLarge
	// The device token is the path's, so its app is known from the start.
	set := s.apps.load()
	token := r.PathValue("token")
	tally := appTally{app: s.tokenApp(set, APNs, token)}
	defer countApp(APNs, &tally)

	if repeatedAPNsHeader(r.Header) {
		s.apnsReject(w, http.StatusBadRequest, reasonDuplicateHeaders)
		return
	}
	key, status, reason := s.checkProviderToken(r, set, headerValue(r.Header, "Authorization"))
	if status != 0 {
		s.apnsReject(w, status, reason)
		return
	}
	// Apple binds a key to its team's apps: the topic must be the bundle id
	// of the key's app.
	topic := headerValue(r.Header, "Apns-Topic")
	suffix, knownType := apnsTopicSuffix(pushType)
	switch {
	case !knownType:
		s.apnsReject(w, http.StatusBadRequest, reasonInvalidPushType)
		return
	case topic == "":
		s.apnsReject(w, http.StatusBadRequest, reasonMissingTopic)
		return
	case topic != key.app.topic+suffix:
		s.apnsReject(w, http.StatusBadRequest, reasonTopicDisallowed)
		return
	}
	if p := headerValue(r.Header, "Apns-Priority"); p != "" && p != "10" && p != "5" && p != "1" {
		s.apnsReject(w, http.StatusBadRequest, reasonBadPriority)
		return
	}
	if e := headerValue(r.Header, "Apns-Expiration"); e != "" {
		if n, err := strconv.ParseInt(e, 10, 64); err != nil || n < 0 {
			s.apnsReject(w, http.StatusBadRequest, reasonBadExpirationDate)
			return
		}
	}
	apnsID := headerValue(r.Header, "Apns-Id")
	if apnsID != "" && !isCanonicalUUID(apnsID) {
		s.apnsReject(w, http.StatusBadRequest, reasonBadMessageID)
		return
	}
	collapseID := headerValue(r.Header, "Apns-Collapse-Id")
	if len(collapseID) > apnsMaxCollapseID {
		s.apnsReject(w, http.StatusBadRequest, reasonBadCollapseID)
		return
	}
	if !isHex(token) {
		s.apnsReject(w, http.StatusBadRequest, reasonBadDeviceToken)
		return
	}
	sandbox := onSandbox(r)
	if s.wrongEnvironment(r, token) {
		// Apple's answer to a token of the other environment.
		s.apnsReject(w, http.StatusBadRequest, reasonBadDeviceToken)
		return
	}
	if tally.app != key.app {
		// The token is another app's: Apple's answer to a topic the
		// device token was not issued for.
		s.apnsReject(w, http.StatusBadRequest, reasonDeviceTokenNotForTopic)
		return
	}
	if tooLarge {
		s.apnsReject(w, http.StatusRequestEntityTooLarge, reasonPayloadTooLarge)
		return
	}
	if len(body) == 0 {
		s.apnsReject(w, http.StatusBadRequest, reasonPayloadEmpty)
		return
	}
	var aps, messageID, receipt []byte
	valid := forEachField(body, func(key, value []byte) {
		switch string(key) {
		case "aps":
			aps = value
		case "herald_message_id":
			messageID = value
		case receiptKey:
			receipt = value
		}
	})
	if !valid || len(aps) == 0 || aps[0] != '{' {
		s.apnsReject(w, http.StatusBadRequest, reasonBadPayload)
		return
	}
	if reason := checkAPS(aps, pushType, cmp.Or(headerValue(r.Header, "Apns-Priority"), "10")); reason != "" {
		s.apnsReject(w, http.StatusBadRequest, reason)
		return
	}
	if strings.HasPrefix(token, "dead") {
		s.apnsUnregistered(w, at)
		return
	}
	if _, throttled := s.throttle(APNs, token); throttled {
		// Too many pushes to this one token; Apple names no Retry-After.
		s.apnsReject(w, http.StatusTooManyRequests, reasonTooManyRequests)
		return
	}

	var d *detail
	if s.cfg.Details > 0 {
		d = newDetail(r.Header, body)
	}
	if s.rec.record(APNs, sandbox, signer{app: key.app.name, key: key.id}, token, jsonString(messageID), collapseID, at, d) {
		cnt.duplicates.Add(1)
	}
	cnt.accepted.Add(1)
	tally.accepted = true
	s.devices.play(s.devices.draw(), jsonString(receipt), at)
	if apnsID == "" {
		apnsID = newUUID()
	}
	w.Header()["Apns-Id"] = []string{apnsID}
	w.WriteHeader(http.StatusOK)
}

// handleAPNsBadRequestLine answers what the device route does not match with
// Apple's 405 or 404 body.
func (s *Server) handleAPNsBadRequestLine(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodPost && (r.URL.Path == "/3/device/" || r.URL.Path == "/3/device") {
		// A push without a device token is how a sender opens a connection
		// before it has anything to send (Herald's APNs Warm): Apple answers
		// MissingDeviceToken, and no device is involved, so it is a warm-up
		// rather than a rejected push.
		s.counters[APNs].warmups.Add(1)
		s.apnsAnswer(w, http.StatusBadRequest, reasonMissingDeviceToken)
		return
	}
	s.counters[APNs].received.Add(1)
	if r.Method != http.MethodPost {
		s.apnsReject(w, http.StatusMethodNotAllowed, reasonMethodNotAllowed)
		return
	}
	s.apnsReject(w, http.StatusNotFound, reasonBadPath)
}

// apnsHeaders are the request headers Apple defines, each of which a
// request may carry once.
var apnsHeaders = []string{
	"Authorization", "Apns-Push-Type", "Apns-Id", "Apns-Expiration", "Apns-Priority", "Apns-Topic", "Apns-Collapse-Id",
}

// repeatedAPNsHeader reports whether one of Apple's headers came more than
// once, which Apple answers DuplicateHeaders (net/http gathers a repeated
// field's values under its one key).
func repeatedAPNsHeader(h http.Header) bool {
	for _, k := range apnsHeaders {
		if len(h[k]) > 1 {
			return true
		}
	}
	return false
}

// apnsConnKey marks, in a connection's context, its *apnsConn.
type apnsConnKey struct{}

// apnsConn is what fakepush knows of one connection's provider tokens: for
// each key that signed one, the last one it accepted and when that one was
// issued.
type apnsConn struct {
	mu     sync.Mutex
	tokens []connToken // one a key; a connection rarely sees more than one
}

type connToken struct {
	kid, bearer string
	iat         int64
}

// update takes token, signed by the key kid and issued at iat, as the
// connection's for that key, and reports false when that replaces another
// token of the key issued less than apnsTokenRefresh before it: Apple's
// TooManyProviderTokenUpdates. Tokens of different keys (different apps
// sharing a connection) are each their own.
func (c *apnsConn) update(kid, token string, iat int64) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := range c.tokens {
		t := &c.tokens[i]
		if t.kid != kid {
			continue
		}
		if t.bearer == token {
			return true
		}
		if iat-t.iat < apnsTokenRefresh {
			return false
		}
		t.bearer, t.iat = token, iat
		return true
	}
	c.tokens = append(c.tokens, connToken{kid: kid, bearer: token, iat: iat})
	return true
}

// checkProviderToken verifies an APNs provider token ("bearer <JWT>") the way
// Apple does: ES256, signed by the key its kid names among every app's keys
// (not revoked), iss naming that key's team, iat within the last hour, and no
// newer token of that key on r's connection within 20 minutes of the one
// before it. It returns the key.
func (s *Server) checkProviderToken(r *http.Request, set *appSet, authz string) (key *appKey, status int, reason string) {
	if authz == "" {
		return nil, http.StatusForbidden, reasonMissingProviderToken
	}
	scheme, token, ok := strings.Cut(authz, " ")
	if !ok || !strings.EqualFold(scheme, "bearer") || token == "" {
		return nil, http.StatusForbidden, reasonInvalidProviderToken
	}
	c, ok := s.apnsTokens.get(token)
	if ok {
		key = set.byID[APNs][c.kid]
	} else {
		j, err := parseJWS(token)
		if err != nil {
			return nil, http.StatusForbidden, reasonInvalidProviderToken
		}
		key = set.byID[APNs][j.header.Kid]
		if key == nil || key.revoked || !j.verifyES256(&key.ec.PublicKey) {
			return nil, http.StatusForbidden, reasonInvalidProviderToken
		}
		claims, err := j.decodeClaims()
		if err != nil || claims.Iss != key.app.teamID || claims.Iat <= 0 {
			return nil, http.StatusForbidden, reasonInvalidProviderToken
		}
		c = cachedToken{iat: int64(claims.Iat), kid: key.id}
		s.apnsTokens.put(token, c)
	}
	if key == nil || key.revoked {
		// Revoked since the token was first verified.
		return nil, http.StatusForbidden, reasonInvalidProviderToken
	}
	now := s.cfg.Now().Unix()
	switch {
	case c.iat > now+apnsClockSkew:
		return nil, http.StatusForbidden, reasonInvalidProviderToken
	case now-c.iat > apnsTokenLifetime:
		return nil, http.StatusForbidden, reasonExpiredProviderToken
	}
	if conn, ok := r.Context().Value(apnsConnKey{}).(*apnsConn); ok && !conn.update(key.id, token, c.iat) {
		return nil, http.StatusTooManyRequests, reasonTooManyTokenUpdates
	}
	return key, 0, ""
}

func (s *Server) apnsReject(w http.ResponseWriter, status int, reason string) {
	s.counters[APNs].rejected.Add(1)
	s.apnsAnswer(w, status, reason)
}

// apnsAnswer writes Apple's error body for reason, counting nothing.
func (s *Server) apnsAnswer(w http.ResponseWriter, status int, reason string) {
	h := w.Header()
	h["Content-Type"] = s.jsonType
	h["Apns-Id"] = []string{newUUID()}
	w.WriteHeader(status)
	_, _ = w.Write(s.apnsBodies[reason]) // a client gone is no concern of the fake's
}

// apnsUnregistered answers 410 with the time (in milliseconds) at which Apple
// last knew the token to be invalid; fakepush says "now".
func (s *Server) apnsUnregistered(w http.ResponseWriter, at int64) {
	s.counters[APNs].rejected.Add(1)
	var buf [64]byte
	b := append(buf[:0], `{"reason":"Unregistered","timestamp":`...)
	b = strconv.AppendInt(b, at/1e6, 10)
	b = append(b, '}')
	h := w.Header()
	h["Content-Type"] = s.jsonType
	h["Apns-Id"] = []string{newUUID()}
	w.WriteHeader(http.StatusGone)
	_, _ = w.Write(b)
}

// headerValue is Header.Get for a key already in canonical form, as net/http
// stores incoming keys; it skips Get's canonicalization of the key per call.
func headerValue(h http.Header, canonicalKey string) string {
	if v := h[canonicalKey]; len(v) > 0 {
		return v[0]
	}
	return ""
}

func isHex(s string) bool {
	if s == "" || len(s) > 200 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F') {
			return false
		}
	}
	return true
}

// isCanonicalUUID accepts the 8-4-4-4-12 hex form Apple requires for apns-id.
func isCanonicalUUID(s string) bool {
	if len(s) != 36 {
		return false
	}
	for i := 0; i < len(s); i++ {
		switch i {
		case 8, 13, 18, 23:
			if s[i] != '-' {
				return false
			}
		default:
			if !isHex(s[i : i+1]) {
				return false
			}
		}
	}
	return true
}

// newUUID returns a random version 4 UUID. apns-id need not be unpredictable, so
// the cheap runtime generator serves.
func newUUID() string {
	const hexDigits = "0123456789abcdef"
	var u [16]byte
	hi, lo := rand.Uint64(), rand.Uint64()
	for i := range 8 {
		u[i] = byte(hi >> (8 * i))
		u[8+i] = byte(lo >> (8 * i))
	}
	u[6] = u[6]&0x0f | 0x40
	u[8] = u[8]&0x3f | 0x80
	var out [36]byte
	j := 0
	for i, c := range u {
		if i == 4 || i == 6 || i == 8 || i == 10 {
			out[j] = '-'
			j++
		}
		out[j], out[j+1] = hexDigits[c>>4], hexDigits[c&0x0f]
		j += 2
	}
	return string(out[:])
}

// jsonString returns the value of a raw JSON string, or "" for anything else:
// a missing or non-string herald_message_id is recorded as none.
func jsonString(raw json.RawMessage) string {
	if len(raw) < 2 || raw[0] != '"' {
		return ""
	}
	if i := strings.IndexByte(string(raw[1:]), '\\'); i < 0 && raw[len(raw)-1] == '"' {
		return string(raw[1 : len(raw)-1]) // the common case needs no unescaping
	}
	var s string
	if json.Unmarshal(raw, &s) != nil {
		return ""
	}
	return s
}
