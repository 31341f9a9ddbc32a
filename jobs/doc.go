// Package jobs is Herald's work: making a message and its chunk jobs, and
// River's workers that send them and keep the rest in order.
//
// # Using it from Go
//
// An application whose database is Herald's schedules a message in its own
// transaction with a Scheduler (NewScheduler, Scheduler.Schedule), from a
// Message (message.go): its Audience (audience.go), its payload, a
// push.Content that CheckPayload holds to the rules of payload.go, and when
// to send it, at an instant or at a wall time in each recipient's zone
// (LocalDelivery, localtime.go). A message that breaks a rule is an
// *InvalidError naming the field (rules.go); the answer is a Receipt.
//
// A worker process (cmd/herald's serve) builds the rest: its River clients
// (NewRiverClients, riverclient.go) over its Lanes (lanes.go), the job
// workers (Register) and the background services, each from a config whose
// zero settings take the defaults of defaults.go, the one home of every
// default: NewWaker, NewPromoter, NewStatusReporter, NewRetainer,
// NewMaterializer and NewReconciler.
//
// # A message's way through it
//
//   - Enqueuer.Create (enqueue.go), in the caller's transaction, stores the
//     message, expands its audience into the delivery ledger
//     (db.ExpandAudience) and inserts one FanOutArgs job per chunk
//     (chunk.go), each naming a range of the ledger, scheduled at its due
//     time on its priority's lane (lanes.go: the urgent and bulk queues);
//     a local-time message's chunks are cut by wave (localtime.go).
//   - The Promoter and the Waker (promote.go, wake.go) make due chunks
//     available and wake their lane at the instant, so that a chunk starts
//     on time rather than at the next poll; ahead of the instant the Waker
//     has the worker warm its first chunks (warm.go) and the provider
//     connections their devices will be sent on (warm_providers.go).
//   - FanOutWorker (fanout.go) begins a chunk in one round trip
//     (db.BeginChunk: the pending deliveries whose devices are still their
//     users', each a Target of target.go, with what their users asked of
//     the message's category), withholds what the users' preferences say
//     (withhold.go, by the rules of jobs/preferences: opted out, quiet
//     hours, the category's cap), a message's first chunk ahead of
//     the others (begin_gate.go) and an urgent chunk ahead of the
//     process's bulk work (urgent_first.go); it signs each push's receipt token
//     (push.SignReceipts, FanOutConfig.Receipts), sends through the
//     providers of jobs/push, tells each answer to its breaker (breaker.go) and hands it
//     to the process's ledger writer (ledger.go), which writes every
//     running chunk's answers in one batch and settles the message when
//     nothing of it is pending. A device the provider throttled waits in
//     the ledger for its Retry-After (throttle.go) while the rest go on.
//   - Webhooks (webhook.go, webhook_dispatch.go): the facts a caller's
//     webhook wants (a failure, an eviction, a settle, a receipt) are
//     written to an outbox in their own transactions; every worker's
//     WebhookDispatcher turns them into batch jobs (WebhookArgs) on the
//     webhooks queue, whose WebhookWorker posts them, signed by
//     jobs/webhook, with retries for a day.
//   - The Materializer (materialize.go) turns schedules' runs into messages
//     ahead of time; the Reconciler (reconcile.go) settles what no chunk
//     will; the Retainer (retention.go) deletes history past the retention;
//     the StatusReporter (status.go) publishes the breakers' states.
//
// Every device belongs to an app (jobs/apps): its credentials, stored
// sealed, and the registry each process keeps of them, whose provider
// clients a chunk sends each device's group through (Lane.Apps), the
// breakers of its app (Breakers.App).
//
// state.go holds the states and the lock order every transaction keeps;
// channel.go the channels; metrics.go, gauges.go and poolmetrics.go what a
// process exports. Nothing here imports api; cmd/herald wires it all.
package jobs
