package jobs

// A message's states. The transitions, each made by one guarded UPDATE so
// that racing actors resolve one way:
//
//	scheduled   -> dispatching  the first chunk starts (db.StartMessage)
//	scheduled   -> cancelled    DELETE before any chunk started (db.CancelMessage)
//	scheduled   -> expired      the first chunk starts after expires_at, so nothing is sent
//	dispatching -> dispatched   the last pending delivery settles
//	dispatching -> expired      every delivery that was still pending expired
//
// A message with no devices is created dispatched: there is nothing to wait for.
const (
	StateScheduled   = "scheduled"
	StateDispatching = "dispatching"
	StateDispatched  = "dispatched"
	StateCancelled   = "cancelled"
	StateExpired     = "expired"
)
