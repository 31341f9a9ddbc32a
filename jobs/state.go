package jobs

// A message's states. The transitions, each made by one guarded UPDATE so
// that racing actors resolve one way:
//
//	scheduled   -> dispatching  the first chunk starts (db.StartMessage, in db.BeginChunk)
//	scheduled   -> cancelled    DELETE before any chunk started (db.CancelMessage)
//	scheduled   -> expired      the first chunk starts after expires_at, so nothing is sent
//	dispatching -> dispatched   the last pending delivery settles
//	dispatching -> expired      every delivery that was still pending expired
//
// A message with no devices is created dispatched: there is nothing to wait for.
//
// Lock order. A transaction that changes a message's row and its ledger
// while the message may still be scheduled (cancel, a chunk that expired
// before sending) locks the message row first. A chunk writing its results
// locks its deliveries first and the message row last, held only to a
// commit that does not wait for the disk: the message is dispatching then,
// so no cancel can hold the row while waiting for those deliveries. Deleting
// a device cancels its pending deliveries and then moves their messages'
// counters, in the chunks' order. A deadlock between the two orders (a
// device deleted while its scheduled message is cancelled) is detected by
// PostgreSQL and the losing transaction is retried (db.InTx).
const (
	StateScheduled   = "scheduled"
	StateDispatching = "dispatching"
	StateDispatched  = "dispatched"
	StateCancelled   = "cancelled"
	StateExpired     = "expired"
)
