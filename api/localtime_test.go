package api

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestLocalTimeDelivery sends "this wall time in each recipient's zone" to
// users in Kolkata, Berlin and New York, chosen so that the time has
// already passed in Kolkata and not in the other two, under both if_passed
// policies.
func TestLocalTimeDelivery(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.population(t, "z", 4, 1)
	for user, zone := range map[string]string{"z0": "Asia/Kolkata", "z1": "Europe/Berlin", "z2": "America/New_York"} {
		status, _ := b.do(t, http.MethodPut, "/v1/users/"+user, map[string]any{"timezone": zone})
		require.Equal(t, http.StatusOK, status)
	}
	// z3 has no zone and takes the fallback, Europe/Berlin.
	berlin, err := time.LoadLocation("Europe/Berlin")
	require.NoError(t, err)
	// Two hours from now on Berlin's clocks: passed in Kolkata (4.5 to 3.5
	// hours ahead of Berlin), still to come in New York.
	wall := time.Now().In(berlin).Add(2 * time.Hour).Truncate(time.Minute)
	wallText := wall.Format("2006-01-02T15:04")

	for _, policy := range []string{"skip", "send_now"} {
		t.Run(policy, func(t *testing.T) {
			status, resp := b.do(t, http.MethodPost, "/v1/messages", map[string]any{
				"deliver_at_local":  wallText,
				"fallback_timezone": "Europe/Berlin",
				"if_passed":         policy,
				"ttl_seconds":       600,
				"audience":          map[string]any{"type": "users", "ids": []string{"z0", "z1", "z2", "z3"}},
				"payload":           map[string]any{"title": "Good morning"},
			})
			require.Equal(t, http.StatusAccepted, status, resp)
			require.EqualValues(t, 4, resp["device_count"])
			id := resp["message_id"].(string)

			_, st := b.do(t, http.MethodGet, "/v1/messages/"+id, nil)
			waves := st["waves"].([]any)
			deliveries := st["deliveries"].(map[string]any)
			wave := func(i int) (time.Time, float64) {
				w := waves[i].(map[string]any)
				at, err := time.Parse(time.RFC3339Nano, w["dispatch_at"].(string))
				require.NoError(t, err)
				return at, w["devices"].(float64)
			}
			berlinAt := time.Date(wall.Year(), wall.Month(), wall.Day(), wall.Hour(), wall.Minute(), 0, 0, berlin)
			newYork, _ := time.LoadLocation("America/New_York")
			nyAt := time.Date(wall.Year(), wall.Month(), wall.Day(), wall.Hour(), wall.Minute(), 0, 0, newYork)
			if policy == "skip" {
				require.Len(t, waves, 2)
				at, n := wave(0)
				require.True(t, at.Equal(berlinAt), "Berlin's wave at %s, got %s", berlinAt, at)
				require.Equal(t, 2, int(n), "z1 and the fallback user z3")
				at, n = wave(1)
				require.True(t, at.Equal(nyAt))
				require.Equal(t, 1, int(n))
				require.EqualValues(t, 1, deliveries["expired"], "Kolkata's time had passed")
				require.EqualValues(t, 3, deliveries["pending"])
				require.Equal(t, berlinAt.UTC().Format(time.RFC3339Nano), st["dispatch_at"], "the message's dispatch_at is its first wave")
				require.Equal(t, nyAt.Add(10*time.Minute).UTC().Format(time.RFC3339Nano), st["expires_at"], "the message lasts until its last wave expires")
				require.Equal(t, map[string]any{
					"dispatch_at": nyAt.UTC().Format(time.RFC3339Nano), "expires_at": nyAt.Add(10 * time.Minute).UTC().Format(time.RFC3339Nano),
					"devices": 1.0, "accepted": 0.0, "failed": 0.0, "expired": 0.0, "cancelled": 0.0, "pending": 1.0,
				}, waves[1], "each wave has its own expiry and progress")
				_, page := b.do(t, http.MethodGet, "/v1/messages/"+id+"/deliveries?status=expired", nil)
				require.Equal(t, "z0", page["items"].([]any)[0].(map[string]any)["user_id"])
			} else {
				require.Len(t, waves, 3)
				at, n := wave(0)
				require.WithinDuration(t, time.Now(), at, time.Minute, "Kolkata is sent now")
				require.Equal(t, 1, int(n))
				require.EqualValues(t, 0, deliveries["expired"])
				require.EqualValues(t, 4, deliveries["pending"])
			}
			// Each chunk waits for its own wave, with the wave's own expiry.
			for _, j := range b.chunkJobs(t, id) {
				require.Equal(t, j.Args.DispatchAt.Add(10*time.Minute), j.Args.ExpiresAt)
				require.True(t, j.ScheduledAt.Equal(j.Args.DispatchAt))
			}
		})
	}
}

func TestLocalTimeRejectsBadInput(t *testing.T) {
	t.Parallel()
	b := setup(t)
	base := func(extra map[string]any) map[string]any {
		m := map[string]any{
			"deliver_at_local": "2026-12-24T09:00",
			"audience":         map[string]any{"type": "users", "ids": []string{"a"}},
			"payload":          map[string]any{"title": "t"},
		}
		for k, v := range extra {
			m[k] = v
		}
		return m
	}
	cases := []struct {
		name  string
		body  map[string]any
		field string
	}{
		{"with offset", base(map[string]any{"deliver_at_local": "2026-12-24T09:00:00+01:00"}), "deliver_at_local"},
		{"not a time", base(map[string]any{"deliver_at_local": "Christmas"}), "deliver_at_local"},
		{"with dispatch_at", base(map[string]any{"dispatch_at": "2026-12-24T09:00:00Z"}), "deliver_at_local"},
		{"with expires_at", base(map[string]any{"expires_at": "2026-12-24T10:00:00Z"}), "expires_at"},
		{"bad fallback", base(map[string]any{"fallback_timezone": "Nowhere/Land"}), "fallback_timezone"},
		{"bad policy", base(map[string]any{"if_passed": "maybe"}), "if_passed"},
		{"bad ttl", base(map[string]any{"ttl_seconds": 0}), "ttl_seconds"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			requireError(t, b.call(t, request{method: http.MethodPost, path: "/v1/messages", body: tc.body}), http.StatusBadRequest, "invalid_field", tc.field)
		})
	}
	body := messageBody(map[string]any{"type": "users", "ids": []string{"a"}})
	body["if_passed"] = "skip"
	requireError(t, b.call(t, request{method: http.MethodPost, path: "/v1/messages", body: body}), http.StatusBadRequest, "invalid_field", "if_passed")
}
