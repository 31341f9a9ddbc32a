package jobs

import (
	"encoding/json"
	"fmt"

	"github.com/heraldpush/herald/db"
	"github.com/heraldpush/herald/jobs/apps"
)

// MaxAudienceUsers caps an explicit list of users.
const MaxAudienceUsers = 10_000

// Audience is who a message is for: a segment, or users by id; and of
// their devices, those of every app, or of the apps named.
type Audience struct {
	SegmentID string
	UserIDs   []string
	// Apps, when set, are the names of the apps whose devices the message
	// is for (jobs/apps); none means every app's.
	Apps []string
}

// MarshalJSON writes an audience as the API takes it, which is how a
// message shows it (the apps are the message's own field in the API).
func (a Audience) MarshalJSON() ([]byte, error) {
	v := map[string]any{"type": "users", "ids": a.UserIDs}
	if a.SegmentID != "" {
		v = map[string]any{"type": "segment", "id": a.SegmentID}
	}
	if len(a.Apps) > 0 {
		v["apps"] = a.Apps
	}
	return json.Marshal(v)
}

// UnmarshalJSON reads an audience as MarshalJSON writes it: how a stored
// message or schedule keeps it.
func (a *Audience) UnmarshalJSON(raw []byte) error {
	var v struct {
		ID   string   `json:"id"`
		IDs  []string `json:"ids"`
		Apps []string `json:"apps"`
	}
	if err := json.Unmarshal(raw, &v); err != nil {
		return fmt.Errorf("decode audience: %w", err)
	}
	*a = Audience{SegmentID: v.ID, UserIDs: v.IDs, Apps: v.Apps}
	return nil
}

// CheckAudience checks an audience: a segment's id, or 1 to
// MaxAudienceUsers user ids, and the shape of the apps' names (whether
// they exist is the database's to say).
func CheckAudience(a Audience) error {
	if len(a.Apps) > apps.MaxApps {
		return invalid("audience.apps", "an audience is of at most %d apps, not %d", apps.MaxApps, len(a.Apps))
	}
	for i, name := range a.Apps {
		if apps.CheckName(name) != nil {
			return invalid(fmt.Sprintf("audience.apps[%d]", i), "%q is not an app's name", name)
		}
	}
	return checkWho(a)
}

// checkWho checks an audience's segment or users.
func checkWho(a Audience) error {
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
