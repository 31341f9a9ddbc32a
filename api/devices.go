package api

import (
	"cmp"
	"context"
	"crypto/ecdh"
	"fmt"
	"net/http"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/labstack/echo/v4"

	"github.com/heraldpush/herald/db"
	"github.com/heraldpush/herald/jobs"
	"github.com/heraldpush/herald/jobs/push"
)

// maxBatchDevices caps POST /v1/devices/batch.
const maxBatchDevices = 10_000

// DefaultMaxDevicesPerUser is how many active devices one user may have:
// more than anyone's phones, tablets and browsers together, and few
// enough that no single user makes a fan-out or a device list large.
const DefaultMaxDevicesPerUser = 100

// deviceRequest is one device registration, alone or in a batch.
type deviceRequest struct {
	UserID       string               `json:"user_id"`
	Channel      string               `json:"channel"`
	Token        string               `json:"token"`
	Subscription *subscriptionRequest `json:"subscription"`
	// Environment is an APNs token's: production (the default) or sandbox,
	// for an app built for debugging.
	Environment string `json:"environment"`

	// egress is the policy a Web Push endpoint must pass, set by the
	// handler before decoding.
	egress *push.EgressPolicy
	norm   device
}

// subscriptionRequest is a Web Push subscription as a browser's
// PushSubscription.toJSON() gives it.
type subscriptionRequest struct {
	Endpoint string `json:"endpoint"`
	Keys     struct {
		P256dh string `json:"p256dh"`
		Auth   string `json:"auth"`
	} `json:"keys"`
	// ExpirationTime is accepted so that a browser's subscription can be
	// passed on as it is; push services other than the browser's own do not
	// use it.
	ExpirationTime *float64 `json:"expirationTime"`
}

// The APNs environments a device's token can be of.
const (
	environmentProduction = "production"
	environmentSandbox    = "sandbox"
)

// device is a validated, normalised registration.
type device struct {
	userID, channel, token, p256dh, auth, environment string
}

func (r *deviceRequest) validate() error { return r.check("") }

// check validates the request and fills r.norm. prefix is prepended to field
// names, so that errors in a batch name the element.
func (r *deviceRequest) check(prefix string) error {
	if err := checkID(prefix+"user_id", r.UserID); err != nil {
		return err
	}
	r.norm = device{userID: r.UserID, channel: r.Channel, environment: environmentProduction}
	switch r.Environment {
	case "", environmentProduction:
	case environmentSandbox:
		if r.Channel != jobs.ChannelAPNs {
			return invalid(prefix+"environment", "environment sandbox is only for channel apns")
		}
		r.norm.environment = environmentSandbox
	default:
		return invalid(prefix+"environment", "environment %q is not production or sandbox", r.Environment)
	}
	switch r.Channel {
	case jobs.ChannelAPNs, jobs.ChannelFCM:
		if r.Subscription != nil {
			return invalid(prefix+"subscription", "subscription is only for channel webpush; channel %s takes a token", r.Channel)
		}
		if r.Channel == jobs.ChannelAPNs {
			token, err := normalizeAPNsToken(prefix+"token", r.Token)
			if err != nil {
				return err
			}
			r.norm.token = token
			return nil
		}
		r.norm.token = r.Token
		return checkFCMToken(prefix+"token", r.Token)
	case jobs.ChannelWebPush:
		if r.Token != "" {
			return invalid(prefix+"token", "channel webpush takes a subscription, not a token")
		}
		if r.Subscription == nil {
			return invalid(prefix+"subscription", "subscription is required for channel webpush")
		}
		sub := r.Subscription
		if err := checkEndpoint(prefix+"subscription.endpoint", sub.Endpoint, r.egress); err != nil {
			return err
		}
		p256dh, raw, err := normalizeKey(prefix+"subscription.keys.p256dh", sub.Keys.P256dh, 65)
		if err != nil {
			return err
		}
		if _, err := ecdh.P256().NewPublicKey(raw); err != nil {
			return invalid(prefix+"subscription.keys.p256dh", "p256dh must be an uncompressed P-256 public key")
		}
		auth, _, err := normalizeKey(prefix+"subscription.keys.auth", sub.Keys.Auth, 16)
		if err != nil {
			return err
		}
		r.norm.token, r.norm.p256dh, r.norm.auth = sub.Endpoint, p256dh, auth
		return nil
	case "":
		return invalid(prefix+"channel", "channel is required: apns, fcm or webpush")
	default:
		return invalid(prefix+"channel", "channel %q is not one of apns, fcm, webpush", r.Channel)
	}
}

type deviceResponse struct {
	DeviceID    string `json:"device_id"`
	UserID      string `json:"user_id"`
	Channel     string `json:"channel"`
	Environment string `json:"environment"`
	Status      string `json:"status"`
}

func (s *Server) registerDevice(c echo.Context) error {
	req := deviceRequest{egress: s.cfg.WebPushEgress}
	if err := decode(c, smallBodyLimit, &req); err != nil {
		return err
	}
	ctx := c.Request().Context()
	d := req.norm
	var row db.RegisterDeviceRow
	err := db.InTx(ctx, s.pool, func(tx pgx.Tx) error {
		q := db.On(tx)
		if err := q.EnsureUsers(ctx, []string{d.userID}); err != nil {
			return fmt.Errorf("ensure user: %w", err)
		}
		over, err := s.overDeviceLimit(ctx, q, []device{d}, []device{d})
		if err != nil {
			return err
		}
		if over >= 0 {
			return s.tooManyDevices(d.userID, "")
		}
		row, err = q.RegisterDevice(ctx, db.RegisterDeviceParams{
			UserID: d.userID, Channel: d.channel, Token: d.token,
			P256dh: nullable(d.p256dh), Auth: nullable(d.auth), Environment: d.environment,
		})
		if err != nil {
			return fmt.Errorf("register device: %w", err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	status := http.StatusOK
	if row.Created {
		status = http.StatusCreated
	}
	return c.JSON(status, deviceResponse{
		DeviceID: formatDeviceID(row.ID), UserID: row.UserID, Channel: row.Channel,
		Environment: row.Environment, Status: row.Status,
	})
}

type deviceBatchRequest struct {
	Devices []deviceRequest `json:"devices"`

	egress *push.EgressPolicy
}

func (r *deviceBatchRequest) validate() error {
	if len(r.Devices) == 0 || len(r.Devices) > maxBatchDevices {
		return invalid("devices", "devices must hold 1 to %d devices, not %d", maxBatchDevices, len(r.Devices))
	}
	for i := range r.Devices {
		r.Devices[i].egress = r.egress
		if err := r.Devices[i].check(fmt.Sprintf("devices[%d].", i)); err != nil {
			return err
		}
	}
	return nil
}

type deviceBatchResponse struct {
	Created int32 `json:"created"`
	Updated int32 `json:"updated"`
}

// registerDevices registers up to 10,000 devices in one transaction of two
// statements. A (channel, token) given twice counts once, the later one
// winning, as if the registrations had been made one after the other.
func (s *Server) registerDevices(c echo.Context) error {
	req := deviceBatchRequest{egress: s.cfg.WebPushEgress}
	if err := decode(c, batchBodyLimit, &req); err != nil {
		return err
	}
	ctx := c.Request().Context()

	byKey := make(map[[2]string]device, len(req.Devices))
	for _, r := range req.Devices {
		byKey[[2]string{r.norm.channel, r.norm.token}] = r.norm
	}
	devices := make([]device, 0, len(byKey))
	for _, d := range byKey {
		devices = append(devices, d)
	}
	// A fixed lock order keeps concurrent batches from deadlocking.
	slices.SortFunc(devices, func(a, b device) int {
		return cmp.Or(cmp.Compare(a.channel, b.channel), cmp.Compare(a.token, b.token))
	})
	params := db.RegisterDevicesParams{
		UserIds:      make([]string, len(devices)),
		Channels:     make([]string, len(devices)),
		Tokens:       make([]string, len(devices)),
		P256dhs:      make([]string, len(devices)),
		Auths:        make([]string, len(devices)),
		Environments: make([]string, len(devices)),
	}
	for i, d := range devices {
		params.UserIds[i], params.Channels[i], params.Tokens[i] = d.userID, d.channel, d.token
		params.P256dhs[i], params.Auths[i], params.Environments[i] = d.p256dh, d.auth, d.environment
	}
	users := sortedUnique(params.UserIds)

	var res db.RegisterDevicesRow
	err := db.InTx(ctx, s.pool, func(tx pgx.Tx) error {
		q := db.On(tx)
		if err := q.EnsureUsers(ctx, users); err != nil {
			return fmt.Errorf("ensure users: %w", err)
		}
		inOrder := make([]device, len(req.Devices))
		for i, r := range req.Devices {
			inOrder[i] = r.norm
		}
		over, err := s.overDeviceLimit(ctx, q, inOrder, devices)
		if err != nil {
			return err
		}
		if over >= 0 {
			return s.tooManyDevices(inOrder[over].userID, fmt.Sprintf("devices[%d]", over))
		}
		if res, err = q.RegisterDevices(ctx, params); err != nil {
			return fmt.Errorf("register devices: %w", err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, deviceBatchResponse{Created: res.Created, Updated: res.Updated})
}

// overDeviceLimit locks the users of regs, then returns the index of the
// first registration in regs that, made in that order, would leave its user
// with more than the limit of active devices, or -1. distinct holds each
// (channel, token) of regs once. The user rows stay locked to the end of
// the transaction, so concurrent registrations for one user are checked
// one after another and cannot pass the limit together.
func (s *Server) overDeviceLimit(ctx context.Context, q *db.Queries, regs, distinct []device) (int, error) {
	userIDs := make([]string, len(distinct))
	params := db.ActiveDeviceOwnersParams{Channels: make([]string, len(distinct)), Tokens: make([]string, len(distinct))}
	for i, d := range distinct {
		userIDs[i], params.Channels[i], params.Tokens[i] = d.userID, d.channel, d.token
	}
	users := sortedUnique(userIDs)
	if err := q.LockUsers(ctx, users); err != nil {
		return 0, fmt.Errorf("lock users: %w", err)
	}
	counts, err := q.ActiveDeviceCounts(ctx, users)
	if err != nil {
		return 0, fmt.Errorf("count devices: %w", err)
	}
	owners, err := q.ActiveDeviceOwners(ctx, params)
	if err != nil {
		return 0, fmt.Errorf("find devices: %w", err)
	}
	active := make(map[string]int, len(counts))
	for _, c := range counts {
		active[c.UserID] = int(c.Devices)
	}
	owner := make(map[[2]string]string, len(owners))
	for _, o := range owners {
		owner[[2]string{o.Channel, o.Token}] = o.UserID
	}
	return firstOverLimit(regs, active, owner, s.cfg.MaxDevicesPerUser), nil
}

// firstOverLimit plays regs in order against each user's count of active
// devices and the owner of each active (channel, token), and returns the
// index of the first that takes its user past limit, or -1. Registering a
// device the user has active adds nothing, so it always passes; a new one,
// an evicted one or another user's adds one (and takes one from that
// user). It changes active and owner.
func firstOverLimit(regs []device, active map[string]int, owner map[[2]string]string, limit int) int {
	for i, d := range regs {
		k := [2]string{d.channel, d.token}
		prev, ok := owner[k]
		if ok && prev == d.userID {
			continue
		}
		if ok {
			active[prev]--
		}
		owner[k] = d.userID
		active[d.userID]++
		if active[d.userID] > limit {
			return i
		}
	}
	return -1
}

// tooManyDevices is the 409 of a registration that would take user past
// the limit; field names the batch element, if any.
func (s *Server) tooManyDevices(user, field string) *Error {
	msg := fmt.Sprintf("user %q may have at most %d active devices, and this would be one more: delete one (DELETE /v1/devices/{device_id}) first",
		user, s.cfg.MaxDevicesPerUser)
	if field != "" {
		msg = field + ": " + msg + "; nothing in the batch was registered"
	}
	return &Error{Status: http.StatusConflict, Code: "too_many_devices", Field: field, Message: msg}
}

type deviceListItem struct {
	DeviceID      string     `json:"device_id"`
	Channel       string     `json:"channel"`
	Environment   string     `json:"environment"`
	Token         string     `json:"token,omitempty"`
	Endpoint      string     `json:"endpoint,omitempty"`
	Status        string     `json:"status"`
	EvictedReason *string    `json:"evicted_reason"`
	EvictedAt     *time.Time `json:"evicted_at"`
	CreatedAt     time.Time  `json:"created_at"`
	UpdatedAt     time.Time  `json:"updated_at"`
}

type deviceListResponse struct {
	UserID     string           `json:"user_id"`
	Items      []deviceListItem `json:"items"`
	NextCursor *string          `json:"next_cursor"`
}

// listUserDevices pages through a user's devices in id order, with the
// same keyset cursors as the other listings.
func (s *Server) listUserDevices(c echo.Context) error {
	ctx := c.Request().Context()
	userID := c.Param("user_id")
	if checkID("user_id", userID) != nil {
		return notFound("user", userID)
	}
	pg, err := readPage(c, "devices:"+userID)
	if err != nil {
		return err
	}
	params := db.ListUserDevicesParams{UserID: userID, AfterID: pg.afterOr(0), PageSize: pg.fetch()}
	var rows []db.Device
	err = db.InTx(ctx, s.pool, func(tx pgx.Tx) error {
		q := db.On(tx)
		exists, err := q.UserExists(ctx, userID)
		if err != nil {
			return fmt.Errorf("find user: %w", err)
		}
		if !exists {
			return notFound("user", userID)
		}
		if rows, err = q.ListUserDevices(ctx, params); err != nil {
			return fmt.Errorf("list devices: %w", err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	rows, next := paginate(pg, rows, func(d db.Device) int64 { return d.ID })
	resp := deviceListResponse{UserID: userID, Items: make([]deviceListItem, 0, len(rows)), NextCursor: next}
	for _, d := range rows {
		item := deviceListItem{
			DeviceID: formatDeviceID(d.ID), Channel: d.Channel, Environment: d.Environment, Status: d.Status,
			EvictedReason: d.EvictedReason, EvictedAt: utcPtr(d.EvictedAt),
			CreatedAt: d.CreatedAt.UTC(), UpdatedAt: d.UpdatedAt.UTC(),
		}
		if d.Channel == jobs.ChannelWebPush {
			item.Endpoint = d.Token
		} else {
			item.Token = d.Token
		}
		resp.Items = append(resp.Items, item)
	}
	return c.JSON(http.StatusOK, resp)
}

// deleteDevice removes a device, cancels whatever is still pending for it
// and takes its token out of the chunk jobs River keeps; the ledger keeps
// its history.
func (s *Server) deleteDevice(c echo.Context) error {
	ctx := c.Request().Context()
	raw := c.Param("device_id")
	id, ok := parseID(devicePrefix, raw)
	if !ok {
		return notFound("device", raw)
	}
	err := db.InTx(ctx, s.pool, func(tx pgx.Tx) error {
		n, err := db.On(tx).DeleteDevice(ctx, id)
		if err != nil {
			return fmt.Errorf("delete device: %w", err)
		}
		if n == 0 {
			return notFound("device", raw)
		}
		return db.EraseDevices(ctx, tx, []int64{id})
	})
	if err != nil {
		return err
	}
	return c.NoContent(http.StatusNoContent)
}

func nullable(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

func utcPtr(t *time.Time) *time.Time {
	if t == nil {
		return nil
	}
	u := t.UTC()
	return &u
}

// sortedUnique returns the distinct values of ss in sorted order, the order
// in which rows are locked to avoid deadlocks.
func sortedUnique(ss []string) []string {
	out := slices.Clone(ss)
	slices.Sort(out)
	return slices.Compact(out)
}
