package db

// The ledger queries' SQL, for the plan tests.
var (
	RecordResultsSQL = recordResults
	ChunkPendingSQL  = chunkPending
	// CancelPendingForDevicesSQL is the erasure's cancel.
	CancelPendingForDevicesSQL = cancelPendingForDevices
)
