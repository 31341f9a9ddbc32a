package jobs

import (
	"errors"
	"fmt"
	"maps"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"unicode"

	"github.com/heraldpush/herald/jobs/apps"
	"github.com/heraldpush/herald/jobs/push"
)

// The rules of a message's payload, all of them in this file: what
// CheckPayload refuses, naming the field as POST /v1/messages' body names
// it. push holds no rule: it encodes a payload for each provider, measures
// those encodings (push.CheckSize) and puts locale tags in canonical case
// (push.CanonicalLocale), and this file says what follows from them.

// Bounds of the payload's short fields. Apple and Google document no limit
// for most of them; these keep an identifier an identifier, while the
// encoded size (push.CheckSize) bounds the whole.
const (
	maxPayloadName   = 256  // sound, category, thread_id, tags, channel, icon names
	maxPayloadURL    = 2048 // image, url, icons
	maxWebPushAction = 2    // what Chrome shows; others show fewer
)

var (
	androidPriorities = []string{"high", "normal"}
	webPushUrgencies  = []string{"very-low", "low", "normal", "high"}
)

// CheckPayload checks a message's content: something to show or deliver,
// no reserved data key, and a size every provider takes.
func CheckPayload(p *push.Content) error {
	if err := checkPayloadFields(p); err != nil {
		return err
	}
	if err := checkLocalizations(p); err != nil {
		return err
	}
	// Over HTTP the body was checked whole; a Go caller's strings are
	// checked here, each by its field.
	for field, v := range payloadTexts(p) {
		if err := CheckText("payload."+field, v); err != nil {
			return err
		}
	}
	for k, v := range p.Data {
		if err := CheckText("payload.data", k); err != nil {
			return err
		}
		if err := CheckText("payload.data."+k, v); err != nil {
			return err
		}
	}
	var sizeErr *push.SizeError
	if err := checkSizes(*p); errors.As(err, &sizeErr) {
		field := "payload"
		if sizeErr.Locale != "" {
			field = "payload.localizations." + sizeErr.Locale
		}
		if sizeErr.App != "" {
			field = "payload.apps." + sizeErr.App
		}
		return &InvalidError{Field: field, Message: sizeErr.Error(), Err: sizeErr}
	} else if err != nil {
		return invalid("payload", "payload cannot be encoded: %v", err)
	}
	return nil
}

// checkPayloadFields checks every field of a payload but its size, naming
// the first that is wrong.
func checkPayloadFields(p *push.Content) error {
	if p.Silent {
		// A background push shows nothing: what it would show is a
		// mistake, and APNs refuses a background push with an alert.
		for field, set := range map[string]bool{
			"title": p.Title != "", "subtitle": p.Subtitle != "", "body": p.Body != "", "image": p.Image != "",
			"sound": p.Sound != "", "badge": p.Badge != nil, "interruption_level": p.InterruptionLevel != "",
			"apns.critical_sound_volume": p.APNs != nil && p.APNs.CriticalSoundVolume != nil,
		} {
			if set {
				return invalid("payload."+field, "a silent payload shows nothing: payload.%s goes only with a visible one", field)
			}
		}
	} else if p.Title == "" && p.Body == "" && len(p.Data) == 0 {
		return invalid("payload", "payload needs a title, a body or data (or silent: true)")
	}
	for k := range p.Data {
		switch {
		case k == "":
			return invalid("payload.data", "payload.data keys must not be empty")
		case reservedDataKey(p, k):
			return invalid("payload.data."+k, "payload.data key %q is reserved", k)
		case p.FCM != nil && p.FCM.DataOnly && push.IsFCMDisplayKey(k):
			return invalid("payload.data."+k, "payload.data key %q is reserved with payload.fcm.data_only, which carries the display fields in the data: "+
				"title, subtitle, body, image, url, sound, badge, category, tag, android_channel_id, color and icon are Herald's", k)
		case fcmReservedDataKey(k):
			return invalid("payload.data."+k, "payload.data key %q is reserved by FCM, which refuses every push that carries it: "+
				"from, message_type, collapse_key, notification and keys starting with google or gcm are FCM's own", k)
		}
	}
	if err := checkHTTPSURL("payload.image", p.Image); err != nil {
		return err
	}
	if err := checkTapURL("payload.url", p.URL); err != nil {
		return err
	}
	if err := checkName("payload.sound", p.Sound); err != nil {
		return err
	}
	if p.Sound != "" && strings.ContainsAny(p.Sound, "/\\") {
		return invalid("payload.sound", `payload.sound must be "default" or the file name of a sound the app ships`)
	}
	if p.Badge != nil && (*p.Badge < 0 || *p.Badge > 1<<31-1) {
		return invalid("payload.badge", "payload.badge must be an integer from 0 to %d", 1<<31-1)
	}
	for field, v := range map[string]string{"payload.category": p.Category, "payload.thread_id": p.ThreadID} {
		if err := checkName(field, v); err != nil {
			return err
		}
	}
	if err := checkEnum("payload.interruption_level", p.InterruptionLevel, interruptionLevels); err != nil {
		return err
	}
	if r := p.RelevanceScore; r != nil && (*r < 0 || *r > 1) {
		return invalid("payload.relevance_score", "payload.relevance_score must be from 0 to 1")
	}
	if err := checkAPNs(p); err != nil {
		return err
	}
	if err := checkFCM(p); err != nil {
		return err
	}
	if err := checkAppOverrides(p); err != nil {
		return err
	}
	return checkWebPush(p.WebPush)
}

// checkAppOverrides holds payload.apps to app names and the same rules as
// the fields they replace.
func checkAppOverrides(p *push.Content) error {
	if len(p.Apps) > apps.MaxApps {
		return invalid("payload.apps", "payload.apps names at most %d apps, not %d", apps.MaxApps, len(p.Apps))
	}
	for name, o := range p.Apps {
		if apps.CheckName(name) != nil {
			return invalid("payload.apps", "payload.apps: %q is not an app's name", name)
		}
		at := "payload.apps." + name + "."
		for field, v := range map[string]string{"category": o.Category, "thread_id": o.ThreadID, "android_channel_id": o.AndroidChannelID, "sound": o.Sound} {
			if err := checkName(at+field, v); err != nil {
				return err
			}
			if err := CheckText(at+field, v); err != nil {
				return err
			}
		}
		if strings.ContainsAny(o.Sound, "/\\") {
			return invalid(at+"sound", `%ssound must be "default" or the file name of a sound the app ships`, at)
		}
		if o.AndroidChannelID != "" && p.Silent {
			return invalid(at+"android_channel_id", "a silent message shows nothing: it has no Android channel")
		}
		if o.Sound != "" && p.Silent {
			return invalid(at+"sound", "a silent message plays nothing: it has no sound")
		}
	}
	return nil
}

func checkAPNs(p *push.Content) error {
	a := p.APNs
	if a == nil {
		return nil
	}
	if v := a.CriticalSoundVolume; v != nil {
		if *v < 0 || *v > 1 {
			return invalid("payload.apns.critical_sound_volume", "payload.apns.critical_sound_volume must be from 0 to 1")
		}
		if p.InterruptionLevel != "critical" {
			return invalid("payload.apns.critical_sound_volume", "payload.apns.critical_sound_volume plays a critical alert: it needs interruption_level critical")
		}
	}
	return checkName("payload.apns.target_content_id", a.TargetContentID)
}

func checkFCM(p *push.Content) error {
	f := p.FCM
	if f == nil {
		return nil
	}
	if f.DataOnly && p.Silent {
		// A silent message is a data message already, and what data_only
		// adds to the data is display fields, which it has none of.
		return invalid("payload.fcm.data_only", "a silent payload is a data message already: payload.fcm.data_only goes only with a visible one")
	}
	for field, v := range map[string]string{
		"payload.fcm.android_channel_id": f.AndroidChannelID, "payload.fcm.tag": f.Tag, "payload.fcm.icon": f.Icon,
	} {
		if err := checkName(field, v); err != nil {
			return err
		}
	}
	if err := checkEnum("payload.fcm.android_priority", f.AndroidPriority, androidPriorities); err != nil {
		return err
	}
	if f.Color != "" && !isRGBColor(f.Color) {
		return invalid("payload.fcm.color", "payload.fcm.color must be #rrggbb, such as #ff8800")
	}
	return nil
}

func checkWebPush(w *push.WebPushOptions) error {
	if w == nil {
		return nil
	}
	if err := checkHTTPSURL("payload.webpush.icon", w.Icon); err != nil {
		return err
	}
	if err := checkHTTPSURL("payload.webpush.badge_icon", w.BadgeIcon); err != nil {
		return err
	}
	if len(w.Actions) > maxWebPushAction {
		return invalid("payload.webpush.actions", "payload.webpush.actions holds at most %d actions", maxWebPushAction)
	}
	for i, a := range w.Actions {
		for name, v := range map[string]string{"action": a.Action, "title": a.Title} {
			field := fmt.Sprintf("payload.webpush.actions[%d].%s", i, name)
			if v == "" {
				return invalid(field, "%s is required", field)
			}
			if err := checkName(field, v); err != nil {
				return err
			}
		}
	}
	if err := checkName("payload.webpush.tag", w.Tag); err != nil {
		return err
	}
	if w.Renotify && w.Tag == "" {
		// Browsers refuse renotify without a tag (showNotification throws).
		return invalid("payload.webpush.renotify", "payload.webpush.renotify needs payload.webpush.tag")
	}
	return checkEnum("payload.webpush.urgency", w.Urgency, webPushUrgencies)
}

// checkHTTPSURL accepts "" or an absolute https URL with a host.
func checkHTTPSURL(field, v string) error {
	if v == "" {
		return nil
	}
	if u, err := url.Parse(v); err != nil || u.Scheme != "https" || u.Host == "" || len(v) > maxPayloadURL {
		return invalid(field, "%s must be an https URL of at most %d bytes", field, maxPayloadURL)
	}
	return nil
}

// deniedURLSchemes are the schemes a tap's link must not have, although
// they are not https: a browser or an OS acts on them itself, running
// script (javascript, vbscript), opening a document the caller wrote
// (data, blob, filesystem, view-source), reading the device (file,
// content, resource, jar), launching another app's activity (intent), or
// sending the link in the clear (http, ftp, ws, wss). A custom scheme that
// is none of these is an app's own, which it registered to open itself.
var deniedURLSchemes = map[string]bool{
	"javascript": true, "vbscript": true, "data": true, "blob": true, "filesystem": true,
	"view-source": true, "about": true, "file": true, "content": true, "resource": true,
	"jar": true, "intent": true, "chrome": true, "http": true, "ftp": true, "ws": true, "wss": true,
}

// urlScheme is RFC 3986's scheme: a letter, then letters, digits, +, - or .
var urlScheme = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9+.-]*$`)

// checkTapURL accepts "" or the link a tap opens: an https URL with a host,
// or an app's own custom scheme (myapp://standup/42,
// com.example.app:/standup) that is not one of deniedURLSchemes, with
// something after the colon. No whitespace or control characters, which a
// browser strips and so would read java\tscript: as javascript:.
func checkTapURL(field, v string) error {
	if v == "" {
		return nil
	}
	refused := invalid(field, "%s must be an https URL or a link in the app's own custom scheme (myapp://...), of at most %d bytes; "+
		"javascript, data, file, http and other schemes a browser or the OS would act on are refused", field, maxPayloadURL)
	if len(v) > maxPayloadURL || strings.IndexFunc(v, func(r rune) bool { return r <= ' ' || r == 0x7f || unicode.IsSpace(r) }) >= 0 {
		return refused
	}
	scheme, rest, ok := strings.Cut(v, ":")
	if !ok || !urlScheme.MatchString(scheme) || rest == "" || deniedURLSchemes[strings.ToLower(scheme)] {
		return refused
	}
	u, err := url.Parse(v)
	switch {
	case err != nil:
		return refused
	case strings.EqualFold(scheme, "https") && u.Host == "":
		return refused
	}
	return nil
}

// checkName accepts "" or a short name without control characters.
func checkName(field, v string) error {
	if len(v) > maxPayloadName {
		return invalid(field, "%s must be at most %d bytes", field, maxPayloadName)
	}
	if strings.ContainsFunc(v, func(r rune) bool { return r < 0x20 || r == 0x7f }) {
		return invalid(field, "%s must not hold control characters", field)
	}
	return nil
}

// checkEnum accepts "" or one of values.
func checkEnum(field, v string, values []string) error {
	if v == "" || slices.Contains(values, v) {
		return nil
	}
	return invalid(field, "%s %q is not one of %s", field, v, strings.Join(values, ", "))
}

func isRGBColor(s string) bool {
	if len(s) != 7 || s[0] != '#' {
		return false
	}
	for i := 1; i < 7; i++ {
		c := s[i]
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F') {
			return false
		}
	}
	return true
}

// payloadTexts are the payload's strings but its data, by field name.
func payloadTexts(p *push.Content) map[string]string {
	t := map[string]string{
		"title": p.Title, "subtitle": p.Subtitle, "body": p.Body, "image": p.Image, "url": p.URL,
		"sound": p.Sound, "category": p.Category, "thread_id": p.ThreadID, "interruption_level": p.InterruptionLevel,
	}
	if a := p.APNs; a != nil {
		t["apns.target_content_id"] = a.TargetContentID
	}
	if f := p.FCM; f != nil {
		t["fcm.android_channel_id"], t["fcm.android_priority"] = f.AndroidChannelID, f.AndroidPriority
		t["fcm.tag"], t["fcm.color"], t["fcm.icon"] = f.Tag, f.Color, f.Icon
	}
	if w := p.WebPush; w != nil {
		t["webpush.icon"], t["webpush.badge_icon"], t["webpush.tag"], t["webpush.urgency"] = w.Icon, w.BadgeIcon, w.Tag, w.Urgency
		for i, a := range w.Actions {
			t[fmt.Sprintf("webpush.actions[%d].action", i)] = a.Action
			t[fmt.Sprintf("webpush.actions[%d].title", i)] = a.Title
		}
	}
	for tag, l := range p.Localizations {
		t["localizations."+tag+".title"], t["localizations."+tag+".subtitle"], t["localizations."+tag+".body"] = l.Title, l.Subtitle, l.Body
	}
	return t
}

// maxLocalizations bounds a payload's localizations: more languages than
// any app ships, few enough that encoding every one stays cheap.
const maxLocalizations = 100

// checkLocalizations checks a payload's localizations and puts their
// keys in canonical case, so that users' locales find them.
func checkLocalizations(p *push.Content) error {
	if len(p.Localizations) > maxLocalizations {
		return invalid("payload.localizations", "payload.localizations may hold at most %d languages, not %d", maxLocalizations, len(p.Localizations))
	}
	canonical := make(map[string]push.Text, len(p.Localizations))
	for _, key := range slices.Sorted(maps.Keys(p.Localizations)) {
		field := "payload.localizations." + key
		tag, err := push.CanonicalLocale(key)
		if err != nil {
			return invalid(field, "%s: %v", field, err)
		}
		if _, dup := canonical[tag]; dup {
			return invalid(field, "%s: payload.localizations names %s twice (tags are case-insensitive)", field, tag)
		}
		text := p.Localizations[key]
		if text == (push.Text{}) {
			return invalid(field, "%s needs a title, a subtitle or a body", field)
		}
		canonical[tag] = text
	}
	if len(canonical) > 0 {
		p.Localizations = canonical
	}
	return nil
}

// checkSizes is push.CheckSize for c's own text and every localization of it,
// the push.SizeError naming the localization that is too large.
func checkSizes(c push.Content) error {
	// Each app's overrides make an encoding of their own, whose size is
	// checked as the message's is.
	for app := range c.Apps {
		err := checkSizes(c.ForApp(app))
		var size *push.SizeError
		if errors.As(err, &size) {
			size.App = app
		}
		if err != nil {
			return err
		}
	}
	c.Apps = nil
	if err := push.CheckSize(c.Localized("")); err != nil {
		return err
	}
	for key := range c.Localizations {
		err := push.CheckSize(c.Localized(key))
		var size *push.SizeError
		if errors.As(err, &size) {
			size.Locale = key
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// interruptionLevels are the interruption levels APNs knows, in its words.
var interruptionLevels = []string{"passive", "active", "time-sensitive", "critical"}

// reservedDataKey reports whether data key k would collide with what the
// encodings of p put next to the data (push.APNsPayload, push.FCMData), and
// so must be refused.
func reservedDataKey(p *push.Content, k string) bool {
	switch k {
	case push.MessageIDKey, push.ReceiptKey, push.APSKey:
		return true
	case push.URLKey:
		return p.URL != ""
	case push.ImageKey:
		return p.Image != ""
	}
	return false
}

// fcmReservedDataKey reports whether FCM reserves data key k: Firebase's
// HTTP v1 reference names from, message_type and any key starting with
// google or gcm, and FCM refuses every push that carries one; collapse_key
// and notification are words of FCM's own message that its documentation
// says data must not use. The check is FCM's exact spelling, as FCM's is.
func fcmReservedDataKey(k string) bool {
	switch k {
	case "from", "message_type", "collapse_key", "notification":
		return true
	}
	return strings.HasPrefix(k, "google") || strings.HasPrefix(k, "gcm")
}
