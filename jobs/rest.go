package jobs

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"

	"github.com/heraldpush/herald/db"
)

// A message sent now is written in two transactions when Herald owns them
// (Submit, which POST /v1/messages calls): the first commits the message
// with its first chunk alone, its ledger rows and its job, so that the
// chunk's pushes start at once; the second writes the rest of the
// audience. A 25,000-device ledger takes longer to write than a push takes
// to send, and a message sent now would otherwise wait for all of it.
//
// Between the two, messages.rest_after says the rest is still to be
// written (migration 0020) and the message cannot settle. Whatever acts on
// the whole of a message has the rest written first (writeRest, under a
// lock of the message's own): the second transaction, a cancel, an
// idempotent retry, and, should the request die in between, a backstop
// job and the reconciler. The rest is read from the directory when it is
// written, after the first chunk's last device: the audience is the
// directory's in the instant the rest was written, as it is the instant
// the one transaction was for any other message.

// restRetryFor is how long Submit tries to write a rest whose transaction
// failed before it answers an error (the backstop writes it then).
const restRetryFor = 30 * time.Second

// Submit schedules m as Schedule does, in transactions of its own on pool:
// what POST /v1/messages does. A message due now to more devices than its
// first chunk holds is written in two (see above). The answer waits for
// both, so its counts are the whole audience's; a request that fails
// before the first commits has sent nothing, and once it has committed
// the request does not fail unless the rest cannot be written within
// restRetryFor (the database gone): the backstop job writes it then.
func (e *Enqueuer) Submit(ctx context.Context, pool *pgxpool.Pool, m Message, scope string) (Receipt, error) {
	var (
		receipt Receipt
		rest    *restJob
	)
	err := db.InTx(ctx, pool, func(tx pgx.Tx) error {
		var err error
		receipt, rest, err = e.schedule(ctx, tx, m, scope, true)
		return err
	})
	if err != nil || rest == nil {
		return receipt, err
	}
	msg, err := e.finishRest(ctx, pool, *rest)
	if err != nil {
		return Receipt{}, err
	}
	return receipt.counted(msg), nil
}

// finishRest writes rest's message's rest in a transaction of its own,
// and deletes the backstop job with it. A failed transaction is tried
// again, backing off, for up to restRetryFor.
func (e *Enqueuer) finishRest(ctx context.Context, pool *pgxpool.Pool, rest restJob) (db.Message, error) {
	var msg db.Message
	deadline := time.Now().Add(restRetryFor)
	for wait := 10 * time.Millisecond; ; wait = min(2*wait, time.Second) {
		err := db.InTx(ctx, pool, func(tx pgx.Tx) error {
			var err error
			if msg, err = e.writeRest(ctx, tx, rest.messageID); err != nil {
				return err
			}
			// The backstop has nothing left to do. It runs only once
			// restBackstop has passed, and then waits for the lock this
			// transaction holds: found running, it is left to find the
			// rest written.
			if _, err := e.client.JobDeleteTx(ctx, tx, rest.backstopID); err != nil &&
				!errors.Is(err, rivertype.ErrJobRunning) && !errors.Is(err, river.ErrNotFound) {
				return fmt.Errorf("delete the backstop job: %w", err)
			}
			return nil
		})
		if err == nil || ctx.Err() != nil || time.Now().Add(wait).After(deadline) {
			return msg, err
		}
		time.Sleep(wait)
	}
}

// RestWorker works the backstop jobs.
type RestWorker struct {
	river.WorkerDefaults[RestArgs]
	pool      *pgxpool.Pool
	chunkSize int
}

// Work writes the rest of the job's message if its request did not.
func (w *RestWorker) Work(ctx context.Context, job *river.Job[RestArgs]) error {
	return completeRest(ctx, w.pool, NewEnqueuer(river.ClientFromContext[pgx.Tx](ctx), w.chunkSize), job.Args.MessageID)
}

// completeRest writes message id's rest in a transaction of its own.
func completeRest(ctx context.Context, pool *pgxpool.Pool, e *Enqueuer, id int64) error {
	return db.InTx(ctx, pool, func(tx pgx.Tx) error {
		_, err := e.writeRest(ctx, tx, id)
		if errors.Is(err, db.ErrNotFound) {
			return nil // Deleted since (retention): nothing left to write.
		}
		return err
	})
}
