package jobs

import (
	"encoding/json"
	"fmt"
)

// MaxAudienceUsers caps an explicit list of users.
const MaxAudienceUsers = 10_000

// Audience is who a message is for: a segment, or users by id.
type Audience struct {
	SegmentID string
	UserIDs   []string
}

// MarshalJSON writes an audience as the API takes it, which is how a
// message shows it.
func (a Audience) MarshalJSON() ([]byte, error) {
	if a.SegmentID != "" {
		return json.Marshal(map[string]string{"type": "segment", "id": a.SegmentID})
	}
	return json.Marshal(map[string]any{"type": "users", "ids": a.UserIDs})
}

// CheckAudience checks an audience: a segment's id, or 1 to
// MaxAudienceUsers user ids.
func CheckAudience(a Audience) error {
	if a.SegmentID != "" {
		if len(a.UserIDs) > 0 {
			return invalid("audience", "an audience is a segment or users, not both")
		}
		return CheckID("audience.id", a.SegmentID)
	}
	if len(a.UserIDs) == 0 || len(a.UserIDs) > MaxAudienceUsers {
		return invalid("audience.ids", "audience.ids must hold 1 to %d user ids, not %d", MaxAudienceUsers, len(a.UserIDs))
	}
	for i, id := range a.UserIDs {
		if err := CheckID(fmt.Sprintf("audience.ids[%d]", i), id); err != nil {
			return err
		}
	}
	return nil
}
