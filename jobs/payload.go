package jobs

import (
	"fmt"
	"maps"
	"net/url"
	"slices"
	"strings"

	"github.com/heraldpush/herald/jobs/push"
)

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
		case p.ReservedDataKey(k):
			return invalid("payload.data."+k, "payload.data key %q is reserved", k)
		}
	}
	if err := checkHTTPSURL("payload.image", p.Image); err != nil {
		return err
	}
	if p.URL != "" {
		if u, err := url.Parse(p.URL); err != nil || u.Scheme == "" || len(p.URL) > maxPayloadURL {
			return invalid("payload.url", "payload.url must be an absolute URL (https://... or an app's own scheme) of at most %d bytes", maxPayloadURL)
		}
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
	if err := checkEnum("payload.interruption_level", p.InterruptionLevel, push.InterruptionLevels); err != nil {
		return err
	}
	if r := p.RelevanceScore; r != nil && (*r < 0 || *r > 1) {
		return invalid("payload.relevance_score", "payload.relevance_score must be from 0 to 1")
	}
	if err := checkAPNs(p); err != nil {
		return err
	}
	if err := checkFCM(p.FCM); err != nil {
		return err
	}
	return checkWebPush(p.WebPush)
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

func checkFCM(f *push.FCMOptions) error {
	if f == nil {
		return nil
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
