package heraldbench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"

	"github.com/heraldpush/herald/jobs"
	"github.com/heraldpush/herald/jobs/push/fake"
)

// populate registers the population through the API: users u0..uN with 1
// to 5 devices each on the configured mix, all in segment "bench", and one
// more user with one APNs device for the urgent message.
func (b *Benchmark) populate(ctx context.Context) (int, error) {
	rng := rand.New(rand.NewPCG(b.Config.Seed, 0x4865))
	var devices []map[string]any
	var users []string
	var webpush int
	pick := func(weights []float64) int {
		x := rng.Float64()
		for i, w := range weights {
			if x < w {
				return i
			}
			x -= w
		}
		return len(weights) - 1
	}
	for u := range b.Config.Users {
		user := "u" + strconv.Itoa(u)
		users = append(users, user)
		for d := range pick(devicesPerUser) + 1 {
			switch pick(b.Config.Mix[:]) {
			case 0:
				devices = append(devices, map[string]any{"user_id": user, "channel": jobs.ChannelAPNs, "token": fmt.Sprintf("%056x%08x", u, d)})
			case 1:
				devices = append(devices, map[string]any{"user_id": user, "channel": jobs.ChannelFCM, "token": fmt.Sprintf("bench-%d-%d:APA91b%0140x", u, d, u)})
			default:
				devices = append(devices, map[string]any{"user_id": user, "channel": jobs.ChannelWebPush})
				webpush++
			}
		}
	}
	b.Progress("population: %d users, %d devices (%d Web Push subscriptions to mint)", len(users), len(devices), webpush)
	if err := b.mintSubscriptions(ctx, devices); err != nil {
		return 0, err
	}
	for start := 0; start < len(devices); start += 10_000 {
		if _, err := b.api(http.MethodPost, "/v1/devices/batch", map[string]any{"devices": devices[start:min(start+10_000, len(devices))]}, http.StatusOK); err != nil {
			return 0, err
		}
	}
	if _, err := b.api(http.MethodPut, "/v1/segments/bench", map[string]any{"name": "bench"}, http.StatusCreated); err != nil {
		return 0, err
	}
	for start := 0; start < len(users); start += 10_000 {
		if _, err := b.api(http.MethodPost, "/v1/segments/bench/members", map[string]any{"user_ids": users[start:min(start+10_000, len(users))]}, http.StatusOK); err != nil {
			return 0, err
		}
	}
	if _, err := b.api(http.MethodPost, "/v1/devices", map[string]any{"user_id": "urgent-user", "channel": jobs.ChannelAPNs, "token": strings.Repeat("ab", 32)}, http.StatusCreated); err != nil {
		return 0, err
	}
	return len(devices), nil
}

// mintSubscriptions fills in Web Push devices with subscriptions fakepush
// mints, as browsers would hand them out.
func (b *Benchmark) mintSubscriptions(ctx context.Context, devices []map[string]any) error {
	var todo []map[string]any
	for _, d := range devices {
		if d["channel"] == jobs.ChannelWebPush {
			todo = append(todo, d)
		}
	}
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		firstErr error
	)
	work := make(chan map[string]any)
	for range 8 {
		wg.Go(func() {
			for d := range work {
				resp, err := b.fakeHTTP.Post(b.fakeURL+"/_webpush/subscriptions", "application/json", strings.NewReader("{}"))
				var sub fake.Subscription
				if err == nil {
					err = json.NewDecoder(resp.Body).Decode(&sub)
					resp.Body.Close()
				}
				if err != nil {
					mu.Lock()
					firstErr = cmpErr(firstErr, fmt.Errorf("mint subscription: %w", err))
					mu.Unlock()
					continue
				}
				d["subscription"] = sub
			}
		})
	}
	for _, d := range todo {
		if ctx.Err() != nil {
			break
		}
		work <- d
	}
	close(work)
	wg.Wait()
	return cmpErr(firstErr, ctx.Err())
}

func cmpErr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

// api calls Herald's API and decodes the answer, which must have status.
func (b *Benchmark) api(method, path string, body any, status int) (map[string]any, error) {
	return b.apiWithKey(method, path, "", body, status)
}

// apiWithKey is api with an Idempotency-Key, unless key is empty.
func (b *Benchmark) apiWithKey(method, path, key string, body any, status int) (map[string]any, error) {
	raw, err := json.Marshal(body)
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequest(method, b.base+path, bytes.NewReader(raw))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+b.apiKey)
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	var out map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil && resp.StatusCode != http.StatusNoContent {
		return nil, fmt.Errorf("%s %s: %d, unreadable answer: %w", method, path, resp.StatusCode, err)
	}
	if resp.StatusCode != status {
		return nil, fmt.Errorf("%s %s: %d %v", method, path, resp.StatusCode, out)
	}
	return out, nil
}

func (b *Benchmark) get(path string) (map[string]any, error) {
	req, err := http.NewRequest(http.MethodGet, b.base+path, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+b.apiKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var out map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %d %v", path, resp.StatusCode, out)
	}
	return out, nil
}
