package jobs

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"log/slog"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/heraldpush/herald/db"
)

// GoScope is the idempotency key space of messages scheduled from Go code
// (Scheduler): apart from every API key's, so that a key an application
// uses in its transactions never meets one its HTTP callers send.
const GoScope = "go"

// SchedulerConfig configures a Scheduler. Its zero value suits a Herald with
// the default settings.
type SchedulerConfig struct {
	// Schema is where Herald's tables are: the HERALD_DB_SCHEMA of the
	// Herald whose workers send the messages. Default db.DefaultSchema.
	Schema string
	// ChunkSize is the devices per chunk job, as HERALD_CHUNK_SIZE.
	// Default DefaultChunkSize.
	ChunkSize int
	// Logger receives River's logs of inserts; default none.
	Logger *slog.Logger
}

// Scheduler schedules messages inside a transaction of the caller's own, for
// an application whose database is Herald's: the message, its ledger and
// its chunk jobs commit with the application's rows, or not at all. The
// running Herald workers send it once the caller commits; a rollback leaves
// no trace of it.
//
// A Scheduler holds no connections: it works only through the transactions
// it is given, which may come from any pgx connection to the database. It is
// safe for concurrent use.
type Scheduler struct {
	schema   string
	enqueuer *Enqueuer
}

// NewScheduler returns a Scheduler for the Herald that cfg describes.
func NewScheduler(cfg SchedulerConfig) (*Scheduler, error) {
	schema := cmp.Or(cfg.Schema, db.DefaultSchema)
	if err := db.CheckSchema(schema); err != nil {
		return nil, err
	}
	rcfg := RiverConfig{Logger: cmp.Or(cfg.Logger, slog.New(slog.NewTextHandler(io.Discard, nil)))}
	rcfg.setDefaults()
	rc := rcfg.base()
	rc.Schema = schema
	// Insert-only: River needs no pool for inserts in a transaction, and
	// the job kinds are worked (and checked) by Herald's own processes.
	rc.SkipUnknownJobCheck = true
	client, err := river.NewClient(riverpgxv5.New(nil), rc)
	if err != nil {
		return nil, fmt.Errorf("river client: %w", err)
	}
	return &Scheduler{schema: schema, enqueuer: NewEnqueuer(client, cfg.ChunkSize)}, nil
}

// Schedule schedules m in tx, as POST /v1/messages would: the same rules,
// the same audience expansion (the devices active in tx's view), ledger and
// chunk jobs, and the same idempotency (keys in GoScope). It answers the
// message's receipt; nothing is sent unless tx commits.
//
// A message that breaks a rule is an *InvalidError naming the field (an
// unknown segment is one too, wrapping ErrUnknownSegment); a key used with
// another message is ErrIdempotencyKeyReused. After such an error, or any
// other that PostgreSQL answered, tx is as it was before the call and still
// usable: Schedule works in a savepoint of its own, released on success and
// rolled back on failure. (A tx that had failed before the call, or whose
// connection or ctx ends during it, is not.)
//
// Herald's tables are found through search_path, which Schedule points at
// Herald's schema for its own statements only (SET LOCAL inside its
// savepoint) and puts back before it returns, so the caller's statements
// before and after resolve names exactly as they did.
func (s *Scheduler) Schedule(ctx context.Context, tx pgx.Tx, m Message) (Receipt, error) {
	var receipt Receipt
	err := pgx.BeginFunc(ctx, tx, func(sp pgx.Tx) error {
		restore, err := db.UseSchema(ctx, sp, s.schema)
		if err != nil {
			return err
		}
		if receipt, err = s.enqueuer.Schedule(ctx, sp, m, GoScope); err != nil {
			return err
		}
		return restore(ctx)
	})
	if err != nil {
		return Receipt{}, err
	}
	return receipt, nil
}
