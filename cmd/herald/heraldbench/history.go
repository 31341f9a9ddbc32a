package heraldbench

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/heraldpush/herald/db"
)

// historyMessageDevices is the size of each settled message --history
// writes: the default bulk message's.
const historyMessageDevices = 25_000

// fillHistory writes Config.History settled ledger rows before the measured
// messages, as a year of traffic would have left them: messages of 25,000
// accepted deliveries with their chunks and payloads, spread over the last
// four weeks so that the retention keeps them all. It writes them with SQL,
// a few hundred thousand rows a second, rather than through the API.
// It returns how many ledger rows it wrote.
func (b *Benchmark) fillHistory(ctx context.Context, pool *pgxpool.Pool) (int, error) {
	total := b.Config.History
	if total <= 0 {
		return 0, nil
	}
	messages := (total + historyMessageDevices - 1) / historyMessageDevices
	b.Progress("history: %d settled ledger rows in %d messages", total, messages)
	start := time.Now()
	now, err := db.On(pool).DatabaseNow(ctx)
	if err != nil {
		return 0, err
	}
	written := 0
	step := min(time.Hour, 28*24*time.Hour/time.Duration(messages))
	for i := range messages {
		n := min(historyMessageDevices, total-i*historyMessageDevices)
		at := now.Add(-time.Duration(messages-i) * step)
		q := db.On(pool)
		payload, err := q.InsertPayload(ctx, []byte(`{"title":"Your daily digest","body":"12 new items since yesterday"}`))
		if err != nil {
			return written, fmt.Errorf("history payload: %w", err)
		}
		id, err := q.InsertHistoryMessage(ctx, db.InsertHistoryMessageParams{DispatchAt: at, Devices: int32(n), PayloadID: payload})
		if err != nil {
			return written, fmt.Errorf("history message: %w", err)
		}
		rows, err := q.InsertHistoryDeliveries(ctx, db.InsertHistoryDeliveriesParams{MessageID: id, DispatchAt: at, Devices: int32(n)})
		written += int(rows)
		if err != nil {
			return written, fmt.Errorf("history ledger: %w", err)
		}
	}
	b.Progress("history written in %.1f s", time.Since(start).Seconds())
	return written, nil
}
