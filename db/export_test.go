package db

// The ledger queries' SQL, for the plan tests.
var (
	RecordResultsSQL        = recordResults
	ChunkPendingSQL         = chunkPending
	ChunkSnapshotPendingSQL = chunkSnapshotPending
	// CancelPendingForDevicesSQL is the erasure's cancel.
	CancelPendingForDevicesSQL = cancelPendingForDevices
)
