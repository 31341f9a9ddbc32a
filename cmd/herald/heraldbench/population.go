package heraldbench

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/heraldpush/herald/api/client"
	"github.com/heraldpush/herald/db"
	"github.com/heraldpush/herald/jobs/push/fake"
)

// segment is the name of the segment of bulk message i: users
// i*Users .. (i+1)*Users-1.
func segment(i int) string { return "bench-" + strconv.Itoa(i) }

// populate registers the population (Config.Populate says how): users
// u0..uN with 1 to 5 devices each on the configured mix, Users of them in
// each bulk message's segment, and one more user with one APNs device for
// the urgent message, registered through the API. dbURL is the bench's
// database.
func (b *Benchmark) populate(ctx context.Context, dbURL string) (int, error) {
	rng := rand.New(rand.NewPCG(b.Config.Seed, 0x4865))
	var devices []client.DeviceRegistration
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
	for u := range b.Config.Users * b.Config.messages() {
		user := "u" + strconv.Itoa(u)
		users = append(users, user)
		first := len(devices)
		for d := range pick(devicesPerUser) + 1 {
			switch pick(b.Config.Mix[:]) {
			case 0:
				devices = append(devices, client.DeviceRegistration{UserID: user, Channel: client.ChannelAPNs, Token: new(fmt.Sprintf("%056x%08x", u, d))})
			case 1:
				devices = append(devices, client.DeviceRegistration{UserID: user, Channel: client.ChannelFCM, Token: new(fmt.Sprintf("bench-%d-%d:APA91b%0140x", u, d, u))})
			default:
				devices = append(devices, client.DeviceRegistration{UserID: user, Channel: client.ChannelWebPush})
				webpush++
			}
		}
		if a := b.appOf(u); a != nil {
			for i := first; i < len(devices); i++ {
				devices[i].App = &a.Name
			}
		}
	}
	if err := b.declareAppTokens(devices); err != nil {
		return 0, err
	}
	b.Progress("population: %d users, %d devices (%d Web Push subscriptions to mint)", len(users), len(devices), webpush)
	start := time.Now()
	if err := b.mintSubscriptions(ctx, devices); err != nil {
		return 0, err
	}
	b.Progress("population: %d Web Push subscriptions minted in %.1f s", webpush, time.Since(start).Seconds())
	register := b.registerThroughAPI
	if b.Config.Populate == "db" {
		register = func(ctx context.Context, devices []client.DeviceRegistration, users []string) error {
			return b.registerInDatabase(ctx, dbURL, devices, users)
		}
	}
	if err := register(ctx, devices, users); err != nil {
		return 0, err
	}
	urgent, err := b.api.RegisterDeviceWithResponse(ctx, client.DeviceRegistration{UserID: "urgent-user", Channel: client.ChannelAPNs, Token: new(strings.Repeat("ab", 32))})
	if err := answered("register the urgent device", http.StatusCreated, urgent, err); err != nil {
		return 0, err
	}
	return len(devices), nil
}

// registerThroughAPI registers devices and makes the bulk messages'
// segments, users of Config.Users each, in batches of 10,000 through the
// API.
func (b *Benchmark) registerThroughAPI(ctx context.Context, devices []client.DeviceRegistration, users []string) error {
	for start := 0; start < len(devices); start += 10_000 {
		res, err := b.api.RegisterDevicesWithResponse(ctx, client.DeviceBatch{Devices: devices[start:min(start+10_000, len(devices))]})
		if err := answered("register devices", http.StatusOK, res, err); err != nil {
			return err
		}
	}
	for i := range b.Config.messages() {
		name, members := segment(i), users[i*b.Config.Users:(i+1)*b.Config.Users]
		seg, err := b.api.CreateSegmentWithResponse(ctx, name, client.SegmentUpdate{Name: new(name)})
		if err := answered("create segment", http.StatusCreated, seg, err); err != nil {
			return err
		}
		for start := 0; start < len(members); start += 10_000 {
			res, err := b.api.AddSegmentMembersWithResponse(ctx, name, client.MemberIDs{UserIDs: members[start:min(start+10_000, len(members))]})
			if err := answered("add segment members", http.StatusOK, res, err); err != nil {
				return err
			}
		}
	}
	return nil
}

// registerInDatabase is registerThroughAPI's work done with the statements
// the API's batches run (its users, its devices, its segment members), on
// the database directly, in batches of 10,000 devices: the population is
// new, so no device changes owner or installation and no user's limit of
// devices is reached, and the API's locks and checks have nothing to
// decide. The devices are as the API normalises them: the bench makes
// APNs tokens in lower-case hex and fakepush Web Push keys in base64url.
func (b *Benchmark) registerInDatabase(ctx context.Context, dbURL string, devices []client.DeviceRegistration, users []string) error {
	pool, err := db.Open(ctx, dbURL, db.PoolConfig{MaxConns: 1})
	if err != nil {
		return err
	}
	defer pool.Close()
	q := db.On(pool)
	sorted := slices.Clone(users)
	slices.Sort(sorted)
	for start := 0; start < len(sorted); start += 10_000 {
		if err := q.EnsureUsers(ctx, sorted[start:min(start+10_000, len(sorted))]); err != nil {
			return fmt.Errorf("users: %w", err)
		}
	}
	for start := 0; start < len(devices); start += 10_000 {
		var p db.RegisterDevicesParams
		for _, d := range devices[start:min(start+10_000, len(devices))] {
			var token, p256dh, auth string
			if d.Subscription != nil {
				token, p256dh, auth = d.Subscription.Endpoint, d.Subscription.Keys.P256DH, d.Subscription.Keys.Auth
			} else {
				token = *d.Token
			}
			p.UserIds = append(p.UserIds, d.UserID)
			p.Channels = append(p.Channels, string(d.Channel))
			p.Tokens = append(p.Tokens, token)
			p.P256dhs = append(p.P256dhs, p256dh)
			p.Auths = append(p.Auths, auth)
		}
		if _, err := q.RegisterDevices(ctx, p); err != nil {
			return fmt.Errorf("devices: %w", err)
		}
	}
	for i := range b.Config.messages() {
		name, members := segment(i), users[i*b.Config.Users:(i+1)*b.Config.Users]
		if _, err := q.UpsertSegment(ctx, db.UpsertSegmentParams{ID: name, Name: name}); err != nil {
			return fmt.Errorf("segment: %w", err)
		}
		for start := 0; start < len(members); start += 10_000 {
			if _, err := q.AddSegmentMembers(ctx, db.AddSegmentMembersParams{SegmentID: name, UserIds: members[start:min(start+10_000, len(members))]}); err != nil {
				return fmt.Errorf("segment members: %w", err)
			}
		}
	}
	return nil
}

// mintSubscriptions fills in Web Push devices with subscriptions fakepush
// mints, as browsers would hand them out.
func (b *Benchmark) mintSubscriptions(ctx context.Context, devices []client.DeviceRegistration) error {
	var todo []*client.DeviceRegistration
	for i := range devices {
		if devices[i].Channel == client.ChannelWebPush {
			todo = append(todo, &devices[i])
		}
	}
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		firstErr error
	)
	work := make(chan *client.DeviceRegistration)
	for range 8 {
		wg.Go(func() {
			for d := range work {
				// A subscription made with its app's VAPID key, as the
				// app's page would.
				body := "{}"
				for _, a := range b.fakeApps {
					if d.App != nil && *d.App == a.Name {
						body = `{"application_server_key":"` + a.WebPush.PublicKey + `"}`
					}
				}
				resp, err := b.fakeHTTP.Post(b.fakeURL+"/_webpush/subscriptions", "application/json", strings.NewReader(body))
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
				d.Subscription = &client.WebPushSubscription{
					Endpoint: sub.Endpoint, Keys: client.WebPushKeys{P256DH: sub.Keys.P256dh, Auth: sub.Keys.Auth},
				}
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

// answered returns an error unless a call to Herald's API (what) reached it
// and was answered status.
func answered(what string, status int, res interface{ StatusCode() int }, err error) error {
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	if res.StatusCode() != status {
		body := ""
		if b, ok := res.(interface{ GetBody() []byte }); ok {
			body = string(b.GetBody())
		}
		return fmt.Errorf("%s: answered %d, not %d: %s", what, res.StatusCode(), status, body)
	}
	return nil
}
