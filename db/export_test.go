package db

// The ledger queries' SQL, for the plan tests.
var (
	RecordResultsSQL = recordResults
	ChunkPendingSQL  = chunkPending
)
