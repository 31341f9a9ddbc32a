package api

import (
	"cmp"
	"context"
	"crypto/ecdh"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/labstack/echo/v4"

	"github.com/heraldpush/herald/db"
	"github.com/heraldpush/herald/jobs"
	"github.com/heraldpush/herald/jobs/apps"
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
	// InstallationID is the app's own id of its installation, optional: a
	// new token registered under it replaces the installation's old one in
	// place (db.Registering).
	InstallationID string `json:"installation_id"`
	// App is the name of the device's app (docs/apps.md); the default app
	// when empty, or the key's one app for a key limited to one.
	App string `json:"app"`
	// ApplicationServerKey is the VAPID public key a Web Push
	// subscription was made with, optional: which of the app's keys to
	// sign its pushes with while a rotation keeps the old one.
	ApplicationServerKey string `json:"application_server_key"`

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
type device = db.Registration

func (r *deviceRequest) validate() error { return r.check("") }

// check validates the request and fills r.norm. prefix is prepended to field
// names, so that errors in a batch name the element.
func (r *deviceRequest) check(prefix string) error {
	if err := checkID(prefix+"user_id", r.UserID); err != nil {
		return err
	}
	if r.InstallationID != "" {
		if err := checkID(prefix+"installation_id", r.InstallationID); err != nil {
			return err
		}
	}
	if r.App != "" {
		if err := apps.CheckName(r.App); err != nil {
			return invalid(prefix+"app", "app %q is not an app's name", r.App)
		}
	}
	if r.ApplicationServerKey != "" && r.Channel != jobs.ChannelWebPush {
		return invalid(prefix+"application_server_key", "application_server_key is only for channel webpush")
	}
	r.norm = device{UserID: r.UserID, Channel: r.Channel, Environment: environmentProduction, InstallationID: r.InstallationID}
	switch r.Environment {
	case "", environmentProduction:
	case environmentSandbox:
		if r.Channel != jobs.ChannelAPNs {
			return invalid(prefix+"environment", "environment sandbox is only for channel apns")
		}
		r.norm.Environment = environmentSandbox
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
			r.norm.Token = token
			return nil
		}
		r.norm.Token = r.Token
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
		r.norm.Token, r.norm.P256dh, r.norm.Auth = sub.Endpoint, p256dh, auth
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
	App         string `json:"app"`
	// VAPIDPublicKey, for Web Push, is the app's key a page subscribes
	// with: when it is not the one the subscription was made with, the
	// page should subscribe again with it (a rotation).
	VAPIDPublicKey string `json:"vapid_public_key,omitempty"`
}

func (s *Server) registerDevice(c echo.Context) error {
	req := deviceRequest{egress: s.cfg.WebPushEgress}
	if err := decode(c, smallBodyLimit, &req); err != nil {
		return err
	}
	ctx := c.Request().Context()
	ix, err := apps.ReadIndex(ctx, s.pool)
	if err != nil {
		return err
	}
	d, app, err := s.deviceApp(ctx, req, "", ix)
	if err != nil {
		return err
	}
	setAuditApp(c, app)
	rows, err := s.register(ctx, []device{d}, []device{d}, "")
	if err != nil {
		return err
	}
	row := rows[0]
	status := http.StatusOK
	if row.Created {
		status = http.StatusCreated
	}
	setAuditTarget(c, formatDeviceID(row.ID))
	resp := deviceResponse{
		DeviceID: formatDeviceID(row.ID), UserID: row.UserID, Channel: row.Channel,
		Environment: row.Environment, Status: row.Status, App: app,
	}
	if row.Channel == jobs.ChannelWebPush && s.cfg.Apps != nil {
		resp.VAPIDPublicKey, _, _ = s.cfg.Apps.WebPushKey(d.AppID)
	}
	return c.JSON(status, resp)
}

// deviceApp is the registration of req with its app: the app it names (or
// the default app, or the key's one app), which must exist and be one the
// caller may act for, and for Web Push the credential whose VAPID key the
// subscription was made with. prefix names the batch element in errors.
func (s *Server) deviceApp(ctx context.Context, req deviceRequest, prefix string, ix apps.Index) (device, string, error) {
	d := req.norm
	who := callerOf(ctx)
	name := req.App
	if name == "" {
		name = apps.DefaultName
		if len(who.apps) == 1 {
			name = ix.ByID[who.apps[0]]
		}
	}
	id, ok := ix.ByName[name]
	if !ok {
		return device{}, "", invalid(prefix+"app", "no app is named %q (GET /v1/apps lists them)", name)
	}
	if !who.mayActFor(id) {
		return device{}, "", &Error{Status: http.StatusForbidden, Code: "forbidden", Field: prefix + "app",
			Message: fmt.Sprintf("key %q may not register devices of app %q", who.key, name)}
	}
	d.AppID = id
	if d.Channel == jobs.ChannelWebPush && s.cfg.Apps != nil {
		if req.ApplicationServerKey != "" {
			cred, ok := s.cfg.Apps.WebPushCredential(id, strings.TrimRight(req.ApplicationServerKey, "="))
			if !ok {
				return device{}, "", invalid(prefix+"application_server_key", "application_server_key is not a VAPID key of app %q: subscribe with the key GET /v1/apps/%s gives", name, name)
			}
			d.CredentialID = cred
		} else {
			_, d.CredentialID, _ = s.cfg.Apps.WebPushKey(id)
		}
	}
	return d, name, nil
}

type deviceBatchResponse struct {
	Created int32 `json:"created"`
	Updated int32 `json:"updated"`
}

// registerDevices registers up to 10,000 devices in one transaction. A
// (channel, token) given twice counts once, the later one winning, as if
// the registrations had been made one after the other.
func (s *Server) registerDevices(c echo.Context) error {
	// Decoded as it arrives, a device at a time: only the normalised
	// registrations are kept.
	var inOrder []device
	ctx := c.Request().Context()
	ix, err := apps.ReadIndex(ctx, s.pool)
	if err != nil {
		return err
	}
	named := map[string]bool{}
	err = decodeArray(c, batchBodyLimit, "devices", maxBatchDevices, func(i int, raw json.RawMessage) error {
		r := deviceRequest{egress: s.cfg.WebPushEgress}
		path := fmt.Sprintf("devices[%d]", i)
		if err := decodeElement(raw, &r, path); err != nil {
			return err
		}
		if err := r.check(path + "."); err != nil {
			return err
		}
		d, app, err := s.deviceApp(ctx, r, path+".", ix)
		if err != nil {
			return err
		}
		named[app] = true
		inOrder = append(inOrder, d)
		return nil
	})
	if err != nil {
		return err
	}
	byKey := make(map[db.Key]device, len(inOrder))
	for _, d := range inOrder {
		byKey[db.Key{Channel: d.Channel, Token: d.Token}] = d
	}
	devices := make([]device, 0, len(byKey))
	for _, d := range byKey {
		devices = append(devices, d)
	}
	setAuditApp(c, strings.Join(slices.Sorted(maps.Keys(named)), ","))
	rows, err := s.register(ctx, inOrder, devices, "devices")
	if err != nil {
		return err
	}
	var res deviceBatchResponse
	for _, r := range rows {
		if r.Created {
			res.Created++
		} else {
			res.Updated++
		}
	}
	return c.JSON(http.StatusOK, res)
}

// register registers devices in one transaction: it creates their users,
// locks the users and the devices concerned, checks the users' limits of
// active devices, and writes (db.Registering). regs are the registrations
// in the order given, distinct each (channel, token) of them once; field
// names the batch's array in an error, "" for a registration alone. An
// installation given twice in one call with two tokens is refused: which
// token is its newest would be a guess.
func (s *Server) register(ctx context.Context, regs, distinct []device, field string) ([]db.RegisterDevicesRow, error) {
	installations := map[db.Key]int{}
	for i, d := range regs {
		if d.InstallationID == "" {
			continue
		}
		k := db.Key{Channel: d.Channel, Token: d.InstallationID}
		if j, ok := installations[k]; ok && regs[j].Token != d.Token {
			return nil, invalid(fmt.Sprintf("%s[%d].installation_id", field, i),
				"installation %q of channel %s is also in %s[%d] with another token", d.InstallationID, d.Channel, field, j)
		}
		installations[k] = i
	}
	// A fixed lock order keeps concurrent batches from deadlocking.
	slices.SortFunc(distinct, func(a, b device) int {
		return cmp.Or(cmp.Compare(a.Channel, b.Channel), cmp.Compare(a.Token, b.Token))
	})
	userIDs := make([]string, len(distinct))
	for i, d := range distinct {
		userIDs[i] = d.UserID
	}
	users := sortedUnique(userIDs)
	var rows []db.RegisterDevicesRow
	err := db.InTx(ctx, s.pool, func(tx pgx.Tx) error {
		q := db.On(tx)
		if err := q.EnsureUsers(ctx, users); err != nil {
			return fmt.Errorf("ensure users: %w", err)
		}
		// The users' rows stay locked to the end of the transaction, so
		// concurrent registrations for one user are checked one after
		// another and cannot pass the limit together.
		if err := q.LockUsers(ctx, users); err != nil {
			return fmt.Errorf("lock users: %w", err)
		}
		counts, err := q.ActiveDeviceCounts(ctx, users)
		if err != nil {
			return fmt.Errorf("count devices: %w", err)
		}
		reg, err := db.BeginRegistration(ctx, tx, distinct)
		if err != nil {
			return err
		}
		active := make(map[string]int, len(counts))
		for _, c := range counts {
			active[c.UserID] = int(c.Devices)
		}
		if over := firstOverLimit(regs, reg.Same, active, reg.ActiveOwners(), s.cfg.MaxDevicesPerUser); over >= 0 {
			at := ""
			if field != "" {
				at = fmt.Sprintf("%s[%d]", field, over)
			}
			return s.tooManyDevices(regs[over].UserID, at)
		}
		rows, err = reg.Write(ctx)
		return err
	})
	return rows, err
}

// firstOverLimit plays regs in order against each user's count of active
// devices and the owner of each active device, and returns the index of the
// first that takes its user past limit, or -1. same is the device a
// registration is (a new token under an installation the user has is that
// installation's device). Registering a device the user has active adds
// nothing, so it always passes; a new one, an evicted one or another
// user's adds one (and takes one from that user). It changes active and
// owner.
func firstOverLimit(regs []device, same func(device) db.Key, active map[string]int, owner map[db.Key]string, limit int) int {
	for i, d := range regs {
		k := same(d)
		prev, ok := owner[k]
		if ok && prev == d.UserID {
			continue
		}
		if ok {
			active[prev]--
		}
		owner[k] = d.UserID
		active[d.UserID]++
		if active[d.UserID] > limit {
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
	DeviceID    string `json:"device_id"`
	Channel     string `json:"channel"`
	Environment string `json:"environment"`
	Token       string `json:"token,omitempty"`
	Endpoint    string `json:"endpoint,omitempty"`
	Status      string `json:"status"`
	// App is the name of the device's app.
	App string `json:"app"`
	// InstallationID is the app's id of its installation, when a
	// registration gave one.
	InstallationID *string    `json:"installation_id"`
	EvictedReason  *string    `json:"evicted_reason"`
	EvictedAt      *time.Time `json:"evicted_at"`
	CreatedAt      time.Time  `json:"created_at"`
	UpdatedAt      time.Time  `json:"updated_at"`
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
	var rows []db.ListUserDevicesRow
	names := map[int32]string{}
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
		all, err := q.ListApps(ctx)
		for _, a := range all {
			names[a.ID] = a.Name
		}
		return err
	})
	if err != nil {
		return err
	}
	rows, next := paginate(pg, rows, func(d db.ListUserDevicesRow) int64 { return d.ID })
	resp := deviceListResponse{UserID: userID, Items: make([]deviceListItem, 0, len(rows)), NextCursor: next}
	for _, d := range rows {
		item := deviceListItem{
			DeviceID: formatDeviceID(d.ID), Channel: d.Channel, Environment: d.Environment, Status: d.Status, App: names[d.AppID],
			EvictedReason: d.EvictedReason, EvictedAt: utcPtr(d.EvictedAt), InstallationID: d.InstallationID,
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
		// Its deliveries are cancelled first, while the device is there to
		// say whose they were (db.EraseDevices).
		if err := db.EraseDevices(ctx, tx, []int64{id}); err != nil {
			return err
		}
		n, err := db.On(tx).DeleteDevice(ctx, id)
		if err != nil {
			return fmt.Errorf("delete device: %w", err)
		}
		if n == 0 {
			return notFound("device", raw)
		}
		return nil
	})
	if err != nil {
		return err
	}
	return c.NoContent(http.StatusNoContent)
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
