package db

import (
	"cmp"
	"context"
	"fmt"
	"slices"
)

// Registration is one device's registration, validated: its user, channel,
// token (a Web Push subscription's endpoint), Web Push keys, APNs
// environment and, optionally, the app's installation id.
type Registration struct {
	UserID, Channel, Token, P256dh, Auth, Environment, InstallationID string
	// AppID is the device's app (0 for the default app); CredentialID, for
	// Web Push, the credential whose VAPID key the subscription was made
	// with (0 for the environment's key).
	AppID        int32
	CredentialID int64
}

// Key is a device's identity at its provider: its channel and token.
type Key struct{ Channel, Token string }

// Registering is a registration of devices under way in one transaction:
// the devices it touches are locked, so that what it decided from them
// (which device changes owner, which installation gets a new token) stays
// true until it commits.
type Registering struct {
	q    *Queries
	regs []Registration
	// byKey and byInstallation are the locked devices.
	byKey          map[Key]LockRegisteredRow
	byInstallation map[Key]LockRegisteredRow
}

// BeginRegistration locks the devices regs touch: those holding their
// tokens and those of their installations. regs holds each (channel,
// token) once, sorted, the order in which RegisterDevices writes them.
func BeginRegistration(ctx context.Context, q DBTX, regs []Registration) (*Registering, error) {
	r := &Registering{q: On(q), regs: regs, byKey: map[Key]LockRegisteredRow{}, byInstallation: map[Key]LockRegisteredRow{}}
	var p LockRegisteredParams
	for _, g := range regs {
		p.Channels = append(p.Channels, g.Channel)
		p.Tokens = append(p.Tokens, g.Token)
		if g.InstallationID != "" {
			p.InstallationChannels = append(p.InstallationChannels, g.Channel)
			p.InstallationIds = append(p.InstallationIds, g.InstallationID)
		}
	}
	rows, err := r.q.LockRegistered(ctx, p)
	if err != nil {
		return nil, fmt.Errorf("lock devices: %w", err)
	}
	for _, row := range rows {
		r.byKey[Key{row.Channel, row.Token}] = row
		if row.InstallationID != nil {
			r.byInstallation[Key{row.Channel, *row.InstallationID}] = row
		}
	}
	return r, nil
}

// Same is the key of the device reg will be once written: the device that
// holds its installation, when that one has another token (it gets reg's
// in place), else the one of reg's own token. A user's count of devices
// does not grow when a registration is the same device again.
func (r *Registering) Same(reg Registration) Key {
	if inst, ok := r.installation(reg); ok {
		return Key{inst.Channel, inst.Token}
	}
	return Key{reg.Channel, reg.Token}
}

// ActiveOwners are the users of the locked devices that are active, by key.
func (r *Registering) ActiveOwners() map[Key]string {
	out := make(map[Key]string, len(r.byKey))
	for k, row := range r.byKey {
		if row.Status == "active" {
			out[k] = row.UserID
		}
	}
	return out
}

// installation is the device holding reg's installation under another
// token, which reg's token replaces.
func (r *Registering) installation(reg Registration) (LockRegisteredRow, bool) {
	if reg.InstallationID == "" {
		return LockRegisteredRow{}, false
	}
	row, ok := r.byInstallation[Key{reg.Channel, reg.InstallationID}]
	if !ok || row.Token == reg.Token {
		return LockRegisteredRow{}, false
	}
	return row, true
}

// Write registers the devices and returns their rows, in no particular
// order. Before the upsert, an installation's device takes its new token in
// place; a device that already held that token is deleted, its pending
// deliveries cancelled as device_replaced (the installation's device gets
// the same messages). After it, the pending deliveries of every device
// that changed owner are cancelled as device_moved: the phone is someone
// else's now. A chunk checks the owner again when it sends (ChunkPending),
// which covers a message whose ledger was written while this ran.
func (r *Registering) Write(ctx context.Context) ([]RegisterDevicesRow, error) {
	var retoken RetokenDevicesParams
	var replaced, moved []int64
	// The users the moved devices leave, parallel to moved: a snapshot's
	// delivery to one of them is cancelled with its user's name.
	var formerOwners []string
	p := RegisterDevicesParams{}
	for _, g := range r.regs {
		if inst, ok := r.installation(g); ok {
			if held, ok := r.byKey[Key{g.Channel, g.Token}]; ok {
				replaced = append(replaced, held.ID)
			}
			retoken.Ids = append(retoken.Ids, inst.ID)
			retoken.Tokens = append(retoken.Tokens, g.Token)
			retoken.P256dhs = append(retoken.P256dhs, g.P256dh)
			retoken.Auths = append(retoken.Auths, g.Auth)
			if inst.UserID != g.UserID {
				moved, formerOwners = append(moved, inst.ID), append(formerOwners, inst.UserID)
			}
		} else if held, ok := r.byKey[Key{g.Channel, g.Token}]; ok && held.UserID != g.UserID {
			moved, formerOwners = append(moved, held.ID), append(formerOwners, held.UserID)
		}
		p.UserIds = append(p.UserIds, g.UserID)
		p.Channels = append(p.Channels, g.Channel)
		p.Tokens = append(p.Tokens, g.Token)
		p.P256dhs = append(p.P256dhs, g.P256dh)
		p.Auths = append(p.Auths, g.Auth)
		p.Environments = append(p.Environments, g.Environment)
		p.InstallationIds = append(p.InstallationIds, g.InstallationID)
		p.AppIds = append(p.AppIds, max(g.AppID, 1))
		p.CredentialIds = append(p.CredentialIds, g.CredentialID)
	}
	if len(replaced) > 0 || len(moved) > 0 {
		// A snapshot being written now may have read these devices as
		// they were: it commits before their deliveries are cancelled
		// (CancelPendingForDevices).
		if err := r.q.LockDirectoryExclusive(ctx); err != nil {
			return nil, fmt.Errorf("wait for messages being made: %w", err)
		}
	}
	if len(replaced) > 0 {
		slices.Sort(replaced)
		if err := r.q.CancelPendingForDevices(ctx, CancelPendingOfDevicesParams{DeviceIds: replaced, Reason: ReasonDeviceReplaced}); err != nil {
			return nil, fmt.Errorf("cancel replaced devices' deliveries: %w", err)
		}
		if _, err := r.q.DeleteDevices(ctx, replaced); err != nil {
			return nil, fmt.Errorf("delete replaced devices: %w", err)
		}
	}
	if len(retoken.Ids) > 0 {
		if err := r.q.RetokenDevices(ctx, retoken); err != nil {
			return nil, fmt.Errorf("give installations their new tokens: %w", err)
		}
	}
	rows, err := r.q.RegisterDevices(ctx, p)
	if err != nil {
		return nil, fmt.Errorf("register devices: %w", err)
	}
	if len(moved) > 0 {
		order := make([]int, len(moved))
		for i := range order {
			order[i] = i
		}
		slices.SortFunc(order, func(i, j int) int { return cmp.Compare(moved[i], moved[j]) })
		p := CancelPendingOfDevicesParams{Reason: ReasonDeviceMoved, OnlyMoved: true}
		for _, i := range order {
			p.DeviceIds, p.FormerUserIds = append(p.DeviceIds, moved[i]), append(p.FormerUserIds, formerOwners[i])
		}
		err := r.q.CancelPendingForDevices(ctx, p)
		if err != nil {
			return nil, fmt.Errorf("cancel moved devices' deliveries: %w", err)
		}
	}
	return rows, nil
}
