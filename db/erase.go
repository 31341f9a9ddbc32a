package db

import (
	"context"
	"fmt"
)

// EraseDevices sends nothing more to the given devices, in the caller's
// transaction, which then deletes them: it waits for messages being made
// from the directory to commit (LockDirectoryExclusive), cancels the
// devices' pending deliveries, moving their messages' counters. The ledger
// keeps its settled rows, which hold no token; nor do chunk jobs, which
// name a range of the ledger (FanOutArgs), so deleting the devices removes
// their tokens from everywhere Herald keeps them.
func EraseDevices(ctx context.Context, q DBTX, deviceIDs []int64) error {
	qs := On(q)
	if err := qs.LockDirectoryExclusive(ctx); err != nil {
		return fmt.Errorf("wait for messages being made: %w", err)
	}
	if err := qs.CancelPendingForDevices(ctx, deviceIDs); err != nil {
		return fmt.Errorf("cancel pending deliveries: %w", err)
	}
	return nil
}
