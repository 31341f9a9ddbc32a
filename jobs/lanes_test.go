package jobs

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestParseLanes(t *testing.T) {
	for in, want := range map[string]Lanes{
		"":              AllLanes,
		" ":             AllLanes,
		"urgent":        {Urgent: true},
		"bulk":          {Bulk: true},
		"bulk, urgent":  AllLanes,
		"urgent,urgent": {Urgent: true},
	} {
		got, err := ParseLanes(in)
		require.NoError(t, err, in)
		require.Equal(t, want, got, in)
		again, err := ParseLanes(got.String())
		require.NoError(t, err)
		require.Equal(t, got, again, "String reads back")
	}
	for _, in := range []string{"fast", "urgent,", "urgent;bulk"} {
		_, err := ParseLanes(in)
		require.Error(t, err, in)
	}
}
