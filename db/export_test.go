package db

// The ledger queries' SQL, for the plan tests.
var (
	RecordResultsSQL        = recordResults
	ChunkPendingSQL         = chunkPending
	ChunkSnapshotPendingSQL = chunkSnapshotPending
	// CancelPendingForDevicesSQL is the erasure's cancel.
	CancelPendingForDevicesSQL = cancelPendingForDevices
	// HeldDeliveriesSQL is what the API counts a message's held
	// deliveries with.
	HeldDeliveriesSQL = heldDeliveries
)
