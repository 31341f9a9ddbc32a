package fake

import (
	"bytes"
	"crypto/aes"
	"crypto/cipher"
	"crypto/ecdh"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/hkdf"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
)

// Web Push limits and formats.
const (
	webPushMaxBody      = 4096 // RFC 8030 section 7.2: push services must accept at least this, most reject more
	webPushMaxTopic     = 32   // RFC 8030 section 5.4
	vapidMaxLifetime    = 24 * 3600
	subscriptionNonce   = 12 // bytes, 16 base64url characters
	subscriptionTag     = 9  // bytes, 12 base64url characters
	subscriptionIDChars = 16 + 12
	// boundIDChars is the length of the id of a subscription made with
	// another key than the default app's first: the nonce, the key's id (16
	// characters) and the tag, which covers both.
	boundIDChars = 16 + vapidKeyIDChars + 12
	deadPrefix   = "dead"
)

// Subscription is a PushSubscription as a browser's toJSON() renders it, the
// shape Herald's device registration takes.
type Subscription struct {
	Endpoint       string           `json:"endpoint"`
	ExpirationTime *int64           `json:"expirationTime"`
	Keys           SubscriptionKeys `json:"keys"`
}

// SubscriptionKeys are the user agent's public key and authentication secret,
// both unpadded base64url.
type SubscriptionKeys struct {
	P256dh string `json:"p256dh"`
	Auth   string `json:"auth"`
}

// subscriptionKeys are the private half of a subscription, which fakepush keeps
// in the role of the browser.
type subscriptionKeys struct {
	priv *ecdh.PrivateKey
	pub  []byte
	auth []byte
}

// MintSubscription creates a subscription as a browser would on
// pushManager.subscribe() with the default app's VAPID key in use. A dead
// subscription has an id starting with "dead", so that pushes to it answer 410
// Gone.
//
// Subscriptions are stateless: the id carries a MAC, and the keys are derived
// from the id and the directory's secret. Minting a million costs no memory, and
// they stay valid across restarts like the rest of the credentials.
func (s *Server) MintSubscription(dead bool) (Subscription, error) {
	set := s.apps.load()
	return s.mintSubscription(set.current(set.def, WebPush), dead)
}

// MintAppSubscription is MintSubscription with the application server key
// applicationServerKey (base64url, as pushManager.subscribe takes it): one of
// the apps' VAPID public keys, to which the subscription is bound. Empty means
// the default app's key in use.
func (s *Server) MintAppSubscription(applicationServerKey string, dead bool) (Subscription, error) {
	set := s.apps.load()
	key := set.current(set.def, WebPush)
	if applicationServerKey != "" {
		if key = vapidKeyOf(set, applicationServerKey); key == nil {
			return Subscription{}, fmt.Errorf("application_server_key %q is no app's VAPID public key", applicationServerKey)
		}
	}
	return s.mintSubscription(key, dead)
}

// vapidKeyOf finds the VAPID key whose public key is k, base64url with or
// without padding.
func vapidKeyOf(set *appSet, k string) *appKey {
	pub, err := base64.RawURLEncoding.DecodeString(strings.TrimRight(k, "="))
	if err != nil || len(pub) != 65 {
		return nil
	}
	key := set.byID[WebPush][b64(pub)[:vapidKeyIDChars]]
	if key == nil || !bytes.Equal(key.public, pub) {
		return nil
	}
	return key
}

func (s *Server) mintSubscription(key *appKey, dead bool) (Subscription, error) {
	id, err := s.newSubscriptionID(key, dead)
	if err != nil {
		return Subscription{}, err
	}
	keys, err := s.subscriptionKeys(id)
	if err != nil {
		return Subscription{}, err
	}
	return Subscription{
		Endpoint: s.baseURL + "/webpush/" + id,
		Keys:     SubscriptionKeys{P256dh: b64(keys.pub), Auth: b64(keys.auth)},
	}, nil
}

// newSubscriptionID makes the id of a subscription bound to key. One made with
// the default app's first key is a nonce and its tag, as before fakepush had
// apps; any other carries the key's id between them, under the tag.
func (s *Server) newSubscriptionID(key *appKey, dead bool) (string, error) {
	legacy := key.id == s.legacyVAPIDID()
	for {
		var nonce [subscriptionNonce]byte
		if _, err := rand.Read(nonce[:]); err != nil {
			return "", fmt.Errorf("mint subscription: %w", err)
		}
		body := b64(nonce[:])
		if strings.HasPrefix(body, deadPrefix) {
			continue // a live id must never look dead
		}
		if !legacy {
			body += key.id
		}
		id := body + b64(s.subscriptionMAC(body))
		if dead {
			id = deadPrefix + id
		}
		return id, nil
	}
}

// legacyVAPIDID is the id of the default app's first VAPID key.
func (s *Server) legacyVAPIDID() string { return b64(s.creds.vapidPublic)[:vapidKeyIDChars] }

func (s *Server) subscriptionMAC(body string) []byte {
	m := hmac.New(sha256.New, s.creds.secret)
	m.Write([]byte("webpush-subscription\x00"))
	m.Write([]byte(body))
	return m.Sum(nil)[:subscriptionTag]
}

// knownSubscription reports whether id was minted by a fakepush with this
// directory's secret, with a key it knows.
func (s *Server) knownSubscription(id string) bool {
	return s.subscriptionKey(s.apps.load(), id) != nil
}

// subscriptionKey checks id's tag and returns the VAPID key the subscription
// is bound to, or nil when fakepush did not mint id.
func (s *Server) subscriptionKey(set *appSet, id string) *appKey {
	body := strings.TrimPrefix(id, deadPrefix)
	var kid string
	switch len(body) {
	case subscriptionIDChars:
		kid = s.legacyVAPIDID()
	case boundIDChars:
		kid = body[16 : 16+vapidKeyIDChars]
	default:
		return nil
	}
	signed := body[:len(body)-12]
	var tag [subscriptionTag]byte
	n, err := base64.RawURLEncoding.Decode(tag[:], []byte(body[len(signed):]))
	if err != nil || n != len(tag) || !hmac.Equal(tag[:], s.subscriptionMAC(signed)) {
		return nil
	}
	return set.byID[WebPush][kid]
}

// subscription returns the keys of a subscription id and the VAPID key it is
// bound to, nil when fakepush did not mint it. Deriving keys costs a P-256
// scalar multiplication, so recently used ones are cached; the cache is
// cleared when full, which bounds it at a few MB.
func (s *Server) subscription(set *appSet, id string) (subscriptionKeys, *appKey, error) {
	s.subKeys.mu.RLock()
	c, ok := s.subKeys.m[id]
	s.subKeys.mu.RUnlock()
	if ok {
		// The key as it is now: it may have been revoked since.
		return c.keys, set.byID[WebPush][c.kid], nil
	}
	vapid := s.subscriptionKey(set, id)
	if vapid == nil {
		return subscriptionKeys{}, nil, nil
	}
	keys, err := s.subscriptionKeys(id)
	if err != nil {
		return subscriptionKeys{}, vapid, err
	}
	s.subKeys.mu.Lock()
	if len(s.subKeys.m) >= 16384 {
		clear(s.subKeys.m)
	}
	s.subKeys.m[strings.Clone(id)] = cachedSubscription{keys: keys, kid: vapid.id}
	s.subKeys.mu.Unlock()
	return keys, vapid, nil
}

// subscriptionCache maps subscription ids to their derived keys.
type subscriptionCache struct {
	mu sync.RWMutex
	m  map[string]cachedSubscription
}

// cachedSubscription is a subscription's keys and the id of the VAPID key it
// is bound to.
type cachedSubscription struct {
	keys subscriptionKeys
	kid  string
}

func (s *Server) subscriptionKeys(id string) (subscriptionKeys, error) {
	var priv *ecdh.PrivateKey
	// A 32-byte string is a valid P-256 scalar unless it is zero or at least the
	// group order, which happens with probability 2^-32; try the next counter then.
	for ctr := byte(0); priv == nil; ctr++ {
		d, err := hkdf.Key(sha256.New, s.creds.secret, nil, "webpush-ua-key\x00"+id+"\x00"+string(rune(ctr)), 32)
		if err != nil {
			return subscriptionKeys{}, err
		}
		priv, _ = ecdh.P256().NewPrivateKey(d)
	}
	auth, err := hkdf.Key(sha256.New, s.creds.secret, nil, "webpush-auth\x00"+id, 16)
	if err != nil {
		return subscriptionKeys{}, err
	}
	return subscriptionKeys{priv: priv, pub: priv.PublicKey().Bytes(), auth: auth}, nil
}

func (s *Server) handleMintSubscription(w http.ResponseWriter, r *http.Request) {
	var opts struct {
		Dead bool `json:"dead"`
		// ApplicationServerKey is the VAPID public key the subscription is
		// made with, as pushManager.subscribe gets it.
		ApplicationServerKey string `json:"application_server_key"`
	}
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 4<<10))
	dec.DisallowUnknownFields()
	// An empty body is fine: it asks for an ordinary live subscription.
	if err := dec.Decode(&opts); err != nil && !errors.Is(err, io.EOF) {
		s.writeJSON(w, http.StatusBadRequest, controlError("invalid JSON: "+err.Error()))
		return
	}
	set := s.apps.load()
	key := set.current(set.def, WebPush)
	if opts.ApplicationServerKey != "" {
		if key = vapidKeyOf(set, opts.ApplicationServerKey); key == nil {
			s.writeJSON(w, http.StatusBadRequest, controlError("application_server_key is no app's VAPID public key (GET /_apps lists them)"))
			return
		}
	}
	sub, err := s.mintSubscription(key, opts.Dead)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	s.writeJSON(w, http.StatusCreated, sub)
}

// handleWebPush is a push service's push resource (RFC 8030 section 5).
func (s *Server) handleWebPush(w http.ResponseWriter, r *http.Request) {
	ad, ok := s.admit(w, r, WebPush, webPushMaxBody, func(w http.ResponseWriter, status, retryAfter int) {
		setRetryAfter(w, retryAfter)
		if status == http.StatusTooManyRequests {
			s.webPushReject(w, status, 900, "Too Many Requests", "Too many requests for this subscription.")
			return
		}
		s.webPushReject(w, status, 201, "Service Unavailable", "Service temporarily unavailable.")
	})
	if !ok {
		return
	}
	defer s.putBuffer(ad.buf)
	at, cnt, body, tooLarge := ad.at, ad.cnt, ad.body, ad.tooLarge
	set := s.apps.load()
	var tally appTally
	defer countApp(WebPush, &tally)

	id := r.PathValue("id")
	if strings.HasPrefix(id, deadPrefix) {
		if k := s.subscriptionKey(set, id); k != nil {
			tally.app = k.app
		}
		s.webPushReject(w, http.StatusGone, 103, "Gone", "Subscription has expired or been unsubscribed.")
		return
	}
	keys, vapid, err := s.subscription(set, id)
	if vapid != nil {
		tally.app = vapid.app
	}
	if err != nil {
		s.webPushReject(w, http.StatusInternalServerError, 999, "Internal Server Error", err.Error())
		return
	}
	if vapid == nil {
		s.webPushReject(w, http.StatusNotFound, 102, "Not Found", "Unknown subscription.")
		return
	}
	if status, msg := s.checkVAPID(r.Header.Get("Authorization"), "https://"+r.Host, vapid); status != 0 {
		s.webPushReject(w, status, 109, http.StatusText(status), msg)
		return
	}
	if retryAfter, throttled := s.throttle(WebPush, id); throttled {
		setRetryAfter(w, retryAfter)
		s.webPushReject(w, http.StatusTooManyRequests, 900, "Too Many Requests", "Too many requests for this subscription.")
		return
	}
	ttl := r.Header.Get("TTL")
	if ttl == "" {
		s.webPushReject(w, http.StatusBadRequest, 111, "Bad Request", "Missing TTL header.")
		return
	}
	if n, err := strconv.ParseInt(ttl, 10, 64); err != nil || n < 0 {
		s.webPushReject(w, http.StatusBadRequest, 112, "Bad Request", "Invalid TTL header.")
		return
	}
	switch r.Header.Get("Urgency") {
	case "", "very-low", "low", "normal", "high":
	default:
		s.webPushReject(w, http.StatusBadRequest, 110, "Bad Request", "Invalid Urgency header.")
		return
	}
	topic := r.Header.Get("Topic")
	if len(topic) > webPushMaxTopic || !isBase64URL(topic) {
		s.webPushReject(w, http.StatusBadRequest, 113, "Bad Request", "Topic must be at most 32 base64url characters.")
		return
	}
	if tooLarge {
		s.webPushReject(w, http.StatusRequestEntityTooLarge, 104, "Payload Too Large", "Body is larger than 4096 bytes.")
		return
	}

	messageID, receipt := "", ""
	// A device that will answer needs its token, which only decryption
	// reads: its body is decrypted whatever the sampling says.
	device := s.devices.draw()
	var d *detail
	if s.cfg.Details > 0 {
		// The headers now; the plaintext once decrypted, if it is.
		d = newDetail(r.Header, nil)
	}
	if len(body) > 0 {
		if !strings.EqualFold(r.Header.Get("Content-Encoding"), "aes128gcm") {
			s.webPushReject(w, http.StatusBadRequest, 110, "Bad Request", "Content-Encoding must be aes128gcm.")
			return
		}
		if s.decryptSeq.Add(1)%uint64(s.cfg.DecryptOneIn) == 0 || device.delivered {
			pbuf := s.bodyBuffers.Get().(*[]byte)
			plain, err := decryptAES128GCM(body, keys, (*pbuf)[:0])
			if err != nil {
				s.putBuffer(pbuf)
				s.webPushReject(w, http.StatusBadRequest, 110, "Bad Request", "Could not decrypt the message: "+err.Error())
				return
			}
			messageID, receipt = webPushIDs(plain)
			if d != nil {
				d.body = newDetail(nil, plain).body
			}
			*pbuf = plain
			s.putBuffer(pbuf)
		} else {
			// Sampled out: Herald puts the message id in Topic too, which is the
			// best a benchmark can record without paying for decryption.
			messageID = topic
		}
	}

	if s.rec.record(WebPush, false, signer{app: vapid.app.name, key: vapid.id}, id, messageID, topic, at, d) {
		cnt.duplicates.Add(1)
	}
	s.devices.play(device, receipt, at)
	cnt.accepted.Add(1)
	tally.accepted = true
	h := w.Header()
	h["Location"] = []string{s.baseURL + "/_webpush/messages/" + strconv.FormatUint(s.webPushSeq.Add(1), 36)}
	h["Ttl"] = []string{ttl}
	w.WriteHeader(http.StatusCreated)
}

// checkVAPID verifies an RFC 8292 "vapid t=<JWT>, k=<key>" header: an ES256 JWT
// signed by k for this push service's origin, expiring within a day, with a
// contact. A valid token from another key than bound, the subscription's, gets
// 403, and so does one from bound once it is revoked.
func (s *Server) checkVAPID(authz, origin string, bound *appKey) (status int, msg string) {
	scheme, params, ok := strings.Cut(authz, " ")
	if !ok || !strings.EqualFold(scheme, "vapid") {
		return http.StatusUnauthorized, "Missing or malformed VAPID Authorization header."
	}
	var t, k string
	for p := range strings.SplitSeq(params, ",") {
		name, val, _ := strings.Cut(strings.TrimSpace(p), "=")
		switch name {
		case "t":
			t = val
		case "k":
			k = val
		}
	}
	if t == "" || k == "" {
		return http.StatusUnauthorized, "VAPID header needs both t= and k=."
	}
	key, err := base64.RawURLEncoding.DecodeString(strings.TrimRight(k, "="))
	if err != nil {
		return http.StatusUnauthorized, "VAPID k= is not base64url."
	}
	isBound := bytes.Equal(key, bound.public)
	pub := &bound.ec.PublicKey
	if !isBound {
		if pub, err = ecdsa.ParseUncompressedPublicKey(elliptic.P256(), key); err != nil {
			return http.StatusUnauthorized, "VAPID k= is not a P-256 public key."
		}
	}
	j, err := parseJWS(t)
	if err != nil || !j.verifyES256(pub) {
		return http.StatusUnauthorized, "VAPID signature does not verify."
	}
	claims, err := j.decodeClaims()
	if err != nil {
		return http.StatusUnauthorized, "VAPID claims are not JSON."
	}
	now := s.cfg.Now().Unix()
	switch {
	case claims.Aud != origin && claims.Aud != strings.TrimSuffix(origin, ":443"):
		return http.StatusUnauthorized, "VAPID aud must be " + origin + "."
	case int64(claims.Exp) <= now:
		return http.StatusUnauthorized, "VAPID token has expired."
	case int64(claims.Exp) > now+vapidMaxLifetime:
		return http.StatusUnauthorized, "VAPID exp is more than 24 hours ahead."
	case !strings.HasPrefix(claims.Sub, "mailto:") && !strings.HasPrefix(claims.Sub, "https:"):
		return http.StatusUnauthorized, "VAPID sub must be a mailto: or https: contact."
	case !isBound:
		return http.StatusForbidden, "VAPID key is not the subscription's application server key."
	case bound.revoked:
		return http.StatusForbidden, "VAPID key has been revoked."
	}
	return 0, ""
}

func (s *Server) webPushReject(w http.ResponseWriter, status, errno int, errText, msg string) {
	s.counters[WebPush].rejected.Add(1)
	body := make([]byte, 0, 96+len(msg))
	body = append(body, `{"code":`...)
	body = strconv.AppendInt(body, int64(status), 10)
	body = append(body, `,"errno":`...)
	body = strconv.AppendInt(body, int64(errno), 10)
	body = append(body, `,"error":`...)
	body = strconv.AppendQuote(body, errText)
	body = append(body, `,"message":`...)
	body = strconv.AppendQuote(body, msg)
	body = append(body, '}')
	w.Header()["Content-Type"] = s.jsonType
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// decryptAES128GCM opens an RFC 8291 message: an RFC 8188 aes128gcm header whose
// key id is the sender's ephemeral public key, then a single record. It appends
// the plaintext, without padding, to dst.
func decryptAES128GCM(body []byte, keys subscriptionKeys, dst []byte) ([]byte, error) {
	const header = 16 + 4 + 1
	if len(body) < header {
		return nil, errors.New("shorter than the aes128gcm header")
	}
	salt := body[:16]
	rs := binary.BigEndian.Uint32(body[16:20])
	idlen := int(body[20])
	if idlen != 65 || len(body) < header+idlen {
		return nil, errors.New("key id is not an uncompressed P-256 key")
	}
	asPub := body[header : header+idlen]
	ciphertext := body[header+idlen:]
	if rs < 18 || uint64(len(ciphertext)) > uint64(rs) {
		return nil, errors.New("a push message must be a single record")
	}
	if len(ciphertext) < 17 {
		return nil, errors.New("record is too short")
	}
	pub, err := ecdh.P256().NewPublicKey(asPub)
	if err != nil {
		return nil, errors.New("key id is not a P-256 point")
	}
	secret, err := keys.priv.ECDH(pub)
	if err != nil {
		return nil, err
	}
	// RFC 8291 section 3.4: the input keying material binds both public keys and
	// the authentication secret; RFC 8188 then derives key and nonce from it.
	prkKey, err := hkdf.Extract(sha256.New, secret, keys.auth)
	if err != nil {
		return nil, err
	}
	info := make([]byte, 0, 14+65+65)
	info = append(info, "WebPush: info\x00"...)
	info = append(append(info, keys.pub...), asPub...)
	ikm, err := hkdf.Expand(sha256.New, prkKey, string(info), 32)
	if err != nil {
		return nil, err
	}
	prk, err := hkdf.Extract(sha256.New, ikm, salt)
	if err != nil {
		return nil, err
	}
	cek, err := hkdf.Expand(sha256.New, prk, "Content-Encoding: aes128gcm\x00", 16)
	if err != nil {
		return nil, err
	}
	nonce, err := hkdf.Expand(sha256.New, prk, "Content-Encoding: nonce\x00", 12)
	if err != nil {
		return nil, err
	}
	block, err := aes.NewCipher(cek)
	if err != nil {
		return nil, err
	}
	gcm, err := cipher.NewGCM(block)
	if err != nil {
		return nil, err
	}
	plain, err := gcm.Open(dst, nonce, ciphertext, nil)
	if err != nil {
		return nil, errors.New("authentication tag does not match")
	}
	// The last record ends with the delimiter 0x02 followed by zero padding.
	i := len(plain) - 1
	for i >= 0 && plain[i] == 0 {
		i--
	}
	if i < 0 || plain[i] != 2 {
		return nil, errors.New("missing last-record padding delimiter")
	}
	return plain[:i], nil
}

// webPushIDs reads herald_message_id from a decrypted payload, at the top
// level or inside "data", and the top level's herald_receipt. A payload
// that is not JSON carries neither.
func webPushIDs(plain []byte) (messageID, receipt string) {
	var top, data, token []byte
	forEachField(plain, func(key, value []byte) {
		switch string(key) {
		case "herald_message_id":
			top = value
		case "data":
			data = value
		case receiptKey:
			token = value
		}
	})
	receipt = jsonString(token)
	if id := jsonString(top); id != "" {
		return id, receipt
	}
	if len(data) == 0 || data[0] != '{' {
		return "", receipt
	}
	var nested []byte
	forEachField(data, func(key, value []byte) {
		if string(key) == "herald_message_id" {
			nested = value
		}
	})
	return jsonString(nested), receipt
}

func isBase64URL(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}

// b64 is the unpadded base64url encoding VAPID and Web Push keys use.
func b64(b []byte) string { return base64.RawURLEncoding.EncodeToString(b) }
