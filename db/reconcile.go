package db

import (
	"context"
	"fmt"
)

// StrandedChunks counts the chunks of unsettled messages that still have
// pending deliveries and that no River job will run: their job was
// discarded or cancelled (in River UI, or after its last attempt), or
// deleted. Retried from River UI before their expiry they send what is
// pending; otherwise the reconciler expires them once their message is past
// its expiry.
//
// A chunk's deliveries are found by walking its message's part of the
// ledger, so only the chunks without a live job are looked at (the
// materialized step): during a fan-out the finished chunks of a message
// still dispatching are many, and each walk reads the whole message.
func StrandedChunks(ctx context.Context, q DBTX) (int64, error) {
	var n int64
	err := q.QueryRow(ctx, `
		WITH idle AS MATERIALIZED (
			SELECT mc.message_id, mc.chunk
			FROM message_chunks mc
			JOIN messages m ON m.id = mc.message_id
			LEFT JOIN river_job j ON j.id = mc.job_id
			WHERE m.state IN ('scheduled', 'dispatching')
			  AND (j.id IS NULL OR j.state IN ('discarded', 'cancelled'))
		)
		SELECT count(*)
		FROM idle
		WHERE EXISTS (
			SELECT 1 FROM deliveries d
			WHERE d.message_id = idle.message_id AND d.chunk = idle.chunk AND d.status = 'pending')`).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("count stranded chunks: %w", err)
	}
	return n, nil
}

// DeleteCompletedRuns deletes the completed jobs of a periodic kind. Herald's
// periodic jobs (the schedule materializer every 15 s, the reconciler) call
// it as each run starts: River keeps completed jobs for a day, and thousands
// of them a day would bury the chunk jobs in River UI's lists. A run that
// failed stays, for the operator to see.
func DeleteCompletedRuns(ctx context.Context, q DBTX, kind string) error {
	if _, err := q.Exec(ctx, `DELETE FROM river_job WHERE kind = $1 AND state = 'completed'`, kind); err != nil {
		return fmt.Errorf("delete completed %s jobs: %w", kind, err)
	}
	return nil
}
