package db

import (
	"context"
	"fmt"
)

// StrandedChunks counts the chunks of unsettled messages that still have
// pending deliveries and that no River job will run: their job was
// discarded or cancelled (in River UI, or after its last attempt), deleted,
// or completed with deliveries left pending. Retried from River UI before
// their expiry they send what is pending; otherwise the reconciler expires
// them once their message is past its expiry.
func StrandedChunks(ctx context.Context, q DBTX) (int64, error) {
	var n int64
	err := q.QueryRow(ctx, `
		SELECT count(*)
		FROM message_chunks mc
		JOIN messages m ON m.id = mc.message_id
		WHERE m.state IN ('scheduled', 'dispatching')
		  AND NOT EXISTS (
			SELECT 1 FROM river_job j
			WHERE j.id = mc.job_id AND j.state IN ('available', 'pending', 'running', 'retryable', 'scheduled'))
		  AND EXISTS (
			SELECT 1 FROM deliveries d
			WHERE d.message_id = mc.message_id AND d.chunk = mc.chunk AND d.status = 'pending')`).Scan(&n)
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
