// Package jobs is Herald's work: making a message and its chunk jobs, and
// River's workers that send them and keep the rest in order.
//
// A message's way through it:
//
//   - Enqueuer.Create (enqueue.go), in the caller's transaction, stores the
//     message, expands its audience into the delivery ledger
//     (db.ExpandAudience) and inserts one FanOutArgs job per chunk, each
//     naming a range of the ledger, scheduled at its due time on its
//     priority's lane (lanes.go: the urgent and bulk queues).
//   - The Promoter and the Waker (promote.go, wake.go) make due chunks
//     available and wake their lane at the instant, so that a chunk starts
//     on time rather than at the next poll.
//   - FanOutWorker (fanout.go) begins a chunk in one round trip
//     (db.BeginChunk: the pending deliveries whose devices are still their
//     users'), sends through the providers of jobs/push, tells each answer
//     to its breaker (breaker.go) and hands it to the process's ledger
//     writer (ledger.go), which writes every running chunk's answers in one
//     batch and settles the message when nothing of it is pending.
//   - The Materializer (materialize.go) turns schedules' runs into messages
//     ahead of time; the Reconciler (reconcile.go) settles what no chunk
//     will; the Retainer (retention.go) deletes history past the retention.
//
// state.go holds the states and the lock order every transaction keeps;
// defaults.go the defaults; metrics.go, gauges.go and poolmetrics.go what
// a process exports. Nothing here imports api; cmd/herald wires it all.
package jobs
