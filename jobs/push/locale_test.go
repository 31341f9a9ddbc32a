package push

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestCanonicalLocale(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"de":             "de",
		"DE":             "de",
		"pt-br":          "pt-BR",
		"pt-BR":          "pt-BR",
		"zh-hant-tw":     "zh-Hant-TW",
		"es-419":         "es-419",
		"sl-rozaj":       "sl-rozaj",
		"de-CH-1996":     "de-CH-1996",
		"sr-Latn":        "sr-Latn",
		"haw":            "haw",
		"en-GB-oxendict": "en-GB-oxendict",
	} {
		got, err := CanonicalLocale(in)
		require.NoError(t, err, in)
		require.Equal(t, want, got, in)
	}
	for _, bad := range []string{
		"", "d", "deutsch", "de_AT", "de-", "-de", "de--AT", "de-AT-CH", "de-Latn-Latn",
		"de-AT-Latn", "en-x-private", "en-u-ca-gregory", "1a", "de-A1", "de-1234x6789",
		"ä", "de AT", strings.Repeat("a", 2) + strings.Repeat("-abcde", 6),
	} {
		_, err := CanonicalLocale(bad)
		require.Error(t, err, "%q", bad)
	}
}

func TestPickLocalization(t *testing.T) {
	t.Parallel()
	l := map[string]Text{"de": {Title: "Hallo"}, "pt-BR": {Title: "Olá"}, "zh-Hant": {Title: "你好"}}
	for locale, want := range map[string]string{
		"de-AT":      "de",
		"de":         "de",
		"pt-BR":      "pt-BR",
		"pt-PT":      "",
		"pt":         "",
		"zh-Hant-TW": "zh-Hant",
		"zh":         "",
		"":           "",
		"fr":         "",
	} {
		require.Equal(t, want, PickLocalization(locale, l), "locale %q", locale)
	}
	require.Empty(t, PickLocalization("de", nil))
}

func TestLocalized(t *testing.T) {
	t.Parallel()
	c := Content{
		Title: "Hello", Subtitle: "Sub", Body: "Body", Data: map[string]string{"k": "v"},
		Localizations: map[string]Text{"de": {Title: "Hallo", Body: "Text"}},
	}
	de := c.Localized("de")
	require.Equal(t, Content{Title: "Hallo", Subtitle: "Sub", Body: "Text", Data: map[string]string{"k": "v"}}, de,
		"the localization's fields replace the message's; what it leaves out is the message's own")
	own := c.Localized("")
	require.Equal(t, Content{Title: "Hello", Subtitle: "Sub", Body: "Body", Data: map[string]string{"k": "v"}}, own)
	require.Equal(t, own, c.Localized("fr"))
	require.Len(t, c.Localizations, 1, "the original keeps its localizations")
}
