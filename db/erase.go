package db

import (
	"context"
	"fmt"
)

// EraseDevices sends nothing more to the given devices, in the caller's
// transaction, which then deletes them (after: a delivery of a chunk's
// snapshot is cancelled with its device's user and channel, read here): it waits for messages being made
// from the directory to commit (LockDirectoryExclusive), cancels the
// devices' pending deliveries as device_deleted, moving their messages'
// counters. The ledger
// keeps its settled rows, which hold no token; nor do chunk jobs, which
// name a range of the ledger (FanOutArgs), so deleting the devices removes
// their tokens from everywhere Herald keeps them.
//
// It deletes the devices' receipts too (what their phones said of each push,
// with their clocks' readings). Receipts are written under the same lock,
// shared (WriteReceipts): those written before this erasure are committed
// when the lock is granted and deleted here, and those after it find their
// device gone and are refused.
func EraseDevices(ctx context.Context, q DBTX, deviceIDs []int64) error {
	qs := On(q)
	if err := qs.LockDirectoryExclusive(ctx); err != nil {
		return fmt.Errorf("wait for messages being made: %w", err)
	}
	if err := qs.CancelPendingForDevices(ctx, CancelPendingOfDevicesParams{DeviceIds: deviceIDs, Reason: ReasonDeviceDeleted}); err != nil {
		return fmt.Errorf("cancel pending deliveries: %w", err)
	}
	if _, err := qs.DeleteDeviceReceipts(ctx, deviceIDs); err != nil {
		return fmt.Errorf("delete receipts: %w", err)
	}
	return nil
}

// The reasons the ledger gives a delivery cancelled because of its device
// (migration 0012); one cancelled without a reason was cancelled with its
// message. ChunkPending names the first three when it finds them at send
// time.
const (
	// ReasonDeviceDeleted: the device was deleted, alone or with its user.
	ReasonDeviceDeleted = "device_deleted"
	// ReasonDeviceMoved: the device's token was registered for another
	// user.
	ReasonDeviceMoved = "device_moved"
	// ReasonDeviceEvicted: a provider called the device's token dead.
	ReasonDeviceEvicted = "device_evicted"
	// ReasonDeviceReplaced: the device's token was registered for an
	// installation whose own device took it over.
	ReasonDeviceReplaced = "device_replaced"
)

// CancelPendingForDevices cancels the devices' pending deliveries
// (CancelPendingOfDevices) once their messages are locked
// (LockMessagesOfDevices), in q's transaction.
func (q *Queries) CancelPendingForDevices(ctx context.Context, p CancelPendingOfDevicesParams) error {
	if err := q.LockMessagesOfDevices(ctx, p.DeviceIds); err != nil {
		return fmt.Errorf("lock the devices' messages: %w", err)
	}
	return q.CancelPendingOfDevices(ctx, p)
}
