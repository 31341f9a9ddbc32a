package fake

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"
)

// Mode is how a channel answers, switched at run time through /_control.
type Mode string

// The modes. Unavailable and RateLimited answer every push with the provider's
// own 503 or 429 body, as the real services do when they shed load.
const (
	ModeOK          Mode = "ok"
	ModeUnavailable Mode = "unavailable"
	ModeRateLimited Mode = "rate_limited"
)

// Control is the body of POST /_control. Absent fields leave the channel's
// current setting unchanged.
type Control struct {
	Channel   string `json:"channel"`
	Mode      Mode   `json:"mode,omitempty"`
	LatencyMS *int   `json:"latency_ms,omitempty"`
	// RetryAfterS sets the Retry-After header on 429 and 503 answers. Zero (the
	// default) sends Retry-After: 1 on 429 and none on 503, which is how FCM
	// usually answers. Note that the Firebase SDK retries a 503 on its own (four
	// times, up to 7 s in all) unless Retry-After exceeds two minutes.
	RetryAfterS *int `json:"retry_after_s,omitempty"`
	// Throttle, when present, replaces the channel's per-device throttle
	// (an empty one removes it) and forgets what the last one did.
	Throttle *Throttle `json:"throttle,omitempty"`
}

// ChannelControl is one channel's current behaviour as GET /_control reports it.
type ChannelControl struct {
	Channel     string `json:"channel"`
	Mode        Mode   `json:"mode"`
	LatencyMS   int    `json:"latency_ms"`
	RetryAfterS int    `json:"retry_after_s"`
	// Throttle is the channel's per-device throttle, if it has one.
	Throttle *Throttle `json:"throttle,omitempty"`
}

// behaviour is a channel's current mode and latency. It is replaced whole, so a
// request reads one consistent value with a single atomic load.
type behaviour struct {
	mode       Mode
	latency    time.Duration
	retryAfter int
	// throttle, when set, limits some devices (throttle.go).
	throttle *Throttle
}

func (s *Server) behaviourOf(ch Channel) *behaviour { return s.behaviour[ch].Load() }

func (s *Server) resetBehaviour() {
	for ch := range numChannels {
		s.behaviour[ch].Store(&behaviour{mode: ModeOK, latency: s.cfg.Latency})
		s.throttles.reset(ch)
	}
}

// SetControl changes one channel's behaviour, as POST /_control does.
func (s *Server) SetControl(c Control) error {
	ch, ok := parseChannel(c.Channel)
	if !ok {
		return fmt.Errorf("channel must be apns, fcm or webpush, got %q", c.Channel)
	}
	next := *s.behaviourOf(ch)
	switch c.Mode {
	case "":
	case ModeOK, ModeUnavailable, ModeRateLimited:
		next.mode = c.Mode
	default:
		return fmt.Errorf("mode must be ok, unavailable or rate_limited, got %q", c.Mode)
	}
	if c.LatencyMS != nil {
		if *c.LatencyMS < 0 {
			return fmt.Errorf("latency_ms must not be negative, got %d", *c.LatencyMS)
		}
		next.latency = time.Duration(*c.LatencyMS) * time.Millisecond
	}
	if c.RetryAfterS != nil {
		if *c.RetryAfterS < 0 {
			return fmt.Errorf("retry_after_s must not be negative, got %d", *c.RetryAfterS)
		}
		next.retryAfter = *c.RetryAfterS
	}
	if c.Throttle != nil {
		if err := c.Throttle.validate(); err != nil {
			return err
		}
		next.throttle = nil
		if len(c.Throttle.Tokens) > 0 || c.Throttle.Share > 0 {
			th := *c.Throttle
			th.Tokens = slices.Clone(th.Tokens)
			if ch == WebPush {
				// A subscription is named by its endpoint or by the id
				// that ends it; fakepush keys it by the id.
				for i, tok := range th.Tokens {
					th.Tokens[i] = tok[strings.LastIndexByte(tok, '/')+1:]
				}
			}
			next.throttle = &th
		}
		s.throttles.reset(ch)
	}
	s.behaviour[ch].Store(&next)
	return nil
}

// Controls returns every channel's current behaviour.
func (s *Server) Controls() []ChannelControl {
	out := make([]ChannelControl, 0, numChannels)
	for ch := range numChannels {
		b := s.behaviourOf(ch)
		out = append(out, ChannelControl{
			Channel:     ch.String(),
			Mode:        b.mode,
			LatencyMS:   int(b.latency / time.Millisecond),
			RetryAfterS: b.retryAfter,
			Throttle:    b.throttle,
		})
	}
	return out
}

// Stats returns the counters of every channel and fakepush's own CPU use since
// start or the last Reset.
func (s *Server) Stats() Stats {
	load := func(ch Channel) ChannelStats {
		c := &s.counters[ch]
		return ChannelStats{
			Received:   c.received.Load(),
			Accepted:   c.accepted.Load(),
			Rejected:   c.rejected.Load(),
			Duplicates: c.duplicates.Load(),
			Warmups:    c.warmups.Load(),
			Throttled:  c.throttled.Load(),
			Early:      c.throttledEarly.Load(),
		}
	}
	st := Stats{APNs: load(APNs), FCM: load(FCM), WebPush: load(WebPush), Devices: s.devices.stats(), Connections: s.conns.stats()}
	for _, a := range s.apps.load().apps {
		var per [numChannels]AppChannelStats
		some := false
		for ch := range numChannels {
			c := &a.counts[ch]
			per[ch] = AppChannelStats{Received: c.received.Load(), Accepted: c.accepted.Load(), Rejected: c.rejected.Load()}
			some = some || per[ch] != AppChannelStats{}
		}
		if !some {
			continue
		}
		if st.Apps == nil {
			st.Apps = make(map[string]AppStats)
		}
		st.Apps[a.name] = AppStats{APNs: per[APNs], FCM: per[FCM], WebPush: per[WebPush]}
	}
	st.Process.CPUMicros = (processCPU() - s.cpuBase.Load()) / 1e3
	st.Process.Requests = st.APNs.Received + st.FCM.Received + st.WebPush.Received
	st.Process.InFlight = s.handling.Load()
	if st.Process.Requests > 0 {
		st.Process.CPUMicrosPerPush = float64(st.Process.CPUMicros) / float64(st.Process.Requests)
	}
	return st
}

// Receipts lists the accepted pushes that carried messageID, in arrival order.
func (s *Server) Receipts(messageID string) []Receipt { return s.rec.receipts(messageID, false) }

// DetailedReceipts is Receipts where those among the most recent
// Config.Details pushes show what fakepush received (see Receipt).
func (s *Server) DetailedReceipts(messageID string) []Receipt { return s.rec.receipts(messageID, true) }

// Reset forgets every recorded push, counter and declared sandbox token, and puts every channel back to
// mode ok with the configured latency: the state of a fresh start, minus the keys. The apps, their keys
// and revocations and the tokens declared theirs are the providers' configuration, not traffic: Reset
// keeps them.
func (s *Server) Reset() {
	s.rec.reset()
	s.sandbox.reset()
	for _, a := range s.apps.load().apps {
		for ch := range numChannels {
			c := &a.counts[ch]
			c.received.Store(0)
			c.accepted.Store(0)
			c.rejected.Store(0)
		}
	}
	for ch := range numChannels {
		c := &s.counters[ch]
		c.received.Store(0)
		c.accepted.Store(0)
		c.rejected.Store(0)
		c.duplicates.Store(0)
		c.warmups.Store(0)
		c.throttled.Store(0)
		c.throttledEarly.Store(0)
	}
	s.conns.reset()
	s.resetBehaviour()
	s.devices.reset()
	_ = s.devices.set(s.cfg.Devices) // validated by New
	s.cpuBase.Store(processCPU())
}

// SetDevices changes how fakepush plays the devices, as POST /_devices
// does.
func (s *Server) SetDevices(d Devices) error { return s.devices.set(d) }

// Devices returns how fakepush plays the devices now, its defaults filled.
func (s *Server) Devices() Devices { return *s.devices.settings.Load() }

func (s *Server) handleGetDevices(w http.ResponseWriter, _ *http.Request) {
	s.writeJSON(w, http.StatusOK, s.Devices())
}

func (s *Server) handleDevices(w http.ResponseWriter, r *http.Request) {
	var d Devices
	if s.applyControl(w, r, &d, func() error { return s.SetDevices(d) }) {
		s.writeJSON(w, http.StatusOK, s.Devices())
	}
}

// applyControl decodes a control request's JSON body (at most 1 MiB: a
// throttle or a sandbox declaration may name many devices) into v and
// applies it, answering 400 with the reason when either fails. It reports
// whether both succeeded, leaving the answer to the caller.
func (s *Server) applyControl(w http.ResponseWriter, r *http.Request, v any, apply func() error) bool {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		s.writeJSON(w, http.StatusBadRequest, controlError("invalid JSON: "+err.Error()))
		return false
	}
	if err := apply(); err != nil {
		s.writeJSON(w, controlStatus(err), controlError(err.Error()))
		return false
	}
	return true
}

// controlStatus is the status of a control request that err refused: 404
// for an app fakepush does not know, else 400.
func controlStatus(err error) int {
	if errors.Is(err, errNoApp) {
		return http.StatusNotFound
	}
	return http.StatusBadRequest
}

func (s *Server) handleStats(w http.ResponseWriter, _ *http.Request) {
	s.writeJSON(w, http.StatusOK, s.Stats())
}

func (s *Server) handleReceipts(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	if !q.Has("message_id") {
		s.writeJSON(w, http.StatusBadRequest, controlError("query parameter message_id is required"))
		return
	}
	var detail bool
	switch q.Get("detail") {
	case "", "0", "false":
	case "1", "true":
		detail = true
	default:
		s.writeJSON(w, http.StatusBadRequest, controlError("query parameter detail must be 1 or 0"))
		return
	}
	// A listing is written as it is made: ten million pushes would be
	// gigabytes held whole.
	w.Header()["Content-Type"] = s.jsonType
	w.WriteHeader(http.StatusOK)
	_ = s.rec.listing(q.Get("message_id"), detail).writeJSON(w)
}

func (s *Server) handleReset(w http.ResponseWriter, _ *http.Request) {
	s.Reset()
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) handleGetControl(w http.ResponseWriter, _ *http.Request) {
	s.writeJSON(w, http.StatusOK, s.Controls())
}

func (s *Server) handleControl(w http.ResponseWriter, r *http.Request) {
	var c Control
	if !s.applyControl(w, r, &c, func() error { return s.SetControl(c) }) {
		return
	}
	ch, _ := parseChannel(c.Channel)
	s.writeJSON(w, http.StatusOK, s.Controls()[ch])
}

// controlError is the error body of the control endpoints, shaped like Herald's
// own API errors.
func controlError(msg string) any {
	type body struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	}
	return map[string]body{"error": {Code: "invalid_request", Message: msg}}
}

// writeJSON encodes v; it serves the control endpoints, whose bodies are built per
// request. Provider endpoints write pre-built bytes instead.
func (s *Server) writeJSON(w http.ResponseWriter, status int, v any) {
	data, err := json.Marshal(v)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header()["Content-Type"] = s.jsonType
	w.WriteHeader(status)
	_, _ = w.Write(data)
}
