package fake

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Channel is one of the three push providers fakepush imitates.
type Channel uint8

// The channels, in the order /_stats lists them.
const (
	APNs Channel = iota
	FCM
	WebPush
	numChannels
)

// String returns the channel's name as the contract spells it.
func (c Channel) String() string {
	switch c {
	case APNs:
		return "apns"
	case FCM:
		return "fcm"
	case WebPush:
		return "webpush"
	}
	return "unknown"
}

// parseChannel is the inverse of Channel.String.
func parseChannel(s string) (Channel, bool) {
	for c := range numChannels {
		if c.String() == s {
			return c, true
		}
	}
	return 0, false
}

// ChannelStats counts one channel's push requests. Received counts every request
// that reached a provider endpoint; each then ends Accepted or Rejected, except a
// request whose client went away during the injected latency, which is neither.
type ChannelStats struct {
	Received int64 `json:"received"`
	Accepted int64 `json:"accepted"`
	Rejected int64 `json:"rejected"`
	// Duplicates counts accepted pushes whose (channel, token, herald_message_id)
	// had been accepted before: what a device would show twice without collapsing.
	Duplicates int64 `json:"duplicates"`
	// Warmups counts the requests a sender makes to open its connections before
	// it pushes anything (an APNs push without a device token, which Apple
	// answers MissingDeviceToken; an FCM dry run), answered as the provider
	// answers them. They are in none of the counts above: they deliver nothing,
	// and counted as pushes they read as failures before anything was sent.
	Warmups int64 `json:"warmups"`
	// Throttled counts the pushes answered 429 by a per-device throttle
	// (Throttle), among the rejected; Early those of them that came before
	// the device's last 429's Retry-After had passed.
	Throttled int64 `json:"throttled"`
	Early     int64 `json:"throttled_early"`
}

// ProcessStats is fakepush's own CPU use since start or the last reset, so that a
// benchmark sharing the machine can subtract it.
type ProcessStats struct {
	CPUMicros        int64   `json:"cpu_us"`
	Requests         int64   `json:"requests"`
	CPUMicrosPerPush float64 `json:"cpu_us_per_request"`
	// InFlight counts the push requests being handled at this moment: once
	// it is zero, no request already sent can still change the counters.
	InFlight int64 `json:"in_flight"`
}

// Stats is the body of GET /_stats.
type Stats struct {
	APNs    ChannelStats `json:"apns"`
	FCM     ChannelStats `json:"fcm"`
	WebPush ChannelStats `json:"webpush"`
	Process ProcessStats `json:"process"`
	// Devices counts the receipts the devices fakepush plays sent back.
	Devices DeviceStats `json:"devices"`
	// Connections counts the connections clients opened (conns.go).
	Connections ConnStats `json:"connections"`
	// Apps counts, per app, the push requests fakepush took for it (see
	// AppStats). An app that had none since start or the last reset is left
	// out.
	Apps map[string]AppStats `json:"apps,omitempty"`
}

// AppStats counts one app's push requests per channel. A request is the
// app of its device (the APNs or FCM token's, the Web Push subscription
// key's), or, until fakepush has read the device, of its credentials. One
// answered before either was known (by a /_control mode, or with
// credentials of no app) counts in its channel's totals only, as does a
// warm-up.
type AppStats struct {
	APNs    AppChannelStats `json:"apns"`
	FCM     AppChannelStats `json:"fcm"`
	WebPush AppChannelStats `json:"webpush"`
}

// AppChannelStats counts one app's push requests on one channel: each
// received one was accepted or rejected.
type AppChannelStats struct {
	Received int64 `json:"received"`
	Accepted int64 `json:"accepted"`
	Rejected int64 `json:"rejected"`
}

// Receipt is one accepted push as GET /_receipts lists it. With detail=1,
// a push among the most recent Config.Details also has what the provider
// received: its request headers (names in lower case, as HTTP/2 sends
// them, with the credentials of Authorization left out) and its decoded
// body (the APNs JSON, the FCM message object, the Web Push plaintext after
// decryption; a plaintext that is not JSON is a string).
type Receipt struct {
	Channel string `json:"channel"`
	// Environment is the APNs host a push came to: production or sandbox;
	// empty on other channels.
	Environment string `json:"environment,omitempty"`
	Token       string `json:"token"`
	// App is the app fakepush took the push for: its device token's (for a
	// Web Push subscription, the app of the key it was made with).
	App string `json:"app,omitempty"`
	// KeyID names the key the push was authorized by: the APNs provider
	// token's kid, the private_key_id of the service-account key behind the
	// FCM access token, or the first 16 characters of the VAPID k= key.
	KeyID       string            `json:"key_id,omitempty"`
	CollapseKey string            `json:"collapse_key,omitempty"`
	ReceivedAt  time.Time         `json:"received_at"`
	Headers     map[string]string `json:"headers,omitempty"`
	Body        json.RawMessage   `json:"body,omitempty"`
}

// signer is the app and key a push came with, which its receipt names.
type signer struct {
	app, key string
}

// detail is what a detailed receipt adds, kept for the most recent pushes.
type detail struct {
	headers map[string]string
	body    json.RawMessage
}

// detailEntry is one slot of the recorder's ring of details.
type detailEntry struct {
	message, token uint32
	at             int64
	detail
}

// newDetail copies what a push's receipt shows in detail out of the request,
// whose buffers are reused once it is answered.
func newDetail(h http.Header, body []byte) *detail {
	d := &detail{headers: make(map[string]string, len(h))}
	for k, v := range h {
		val := strings.Join(v, ", ")
		if k == "Authorization" {
			scheme, _, _ := strings.Cut(val, " ")
			val = scheme + " (redacted)"
		}
		d.headers[strings.ToLower(k)] = val
	}
	switch {
	case body == nil:
	case json.Valid(body):
		d.body = bytes.Clone(body)
	default:
		d.body, _ = json.Marshal(string(body))
	}
	return d
}

// counters are the lock-free per-channel tallies behind ChannelStats.
type counters struct {
	received, accepted, rejected, duplicates, warmups atomic.Int64
	throttled, throttledEarly                         atomic.Int64
}

// warmup moves a request that admit counted as received to the warm-ups, once
// it is known to be one.
func (c *counters) warmup() {
	c.received.Add(-1)
	c.warmups.Add(1)
}

// recorder keeps every accepted push in about 16 bytes plus its share of interned
// strings: tokens and message ids are stored once and referred to by index, and
// times are Unix nanoseconds. A million pushes to a few thousand devices thus take
// some 20 MB, and nothing is kept per push that is not needed to answer /_receipts
// and to count duplicates.
type recorder struct {
	mu sync.Mutex
	// tokenIdx maps a channel's token (for Web Push, the subscription id) to its
	// index in tokens. One map per channel keeps lookups allocation-free.
	tokenIdx [numChannels]map[string]uint32
	tokens   []tokenEntry
	// strIdx interns message ids and collapse keys; index 0 is the empty string.
	strIdx map[string]uint32
	strs   []stringEntry
	// signerIdx interns the (app, key) pairs, which are few; index 0 is
	// none.
	signerIdx map[signer]uint32
	signers   []signer
	// tailIdx interns what a receipt has beside its time and token, its
	// collapse key and signer, keyed collapse<<32|signer: those pairs are
	// few too (a collapse key is most often its message's id), and
	// interning them keeps a receipt at 16 bytes.
	tailIdx map[uint64]uint32
	tails   []receiptTail
	// seen holds token<<32|message for every accepted push with a message id.
	seen pairSet

	// webPushBase turns a subscription id back into the endpoint a client used.
	webPushBase string

	// details is a ring of the most recent pushes' details: its length is
	// fixed, so that details cost the same memory after a million pushes as
	// after a thousand. next is the slot to overwrite.
	details []detailEntry
	next    int
}

type tokenEntry struct {
	name    string
	channel Channel
	sandbox bool
}

// environment is the APNs environment of the token's pushes; empty on
// other channels.
func (t tokenEntry) environment() string {
	switch {
	case t.channel != APNs:
		return ""
	case t.sandbox:
		return "sandbox"
	}
	return "production"
}

type stringEntry struct {
	s string
	// receipts are the pushes carrying this string as their message id.
	receipts []compactReceipt
}

type compactReceipt struct {
	at    int64
	token uint32
	tail  uint32 // index in recorder.tails
}

// receiptTail is a receipt's collapse key and signer, by index.
type receiptTail struct {
	collapse, signer uint32
}

// newRecorder keeps the details of the last details pushes.
func newRecorder(webPushBase string, details int) *recorder {
	r := &recorder{webPushBase: webPushBase, details: make([]detailEntry, max(details, 0))}
	r.resetLocked()
	return r
}

func (r *recorder) reset() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.resetLocked()
}

func (r *recorder) resetLocked() {
	for c := range r.tokenIdx {
		r.tokenIdx[c] = make(map[string]uint32)
	}
	r.tokens = r.tokens[:0:0]
	r.strIdx = map[string]uint32{"": 0}
	r.strs = []stringEntry{{}}
	r.signerIdx = map[signer]uint32{{}: 0}
	r.signers = []signer{{}}
	r.tailIdx = map[uint64]uint32{0: 0}
	r.tails = []receiptTail{{}}
	r.seen = newPairSet()
	clear(r.details)
	r.next = 0
}

// add records an accepted push, of no app, and reports whether it is a
// duplicate; see record.
func (r *recorder) add(ch Channel, token, messageID, collapseKey string, at int64, d *detail) bool {
	return r.record(ch, false, signer{}, token, messageID, collapseKey, at, d)
}

// sandboxKey prefixes a sandbox token's key, so that a token's pushes to the
// two hosts are told apart; hex tokens never start with it.
const sandboxKey = "sandbox:"

// record records an accepted push and reports whether it is a duplicate. at
// is Unix nanoseconds; sandbox says an APNs push came to the sandbox host; sg
// is the app and key it came with. The strings may point into request
// buffers: they are copied only when first seen. d, when not nil, is the
// push's detail.
func (r *recorder) record(ch Channel, sandbox bool, sg signer, token, messageID, collapseKey string, at int64, d *detail) bool {
	r.mu.Lock()
	defer r.mu.Unlock()

	lookup := token
	if sandbox {
		lookup = sandboxKey + token
	}
	t, ok := r.tokenIdx[ch][lookup]
	if !ok {
		t = uint32(len(r.tokens))
		key := strings.Clone(lookup)
		name := strings.TrimPrefix(key, sandboxKey)
		if ch == WebPush {
			name = r.webPushBase + key
		}
		r.tokenIdx[ch][key] = t
		r.tokens = append(r.tokens, tokenEntry{name: name, channel: ch, sandbox: sandbox})
	}
	m := r.internLocked(messageID)
	c := m
	if collapseKey != messageID {
		c = r.internLocked(collapseKey)
	}
	g, ok := r.signerIdx[sg]
	if !ok {
		g = uint32(len(r.signers))
		sg = signer{app: strings.Clone(sg.app), key: strings.Clone(sg.key)}
		r.signerIdx[sg] = g
		r.signers = append(r.signers, sg)
	}
	tk := uint64(c)<<32 | uint64(g)
	tail, ok := r.tailIdx[tk]
	if !ok {
		tail = uint32(len(r.tails))
		r.tailIdx[tk] = tail
		r.tails = append(r.tails, receiptTail{collapse: c, signer: g})
	}
	r.strs[m].receipts = append(r.strs[m].receipts, compactReceipt{at: at, token: t, tail: tail})
	if d != nil && len(r.details) > 0 {
		r.details[r.next] = detailEntry{message: m, token: t, at: at, detail: *d}
		r.next = (r.next + 1) % len(r.details)
	}

	if m == 0 {
		return false // without a message id there is nothing to be a duplicate of
	}
	return !r.seen.insert(uint64(t)<<32 | uint64(m))
}

func (r *recorder) internLocked(s string) uint32 {
	if i, ok := r.strIdx[s]; ok {
		return i
	}
	i := uint32(len(r.strs))
	s = strings.Clone(s)
	r.strIdx[s] = i
	r.strs = append(r.strs, stringEntry{s: s})
	return i
}

// receipts lists the pushes recorded for messageID in arrival order. The empty id
// lists pushes that carried none. With withDetail, the pushes whose details are
// still kept have them.
func (r *recorder) receipts(messageID string, withDetail bool) []Receipt {
	l := r.listing(messageID, withDetail)
	out := make([]Receipt, len(l.list))
	for i := range out {
		out[i] = l.receipt(i)
	}
	return out
}

// receiptListing is what a list of a message's receipts is made from,
// taken under the recorder's lock so that it is read without it: a listing
// of ten million pushes is written as it is made, never held whole
// (GET /_receipts). What it refers to is never changed once recorded: the
// recorder only appends, and a reset replaces its slices.
type receiptListing struct {
	list    []compactReceipt
	tokens  []tokenEntry
	tails   []receiptTail
	signers []signer
	// collapse is each tail's collapse key.
	collapse []string
	details  map[pushKey]detail
}

// pushKey names one push of a message: its token and when it came.
type pushKey struct {
	token uint32
	at    int64
}

// listing takes what receipts and GET /_receipts list for messageID.
func (r *recorder) listing(messageID string, withDetail bool) receiptListing {
	r.mu.Lock()
	defer r.mu.Unlock()
	m, ok := r.strIdx[messageID]
	if !ok {
		return receiptListing{}
	}
	l := receiptListing{list: r.strs[m].receipts, tokens: r.tokens, tails: r.tails, signers: r.signers,
		collapse: make([]string, len(r.tails))}
	for i, t := range r.tails {
		l.collapse[i] = r.strs[t.collapse].s
	}
	if withDetail {
		// The ring's slots are overwritten by later pushes: their details
		// are copied (a detail itself is never changed).
		l.details = make(map[pushKey]detail)
		for i := range r.details {
			if e := &r.details[i]; e.message == m && e.headers != nil {
				l.details[pushKey{e.token, e.at}] = e.detail
			}
		}
	}
	return l
}

// receipt is the listing's receipt i.
func (l receiptListing) receipt(i int) Receipt {
	cr := l.list[i]
	tok := l.tokens[cr.token]
	tail := l.tails[cr.tail]
	sg := l.signers[tail.signer]
	rc := Receipt{
		Channel:     tok.channel.String(),
		Environment: tok.environment(),
		Token:       tok.name,
		App:         sg.app,
		KeyID:       sg.key,
		CollapseKey: l.collapse[cr.tail],
		ReceivedAt:  time.Unix(0, cr.at).UTC(),
	}
	if d, ok := l.details[pushKey{cr.token, cr.at}]; ok {
		rc.Headers, rc.Body = d.headers, d.body
	}
	return rc
}

// writeJSON writes the listing as a JSON array, one receipt at a time
// through a buffer, so that its memory is the buffer's whatever its length.
func (l receiptListing) writeJSON(w io.Writer) error {
	bw := bufio.NewWriterSize(w, 64<<10)
	enc := json.NewEncoder(bw)
	if err := bw.WriteByte('['); err != nil {
		return err
	}
	for i := range l.list {
		if i > 0 {
			if err := bw.WriteByte(','); err != nil {
				return err
			}
		}
		if err := enc.Encode(l.receipt(i)); err != nil {
			return err
		}
	}
	if _, err := bw.WriteString("]\n"); err != nil {
		return err
	}
	return bw.Flush()
}

// pairSet is an open-addressing hash set of non-zero uint64 keys. Go's map spends
// close to 40 bytes on each uint64 key; this spends 8 to 16, which is what keeps
// a million recorded pushes small. Keys are never zero because message index 0
// (no message id) is never inserted.
type pairSet struct {
	slots []uint64
	n     int
	shift uint // 64 - log2(len(slots))
}

func newPairSet() pairSet {
	const bits = 10
	return pairSet{slots: make([]uint64, 1<<bits), shift: 64 - bits}
}

// insert adds k and reports whether it was absent.
func (p *pairSet) insert(k uint64) bool {
	if 4*(p.n+1) > 3*len(p.slots) {
		p.grow()
	}
	mask := uint64(len(p.slots) - 1)
	// Fibonacci hashing spreads the structured keys (small token and message
	// indexes) over the table; linear probing then stays short at 3/4 load.
	for i := (k * 0x9E3779B97F4A7C15) >> p.shift; ; i = (i + 1) & mask {
		switch p.slots[i] {
		case 0:
			p.slots[i] = k
			p.n++
			return true
		case k:
			return false
		}
	}
}

func (p *pairSet) grow() {
	old := p.slots
	p.slots = make([]uint64, 2*len(old))
	p.shift--
	p.n = 0
	for _, k := range old {
		if k != 0 {
			p.insert(k)
		}
	}
}
