package db

// The ledger queries' SQL, for the plan tests.
var (
	RecordResultsSQL        = recordResults
	ChunkPendingSQL         = chunkPending
	ChunkSnapshotPendingSQL = chunkSnapshotPending
	// CancelPendingForDevicesSQL is the erasure's cancel.
	CancelPendingForDevicesSQL = cancelPendingOfDevices
	// HeldDeliveriesSQL is what the API counts a message's held
	// deliveries with.
	HeldDeliveriesSQL = heldDeliveries
)

// SkewBucket is db.WriteChunks' own count of a skew's histogram bucket.
var SkewBucket = skewBucket

// ExpandGeneral is ExpandAudience's general statement, which a plain
// message's expansion (expandSnapshot) must agree with.
var ExpandGeneral = expand

// SettleMessageSQL is the settle every chunk runs.
var SettleMessageSQL = settleMessage

// Interpret is how the package's queries interpret a driver error.
var Interpret = interpretError
