package jobs

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/heraldpush/herald/jobs/push"
)

// TestCheckSizesNamesTheLocalization: a payload too large names the
// localization whose encoding is over the limit, or none for the message's
// own text.
func TestCheckSizesNamesTheLocalization(t *testing.T) {
	t.Parallel()
	c := push.Content{Title: "Hello", Localizations: map[string]push.Text{
		"de": {Title: "Hallo"},
		"fr": {Body: strings.Repeat("é", 2100)},
	}}
	err := checkSizes(c)
	var size *push.SizeError
	require.ErrorAs(t, err, &size)
	require.Equal(t, "fr", size.Locale)
	require.Contains(t, err.Error(), `"fr" localization`)

	delete(c.Localizations, "fr")
	require.NoError(t, checkSizes(c))

	// Every localization alone fits, but the message's own text does not.
	c.Body = strings.Repeat("x", 4100)
	require.ErrorAs(t, checkSizes(c), &size)
	require.Empty(t, size.Locale)
}
