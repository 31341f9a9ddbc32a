package jobs

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestParseLanes(t *testing.T) {
	for in, want := range map[string][]string{
		"":              LaneQueues,
		" ":             LaneQueues,
		"urgent":        {QueueUrgent},
		"bulk":          {QueueBulk},
		"bulk, urgent":  {QueueUrgent, QueueBulk},
		"urgent,urgent": {QueueUrgent},
	} {
		got, err := ParseLanes(in)
		require.NoError(t, err, in)
		require.Equal(t, want, got, in)
		again, err := ParseLanes(strings.Join(got, ","))
		require.NoError(t, err)
		require.Equal(t, got, again, "the list reads back")
	}
	for _, in := range []string{"fast", "urgent,", "urgent;bulk"} {
		_, err := ParseLanes(in)
		require.Error(t, err, in)
	}
}
