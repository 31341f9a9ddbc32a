package jobs

import (
	"encoding/json"
	"fmt"

	"github.com/heraldpush/herald/db"
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

// UnmarshalJSON reads an audience as MarshalJSON writes it: how a stored
// message or schedule keeps it.
func (a *Audience) UnmarshalJSON(raw []byte) error {
	var v struct {
		ID  string   `json:"id"`
		IDs []string `json:"ids"`
	}
	if err := json.Unmarshal(raw, &v); err != nil {
		return fmt.Errorf("decode audience: %w", err)
	}
	*a = Audience{SegmentID: v.ID, UserIDs: v.IDs}
	return nil
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

// storedAudience is the audience of a stored message, as its audience
// column keeps it.
func storedAudience(raw json.RawMessage) (db.Audience, error) {
	var a Audience
	if err := json.Unmarshal(raw, &a); err != nil {
		return db.Audience{}, err
	}
	return db.Audience(a), nil
}
