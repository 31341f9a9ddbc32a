package fake

import (
	"cmp"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
)

// FCM and Google OAuth constants.
const (
	fcmErrorType       = "type.googleapis.com/google.firebase.fcm.v1.FcmError"
	fcmMaxRequest      = 64 << 10 // bytes of request body read; Google's real limit is far higher
	fcmMaxMessage      = 4096     // bytes of data plus notification, FCM's payload limit
	fcmTokenLifetime   = 3600     // seconds an access token is valid, as Google issues them
	fcmMaxTTL          = 2419200  // seconds: four weeks, the longest android.ttl FCM keeps a message
	jwtBearerGrantType = "urn:ietf:params:oauth:grant-type:jwt-bearer"
	accessTokenPrefix  = "ya29.fake-"
)

// fcmBodies are the FCM error bodies that do not vary, rendered once.
type fcmBodies struct {
	unauthenticated, unregistered, unavailable, quotaExceeded []byte
	// senderMismatch is FCM's answer to a registration token of another
	// project than the one sent through.
	senderMismatch []byte
	// deviceQuota is QUOTA_EXCEEDED for one device's message rate, which
	// its QuotaFailure detail names.
	deviceQuota []byte
}

func newFCMBodies() fcmBodies {
	return fcmBodies{
		unauthenticated: fcmErrorBody(http.StatusUnauthorized, "UNAUTHENTICATED", "",
			"Request had invalid authentication credentials. Expected OAuth 2 access token, login cookie or other valid authentication credential. See https://developers.google.com/identity/sign-in/web/devconsole-project."),
		unregistered:   fcmErrorBody(http.StatusNotFound, "NOT_FOUND", "UNREGISTERED", "Requested entity was not found."),
		unavailable:    fcmErrorBody(http.StatusServiceUnavailable, "UNAVAILABLE", "UNAVAILABLE", "The service is currently unavailable."),
		quotaExceeded:  fcmErrorBody(http.StatusTooManyRequests, "RESOURCE_EXHAUSTED", "QUOTA_EXCEEDED", "Quota exceeded for quota metric 'Send requests' and limit 'Send requests per minute'."),
		deviceQuota:    fcmDeviceQuotaBody(),
		senderMismatch: fcmErrorBody(http.StatusForbidden, "PERMISSION_DENIED", "SENDER_ID_MISMATCH", "SenderId mismatch"),
	}
}

// fcmDeviceQuotaBody is FCM's QUOTA_EXCEEDED for one device: the FcmError
// detail, and a google.rpc.QuotaFailure whose violation names the device's
// message rate, which is how FCM tells it from the project's.
func fcmDeviceQuotaBody() []byte {
	const msg = "Device message rate exceeded."
	data, _ := json.Marshal(map[string]any{"error": map[string]any{ // plain strings: cannot fail
		"code": http.StatusTooManyRequests, "message": msg, "status": "RESOURCE_EXHAUSTED",
		"details": []any{
			map[string]string{"@type": fcmErrorType, "errorCode": "QUOTA_EXCEEDED"},
			map[string]any{"@type": "type.googleapis.com/google.rpc.QuotaFailure", "violations": []map[string]string{
				{"subject": "device", "description": msg},
			}},
		},
	}})
	return data
}

// fcmErrorBody renders Google's error shape. FCM adds an FcmError detail naming
// its own error code, which is what the Firebase SDK's IsUnregistered and friends
// look at; plain Google errors (bad credentials) carry no details.
func fcmErrorBody(code int, status, fcmCode, message string) []byte {
	type detail struct {
		Type      string `json:"@type"`
		ErrorCode string `json:"errorCode"`
	}
	type googleError struct {
		Code    int      `json:"code"`
		Message string   `json:"message"`
		Status  string   `json:"status"`
		Details []detail `json:"details,omitempty"`
	}
	e := googleError{Code: code, Message: message, Status: status}
	if fcmCode != "" {
		e.Details = []detail{{Type: fcmErrorType, ErrorCode: fcmCode}}
	}
	data, _ := json.Marshal(map[string]googleError{"error": e}) // cannot fail: plain strings
	return data
}

// handleToken is Google's OAuth 2.0 token endpoint for the JWT-bearer grant
// (RFC 7523), which service-account credentials use: the client signs a JWT with
// its private key and trades it for an access token.
func (s *Server) handleToken(w http.ResponseWriter, r *http.Request) {
	buf, body, tooLarge, err := s.readBody(r, 16<<10)
	defer s.putBuffer(buf)
	if err != nil {
		return
	}
	if tooLarge {
		s.oauthError(w, "invalid_request", "Request too large.")
		return
	}
	form, err := url.ParseQuery(string(body))
	if err != nil {
		s.oauthError(w, "invalid_request", "Malformed form body.")
		return
	}
	if gt := form.Get("grant_type"); gt != jwtBearerGrantType {
		s.oauthError(w, "unsupported_grant_type", "Invalid grant_type: "+gt)
		return
	}
	j, err := parseJWS(form.Get("assertion"))
	if err != nil {
		s.oauthError(w, "invalid_grant", "Invalid JWT Signature.")
		return
	}
	claims, err := j.decodeClaims()
	if err != nil {
		s.oauthError(w, "invalid_grant", "Invalid JWT.")
		return
	}
	// The issuer names the service account, that is the app; kid, when
	// the client sends it (Google's libraries do), names one of its keys.
	set := s.apps.load()
	owner := set.emails[claims.Iss]
	if owner == nil {
		s.oauthError(w, "invalid_grant", "Invalid grant: account not found")
		return
	}
	var key *appKey
	verified := false
	for _, k := range set.keys[owner][FCM] {
		if j.header.Kid != "" {
			if k.id == j.header.Kid {
				key = k
				break
			}
		} else if j.verifyRS256(&k.rsa.PublicKey) {
			key, verified = k, true
			break
		}
	}
	if key == nil && j.header.Kid != "" {
		s.oauthError(w, "invalid_grant", "Invalid grant: account not found")
		return
	}
	// A deleted key's assertions are answered as a forged one's.
	if key == nil || key.revoked || !verified && !j.verifyRS256(&key.rsa.PublicKey) {
		s.oauthError(w, "invalid_grant", "Invalid JWT Signature.")
		return
	}
	now := s.cfg.Now().Unix()
	switch {
	case claims.Aud != s.baseURL+"/token":
		s.oauthError(w, "invalid_grant", "Invalid JWT: Failed audience check. The right audience is "+s.baseURL+"/token")
		return
	case int64(claims.Exp) <= now || int64(claims.Iat) > now+60 || claims.Exp-claims.Iat > fcmTokenLifetime:
		s.oauthError(w, "invalid_grant", "Invalid JWT: Token must be a short-lived token (60 minutes) and in a reasonable timeframe. Check your iat and exp values in the JWT claim.")
		return
	case !hasFCMScope(claims.Scope):
		s.oauthError(w, "invalid_scope", "Invalid OAuth scope or ID token audience provided.")
		return
	}
	token, err := s.mintAccessToken(now+fcmTokenLifetime, key)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	s.writeJSON(w, http.StatusOK, map[string]any{
		"access_token": token,
		"expires_in":   fcmTokenLifetime,
		"token_type":   "Bearer",
	})
}

func hasFCMScope(scopes string) bool {
	for sc := range strings.FieldsSeq(scopes) {
		if sc == "https://www.googleapis.com/auth/firebase.messaging" || sc == "https://www.googleapis.com/auth/cloud-platform" {
			return true
		}
	}
	return false
}

func (s *Server) oauthError(w http.ResponseWriter, code, desc string) {
	s.writeJSON(w, http.StatusBadRequest, map[string]string{"error": code, "error_description": desc})
}

// maxAccessKeyID bounds the key id an access token carries; fakepush's are 40
// characters.
const maxAccessKeyID = 128

// mintAccessToken returns a self-validating access token: its expiry, a nonce
// and the id of the service-account key it was granted to (which names the
// app, and so the project), MACed with the directory's secret. Validation
// needs no stored state, so tokens stay valid across a fakepush restart, as
// Google's do across Google's.
func (s *Server) mintAccessToken(exp int64, key *appKey) (string, error) {
	if len(key.id) > maxAccessKeyID {
		return "", fmt.Errorf("mint access token: key id %q is too long", key.id)
	}
	raw := make([]byte, 16, 16+len(key.id))
	binary.BigEndian.PutUint64(raw[:8], uint64(exp))
	if _, err := rand.Read(raw[8:]); err != nil {
		return "", fmt.Errorf("mint access token: %w", err)
	}
	raw = append(raw, key.id...)
	return accessTokenPrefix + b64(raw) + "." + b64(s.accessTokenMAC(raw)), nil
}

func (s *Server) accessTokenMAC(raw []byte) []byte {
	m := hmac.New(sha256.New, s.creds.secret)
	m.Write([]byte("fcm-access-token\x00"))
	m.Write(raw)
	return m.Sum(nil)[:16]
}

// checkAccessToken reports whether "Bearer <token>" is an access token
// mintAccessToken made, unexpired, of a key not revoked.
func (s *Server) checkAccessToken(authz string) bool {
	return s.accessKey(s.apps.load(), authz) != nil
}

// accessKey validates "Bearer <token>" as minted by mintAccessToken and
// returns the service-account key it was granted to, or nil: a token forged,
// expired, or of a key since revoked. A token of 16 bytes, as fakepush minted
// them before it had apps, is the default app's first key's.
func (s *Server) accessKey(set *appSet, authz string) *appKey {
	scheme, token, ok := strings.Cut(authz, " ")
	if !ok || !strings.EqualFold(scheme, "bearer") || !strings.HasPrefix(token, accessTokenPrefix) {
		return nil
	}
	payload, mac, ok := strings.Cut(token[len(accessTokenPrefix):], ".")
	enc := base64.RawURLEncoding
	var raw [16 + maxAccessKeyID]byte
	var sum [16]byte
	// Decode writes DecodedLen bytes whatever it returns: the lengths are
	// checked first.
	if !ok || enc.DecodedLen(len(payload)) > len(raw) || enc.DecodedLen(len(mac)) != len(sum) {
		return nil
	}
	n, err := enc.Decode(raw[:], []byte(payload))
	if err != nil || n < 16 {
		return nil
	}
	if m, err := enc.Decode(sum[:], []byte(mac)); err != nil || m != len(sum) {
		return nil
	}
	if !hmac.Equal(sum[:], s.accessTokenMAC(raw[:n])) {
		return nil
	}
	if int64(binary.BigEndian.Uint64(raw[:8])) <= s.cfg.Now().Unix() {
		return nil
	}
	id := s.creds.fcmKeyID
	if n > 16 {
		id = string(raw[16:n])
	}
	key := set.byID[FCM][id]
	if key == nil || key.revoked {
		return nil
	}
	return key
}

// fcmSend is what fakepush keeps of a messages:send body once validated.
type fcmSend struct {
	validateOnly            bool
	token, topic, condition string
	messageID, collapseKey  string
	// receipt is the push's receipt token, from its data.
	receipt string
	// message is the raw message object, which points into the request's
	// buffer.
	message []byte
}

func (s *Server) handleFCMSend(w http.ResponseWriter, r *http.Request) {
	ad, ok := s.admit(w, r, FCM, fcmMaxRequest, func(w http.ResponseWriter, status, retryAfter int) {
		setRetryAfter(w, retryAfter)
		body := s.fcmBodies.unavailable
		if status == http.StatusTooManyRequests {
			body = s.fcmBodies.quotaExceeded
		}
		s.fcmReject(w, status, body)
	})
	if !ok {
		return
	}
	defer s.putBuffer(ad.buf)
	at, cnt, body, tooLarge := ad.at, ad.cnt, ad.body, ad.tooLarge
	set := s.apps.load()
	var tally appTally
	defer countApp(FCM, &tally)

	key := s.accessKey(set, r.Header.Get("Authorization"))
	if key == nil {
		s.fcmReject(w, http.StatusUnauthorized, s.fcmBodies.unauthenticated)
		return
	}
	tally.app = key.app
	// An access token is granted to a service account, which is of one
	// project: sending through another one is not permitted.
	project := r.PathValue("project")
	if project != key.app.project {
		s.fcmReject(w, http.StatusForbidden, fcmErrorBody(http.StatusForbidden, "PERMISSION_DENIED", "",
			"Permission 'cloudmessaging.messages.create' denied on resource '//cloudresourcemanager.googleapis.com/projects/"+project+"' (or it may not exist)."))
		return
	}
	if tooLarge {
		s.fcmInvalid(w, "Request payload size exceeds the limit.")
		return
	}
	req, problem := parseFCMSend(body)
	if problem != "" {
		s.fcmInvalid(w, problem)
		return
	}
	if req.token != "" {
		tally.app = s.tokenApp(set, FCM, req.token)
		if tally.app != key.app {
			// The token was registered with another app's sender id.
			s.fcmReject(w, http.StatusForbidden, s.fcmBodies.senderMismatch)
			return
		}
	}
	if strings.HasPrefix(req.token, "dead") {
		s.fcmReject(w, http.StatusNotFound, s.fcmBodies.unregistered)
		return
	}

	if req.validateOnly {
		// A dry run is validated and answered but delivers nothing: it is
		// how a sender opens its connections (Herald's FCM Warm), so it is
		// counted as a warm-up, not as a push, and not recorded.
		cnt.warmup()
		tally.warmup = true
		w.Header()["Content-Type"] = s.jsonType
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write(append(append([]byte(`{"name":"projects/`), project...), `/messages/fake_message_id"}`...))
		return
	}
	if req.token != "" {
		if retryAfter, throttled := s.throttle(FCM, req.token); throttled {
			setRetryAfter(w, retryAfter)
			s.fcmReject(w, http.StatusTooManyRequests, s.fcmBodies.deviceQuota)
			return
		}
	}
	target := req.token
	if target == "" {
		target = "/topics/" + req.topic
		if req.condition != "" {
			target = req.condition
		}
	}
	var d *detail
	if s.cfg.Details > 0 {
		d = newDetail(r.Header, req.message)
	}
	if s.rec.record(FCM, false, signer{app: tally.app.name, key: key.id}, target, req.messageID, req.collapseKey, at, d) {
		cnt.duplicates.Add(1)
	}
	if req.token != "" {
		s.devices.play(s.devices.draw(), req.receipt, at)
	}
	// FCM message ids look like "0:1500415314455276%31bd1c9631bd1c96".
	name := make([]byte, 0, 64+len(project))
	name = append(name, `{"name":"projects/`...)
	name = append(name, project...)
	name = append(name, "/messages/0:"...)
	name = strconv.AppendInt(name, at/1e3, 10)
	name = append(name, '%')
	name = strconv.AppendUint(name, s.fcmSeq.Add(1), 16)
	name = append(name, `"}`...)
	cnt.accepted.Add(1)
	tally.accepted = true
	w.Header()["Content-Type"] = s.jsonType
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(name)
}

func (s *Server) fcmReject(w http.ResponseWriter, status int, body []byte) {
	s.counters[FCM].rejected.Add(1)
	w.Header()["Content-Type"] = s.jsonType
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

func (s *Server) fcmInvalid(w http.ResponseWriter, message string) {
	s.fcmReject(w, http.StatusBadRequest, fcmErrorBody(http.StatusBadRequest, "INVALID_ARGUMENT", "INVALID_ARGUMENT", message))
}

// parseFCMSend validates a messages:send body as FCM does and returns FCM's
// wording of the first problem found. FCM reads the body as protobuf JSON: field
// names are exact (proto or lowerCamelCase), unknown names and wrong types are
// errors, and null stands for an absent field. The body is walked with
// forEachField rather than decoded into structs; see its comment for why.
func parseFCMSend(body []byte) (fcmSend, string) {
	var req fcmSend
	p := fcmParser{}
	var message []byte
	if !forEachField(body, func(k, v []byte) {
		switch string(k) {
		case "validate_only", "validateOnly":
			req.validateOnly = p.boolean("validate_only", v)
		case "message":
			message = v
		default:
			p.unknown(k, "")
		}
	}) {
		return req, "Invalid JSON payload received. Expected a JSON object."
	}
	if p.problem != "" {
		return req, p.problem
	}
	if isNull(message) {
		return req, "Request contains an invalid argument."
	}
	req.message = message
	var data, notification, android, apns []byte
	if !p.object("message", message, func(k, v []byte) {
		switch string(k) {
		case "token":
			req.token = p.str("message.token", v)
		case "topic":
			req.topic = p.str("message.topic", v)
		case "condition":
			req.condition = p.str("message.condition", v)
		case "name":
			p.str("message.name", v)
		case "data":
			data = v
		case "notification":
			notification = v
			p.object("message.notification", v, func(k, v []byte) {
				switch string(k) {
				case "title", "body", "image":
					p.str("message.notification."+string(k), v)
				default:
					p.unknown(k, "message.notification")
				}
			})
		case "android":
			android = v
		case "webpush":
			p.webpush(v)
		case "apns":
			apns = v
		case "fcm_options", "fcmOptions":
			p.object("message."+string(k), v, nil)
		default:
			p.unknown(k, "message")
		}
	}) || p.problem != "" {
		return req, p.problem
	}

	p.apns(apns, !shows(notification))
	if p.problem != "" {
		return req, p.problem
	}

	size := 0
	req.messageID, req.receipt = p.data("message.data", data, &size)
	if !isNull(notification) {
		size += len(notification)
	}
	var ttl, priority, androidNotification []byte
	p.object("message.android", android, func(k, v []byte) {
		switch string(k) {
		case "collapse_key", "collapseKey":
			req.collapseKey = p.str("message.android.collapse_key", v)
		case "priority":
			priority = v
		case "ttl":
			ttl = v
		case "restricted_package_name", "restrictedPackageName":
			p.str("message.android.restricted_package_name", v)
		case "data":
			// An Android data map replaces the message's on Android devices.
			if id, receipt := p.data("message.android.data", v, &size); id != "" {
				req.messageID, req.receipt = id, receipt
			}
		case "notification":
			androidNotification = v
			p.androidNotification(v)
		case "fcm_options", "fcmOptions":
			p.object("message.android.fcm_options", v, nil)
		case "direct_boot_ok", "directBootOk", "bandwidth_constrained_ok", "bandwidthConstrainedOk",
			"restricted_satellite_ok", "restrictedSatelliteOk":
			p.boolean("message.android."+string(k), v)
		default:
			p.unknown(k, "message.android")
		}
	})
	if p.problem != "" {
		return req, p.problem
	}
	if t := p.str("message.android.ttl", ttl); t != "" && !isProtoDuration(t) {
		return req, fmt.Sprintf("Invalid value at 'message.android.ttl' (type.googleapis.com/google.protobuf.Duration), %s", ttl)
	} else if t != "" && durationOver(t, fcmMaxTTL) {
		return req, fmt.Sprintf("Invalid value at 'message.android.ttl' (type.googleapis.com/google.protobuf.Duration), %s: the time to live may be at most 4 weeks (%ds)", ttl, fcmMaxTTL)
	}
	if pr := strings.ToLower(p.str("message.android.priority", priority)); pr != "" && pr != "normal" && pr != "high" {
		return req, fmt.Sprintf("Invalid value at 'message.android.priority' (type.googleapis.com/google.firebase.fcm.v1.AndroidMessagePriority), %s", priority)
	}
	if req.collapseKey == "" && !isNull(androidNotification) {
		// The notification tag collapses displayed notifications the same way.
		forEachField(androidNotification, func(k, v []byte) {
			if string(k) == "tag" {
				req.collapseKey = jsonString(v)
			}
		})
	}
	if p.problem != "" {
		return req, p.problem
	}

	targets := 0
	for _, t := range []string{req.token, req.topic, req.condition} {
		if t != "" {
			targets++
		}
	}
	switch {
	case targets == 0:
		return req, "Recipient of the message is not set."
	case targets > 1:
		return req, "Exactly one of token, topic or condition must be set."
	case req.token != "" && !isFCMToken(req.token):
		return req, "The registration token is not a valid FCM registration token"
	case req.topic != "" && !isFCMTopic(req.topic):
		return req, "Invalid topic name: " + req.topic
	case size > fcmMaxMessage:
		return req, "Message is too big"
	}
	return req, ""
}

// fcmParser collects the first problem met while walking a messages:send body,
// worded as Google's protobuf JSON parser words it.
type fcmParser struct {
	problem string
}

func (p *fcmParser) fail(msg string) {
	if p.problem == "" {
		p.problem = msg
	}
}

func (p *fcmParser) unknown(name []byte, at string) {
	if at == "" {
		p.fail(fmt.Sprintf("Invalid JSON payload received. Unknown name %q: Cannot find field.", name))
		return
	}
	p.fail(fmt.Sprintf("Invalid JSON payload received. Unknown name %q at '%s': Cannot find field.", name, at))
}

// str returns a string field's value; null or absent is "".
func (p *fcmParser) str(field string, v []byte) string {
	if isNull(v) {
		return ""
	}
	if v[0] != '"' {
		p.fail(fmt.Sprintf("Invalid value at '%s' (TYPE_STRING), %s", field, v))
		return ""
	}
	return jsonString(v)
}

func (p *fcmParser) boolean(field string, v []byte) bool {
	switch string(v) {
	case "true":
		return true
	case "false", "null":
		return false
	}
	p.fail(fmt.Sprintf("Invalid value at '%s' (TYPE_BOOL), %s", field, v))
	return false
}

// object checks that v is an object (or null) and walks it with fn, if given.
// It reports false when v is present but not an object.
func (p *fcmParser) object(field string, v []byte, fn func(k, v []byte)) bool {
	if isNull(v) {
		return true
	}
	if v[0] != '{' {
		p.fail(fmt.Sprintf("Invalid value at '%s' (TYPE_MESSAGE), %s", field, v))
		return false
	}
	if fn != nil {
		forEachField(v, fn)
	}
	return true
}

// data checks a data map: string values only and no reserved keys, as FCM
// requires. It adds the map's size to *size and returns its
// herald_message_id and herald_receipt.
func (p *fcmParser) data(field string, v []byte, size *int) (id, receipt string) {
	i := 0
	p.object(field, v, func(k, val []byte) {
		if len(val) == 0 || val[0] != '"' {
			p.fail(fmt.Sprintf("Invalid value at '%s[%d].value' (TYPE_STRING), %s", field, i, val))
		}
		key := string(k)
		if key == "from" || key == "message_type" || strings.HasPrefix(key, "google") || strings.HasPrefix(key, "gcm") {
			p.fail("Invalid data payload key: " + key)
		}
		switch key {
		case "herald_message_id":
			id = jsonString(val)
		case receiptKey:
			receipt = jsonString(val)
		}
		*size += len(k) + len(val) - 2
		i++
	})
	return id, receipt
}

// androidNotification checks message.android.notification: the fields
// Herald's SDK sends, with their types, the color as #rrggbb and the enums
// FCM defines.
func (p *fcmParser) androidNotification(v []byte) {
	const at = "message.android.notification"
	p.object(at, v, func(k, v []byte) {
		field := at + "." + string(k)
		switch string(k) {
		case "title", "body", "icon", "sound", "tag", "click_action", "body_loc_key", "title_loc_key",
			"channel_id", "image", "ticker", "event_time":
			p.str(field, v)
		case "color":
			if c := p.str(field, v); c != "" && !isRGBColor(c) {
				p.fail(fmt.Sprintf("Invalid value at '%s' (TYPE_STRING), %s: color must be #rrggbb", field, v))
			}
		case "sticky", "local_only", "default_vibrate_timings", "default_sound", "default_light_settings":
			p.boolean(field, v)
		case "notification_count":
			if !isNull(v) && !isNonNegativeInt(v) {
				p.fail(fmt.Sprintf("Invalid value at '%s' (TYPE_INT32), %s", field, v))
			}
		case "notification_priority":
			p.enum(field, v, "PRIORITY_UNSPECIFIED", "PRIORITY_MIN", "PRIORITY_LOW", "PRIORITY_DEFAULT", "PRIORITY_HIGH", "PRIORITY_MAX")
		case "visibility":
			p.enum(field, v, "VISIBILITY_UNSPECIFIED", "PRIVATE", "PUBLIC", "SECRET")
		case "proxy":
			p.enum(field, v, "PROXY_UNSPECIFIED", "ALLOW", "DENY", "IF_PRIORITY_LOWERED")
		case "body_loc_args", "title_loc_args", "vibrate_timings", "light_settings":
		default:
			p.unknown(k, at)
		}
	})
}

// webpush checks message.webpush: string headers, the Urgency header's
// values, data, a notification object and fcm_options' https link.
func (p *fcmParser) webpush(v []byte) {
	const at = "message.webpush"
	p.object(at, v, func(k, v []byte) {
		switch string(k) {
		case "headers":
			p.stringMap(at+".headers", v)
			forEachField(v, func(k, v []byte) {
				if strings.EqualFold(string(k), "Urgency") {
					switch jsonString(v) {
					case "very-low", "low", "normal", "high":
					default:
						p.fail(fmt.Sprintf("Invalid value at '%s.headers' : Urgency %s is not very-low, low, normal or high", at, v))
					}
				}
			})
		case "data":
			p.stringMap(at+".data", v)
		case "notification":
			p.object(at+".notification", v, nil)
		case "fcm_options", "fcmOptions":
			p.object(at+".fcm_options", v, func(k, v []byte) {
				if string(k) == "link" && !strings.HasPrefix(p.str(at+".fcm_options.link", v), "https://") {
					p.fail("The link must be an https URL.")
				}
			})
		default:
			p.unknown(k, at)
		}
	})
}

// shows reports whether a message's notification has something to show:
// a title or a body. A message without one is a data message.
func shows(notification []byte) bool {
	found := false
	if !isNull(notification) {
		forEachField(notification, func(k, v []byte) {
			if (string(k) == "title" || string(k) == "body") && jsonString(v) != "" {
				found = true
			}
		})
	}
	return found
}

// apns checks message.apns: string headers, apns-collapse-id within
// Apple's 64 bytes, fcm_options' image, and the payload's aps as APNs
// would check it with those headers (a background push must be
// content-available alone at priority 5). A data message (dataOnly, and no
// alert of its own in aps) may go to Apple only at priority 5: FCM refuses
// it at 10.
func (p *fcmParser) apns(v []byte, dataOnly bool) {
	const at = "message.apns"
	var headers, aps []byte
	p.object(at, v, func(k, v []byte) {
		switch string(k) {
		case "headers":
			headers = v
			p.stringMap(at+".headers", v)
		case "payload":
			p.object(at+".payload", v, func(k, v []byte) {
				if string(k) == "aps" {
					aps = v
				}
			})
		case "fcm_options", "fcmOptions":
			field := at + ".fcm_options"
			p.object(field, v, func(k, v []byte) {
				switch string(k) {
				case "image":
					if u, err := url.Parse(p.str(field+".image", v)); err != nil || u.Scheme != "https" || u.Host == "" {
						p.fail(fmt.Sprintf("Invalid value at '%s.image' (TYPE_STRING), %s: the image must be an https URL", field, v))
					}
				case "analytics_label", "analyticsLabel":
					p.str(field+"."+string(k), v)
				default:
					p.unknown(k, field)
				}
			})
		default:
			p.unknown(k, at)
		}
	})
	if p.problem != "" {
		return
	}
	pushType, priority := "", ""
	forEachField(headers, func(k, v []byte) {
		switch strings.ToLower(string(k)) {
		case "apns-push-type":
			pushType = jsonString(v)
		case "apns-priority":
			priority = jsonString(v)
		case "apns-collapse-id":
			if len(jsonString(v)) > apnsMaxCollapseID {
				p.fail(fmt.Sprintf("Invalid value at '%s.headers' : apns-collapse-id may be at most %d bytes", at, apnsMaxCollapseID))
			}
		}
	})
	if dataOnly && priority == "10" && !hasField(aps, "alert") {
		p.fail(fmt.Sprintf("Invalid value at '%s.headers' : a data message may go to Apple only at apns-priority 5, not %s", at, priority))
	}
	if p.problem != "" || pushType == "" {
		return
	}
	if isNull(aps) {
		aps = []byte("{}")
	}
	// Without apns-priority Apple takes 10.
	if reason := checkAPS(aps, pushType, cmp.Or(priority, "10")); reason != "" {
		p.fail("Request contains an invalid argument: APNs would refuse it (" + reason + ").")
	}
}

// stringMap checks a map<string, string>.
func (p *fcmParser) stringMap(field string, v []byte) {
	p.object(field, v, func(k, val []byte) {
		if len(val) == 0 || val[0] != '"' {
			p.fail(fmt.Sprintf("Invalid value at '%s[%s]' (TYPE_STRING), %s", field, k, val))
		}
	})
}

// enum checks a protobuf enum given by its name.
func (p *fcmParser) enum(field string, v []byte, names ...string) {
	s := p.str(field, v)
	if s != "" && !slices.Contains(names, s) {
		p.fail(fmt.Sprintf("Invalid value at '%s', %s", field, v))
	}
}

func isRGBColor(s string) bool {
	if len(s) != 7 || s[0] != '#' {
		return false
	}
	return isHex(s[1:])
}

// isFCMToken accepts the characters registration tokens are made of (base64url
// and ':'), so that an obviously mangled token fails as it would at Google.
func isFCMToken(t string) bool {
	if len(t) > 4096 {
		return false
	}
	for i := 0; i < len(t); i++ {
		c := t[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == ':' || c == '.') {
			return false
		}
	}
	return true
}

func isFCMTopic(t string) bool {
	for i := 0; i < len(t); i++ {
		c := t[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("-_.~%", c) >= 0) {
			return false
		}
	}
	return true
}

// isProtoDuration accepts protobuf's JSON duration: seconds with up to nine
// fractional digits and an "s", such as "30s" or "3.5s".
func isProtoDuration(d string) bool {
	num, ok := strings.CutSuffix(d, "s")
	if !ok || num == "" {
		return false
	}
	whole, frac, hasFrac := strings.Cut(num, ".")
	if whole == "" || !allDigits(whole) || len(whole) > 12 {
		return false
	}
	return !hasFrac || frac != "" && len(frac) <= 9 && allDigits(frac)
}

func allDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

func isNull(raw []byte) bool { return len(raw) == 0 || string(raw) == "null" }

// hasField reports whether the JSON object obj has the field name, not null.
func hasField(obj []byte, name string) bool {
	found := false
	if !isNull(obj) {
		forEachField(obj, func(k, v []byte) {
			found = found || string(k) == name && !isNull(v)
		})
	}
	return found
}

// durationOver reports whether the protobuf JSON duration d (as
// isProtoDuration accepts) is longer than limit seconds.
func durationOver(d string, limit int64) bool {
	whole, frac, _ := strings.Cut(strings.TrimSuffix(d, "s"), ".")
	n, err := strconv.ParseInt(whole, 10, 64)
	return err != nil || n > limit || n == limit && strings.Trim(frac, "0") != ""
}
