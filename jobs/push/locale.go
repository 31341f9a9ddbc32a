package push

import (
	"errors"
	"strings"
)

// Text is a message's text in one language: what a localization replaces.
// A field it leaves empty keeps the message's own.
type Text struct {
	Title    string `json:"title,omitempty"`
	Subtitle string `json:"subtitle,omitempty"`
	Body     string `json:"body,omitempty"`
}

// MaxLocaleLen bounds a locale tag: the longest BCP 47 tag of a language,
// a script, a region and two variants is well within it.
const MaxLocaleLen = 35

// CanonicalLocale checks that tag is a BCP 47 language tag of the forms
// messages are written for (language, then optionally a script, a region
// and variants: "de", "pt-BR", "zh-Hant-TW", "sl-rozaj") and returns it in
// the canonical case BCP 47 recommends ("pt-br" -> "pt-BR",
// "zh-hant" -> "zh-Hant"), so that tags compare as strings. Extensions and
// private-use subtags are refused: no message is written for them.
func CanonicalLocale(tag string) (string, error) {
	if tag == "" {
		return "", errors.New("a locale must not be empty")
	}
	if len(tag) > MaxLocaleLen {
		return "", errors.New("a locale is at most 35 characters")
	}
	parts := strings.Split(tag, "-")
	lang := parts[0]
	if !isAlpha(lang) || (len(lang) != 2 && len(lang) != 3) {
		return "", errors.New("a locale starts with a two- or three-letter language code, such as de or pt-BR")
	}
	out := make([]string, 0, len(parts))
	out = append(out, strings.ToLower(lang))
	// Each part may come only after the ones before it: script, region,
	// then variants.
	const (
		afterLanguage = iota
		afterScript
		afterRegion
	)
	stage := afterLanguage
	for _, p := range parts[1:] {
		switch {
		case stage == afterLanguage && len(p) == 4 && isAlpha(p):
			out = append(out, strings.ToUpper(p[:1])+strings.ToLower(p[1:]))
			stage = afterScript
		case stage < afterRegion && (len(p) == 2 && isAlpha(p) || len(p) == 3 && isDigits(p)):
			out = append(out, strings.ToUpper(p))
			stage = afterRegion
		case isVariant(p):
			out = append(out, strings.ToLower(p))
			stage = afterRegion
		default:
			return "", errors.New("a locale is a BCP 47 tag: a language, then optionally a four-letter script, a region of two letters or three digits, and variants, such as de, pt-BR or zh-Hant-TW")
		}
	}
	return strings.Join(out, "-"), nil
}

// PickLocalization returns the key of the localization a user with locale
// (canonical, or empty) gets: the whole tag if it is a key, else the tag cut
// short one subtag at a time ("de-AT" -> "de"), else "", the message's own
// text.
func PickLocalization(locale string, localizations map[string]Text) string {
	if len(localizations) == 0 {
		return ""
	}
	for tag := locale; tag != ""; {
		if _, ok := localizations[tag]; ok {
			return tag
		}
		i := strings.LastIndexByte(tag, '-')
		if i < 0 {
			break
		}
		tag = tag[:i]
	}
	return ""
}

// Localized returns c in the localization key: its title, subtitle and body
// in place of c's (each one it gives), without the other localizations. The
// empty key, or one c does not have, is c's own text.
func (c Content) Localized(key string) Content {
	t, ok := c.Localizations[key]
	c.Localizations = nil
	if !ok {
		return c
	}
	if t.Title != "" {
		c.Title = t.Title
	}
	if t.Subtitle != "" {
		c.Subtitle = t.Subtitle
	}
	if t.Body != "" {
		c.Body = t.Body
	}
	return c
}

func isAlpha(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i] | 0x20; c < 'a' || c > 'z' {
			return false
		}
	}
	return s != ""
}

func isDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return s != ""
}

// isVariant reports whether s is a BCP 47 variant subtag: five to eight
// letters and digits, or four starting with a digit.
func isVariant(s string) bool {
	if len(s) < 4 || len(s) > 8 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= '0' && c <= '9' || c|0x20 >= 'a' && c|0x20 <= 'z') {
			return false
		}
	}
	return len(s) >= 5 || s[0] >= '0' && s[0] <= '9'
}
