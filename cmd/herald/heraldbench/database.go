package heraldbench

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/heraldpush/herald/db"
	"github.com/heraldpush/herald/jobs"
	"github.com/heraldpush/herald/jobs/push"
)

// freshDatabase creates a database for this run on the server of admin.
func (b *Benchmark) freshDatabase(ctx context.Context, admin string) (string, error) {
	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		return "", fmt.Errorf("connect to DATABASE_URL: %w", err)
	}
	defer conn.Close(ctx)
	name := fmt.Sprintf("herald_bench_%d", time.Now().UnixNano())
	if err := db.CreateDatabase(ctx, conn, name); err != nil {
		return "", err
	}
	if !b.Config.KeepDB {
		b.cleanups = append(b.cleanups, func() {
			c, err := pgx.Connect(context.Background(), admin)
			if err != nil {
				return
			}
			defer c.Close(context.Background())
			_ = db.DropDatabase(context.Background(), c, name)
		})
	}
	b.Progress("database %s", name)
	return db.WithDatabase(admin, name)
}

// waitSettled polls a message's state until it settles or deadline passes.
// It reads the messages table itself: the API's view of a dispatching
// message computes its skew from the ledger, a sort of every accepted
// delivery, and polling it would add that to the CPU the bench measures.
func (b *Benchmark) waitSettled(ctx context.Context, pool *pgxpool.Pool, id string, deadline time.Time) error {
	n, ok := push.ParseMessageID(id)
	if !ok {
		return fmt.Errorf("%q is not a message id", id)
	}
	for {
		state, err := db.On(pool).MessageState(ctx, n)
		if err != nil {
			return fmt.Errorf("read message %s: %w", id, err)
		}
		if state != jobs.StateScheduled && state != jobs.StateDispatching {
			return nil
		}
		if time.Now().After(deadline) {
			if st, err := b.api.GetMessageWithResponse(ctx, id); err == nil && st.JSON200 != nil {
				return fmt.Errorf("message %s did not settle: %+v", id, st.JSON200.Deliveries)
			}
			return fmt.Errorf("message %s did not settle", id)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}
