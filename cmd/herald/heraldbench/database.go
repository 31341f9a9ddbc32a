package heraldbench

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/heraldpush/herald/db"
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
