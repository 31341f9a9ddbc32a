package db

import (
	"context"
	"fmt"
)

// EraseDevices sends nothing more to the given devices, in the caller's
// transaction, which then deletes them: it waits for messages being made
// from the directory to commit (LockDirectoryExclusive), cancels the
// devices' pending deliveries, moving their messages' counters, and removes
// the devices' tokens from the chunk jobs River holds (ScrubChunkTargets).
// The ledger keeps its settled rows, which hold no token.
func EraseDevices(ctx context.Context, q DBTX, deviceIDs []int64) error {
	qs := On(q)
	if err := qs.LockDirectoryExclusive(ctx); err != nil {
		return fmt.Errorf("wait for messages being made: %w", err)
	}
	if err := qs.CancelPendingForDevices(ctx, deviceIDs); err != nil {
		return fmt.Errorf("cancel pending deliveries: %w", err)
	}
	if _, err := ScrubChunkTargets(ctx, q, deviceIDs); err != nil {
		return err
	}
	return nil
}

// ScrubChunkTargets removes the given devices from the targets of every
// chunk job River still holds that was cut for them, whatever the job's
// state: a chunk job carries its devices' tokens (and Web Push keys), and
// River keeps finished jobs for a while (a day, a week for discarded ones)
// for an operator to inspect or retry. The jobs are found through the
// ledger (a delivery names its chunk, message_chunks the chunk's job), so
// only the jobs that hold the devices are read. It returns how many jobs
// changed.
//
// Targets are packed one device a line, its id first (jobs.Targets); the
// lines of the given devices are dropped, the rest kept in order. A job
// being worked keeps its copy in memory: what it may still send is the
// worker's concern (a cancelled delivery is never written back as sent).
func ScrubChunkTargets(ctx context.Context, q DBTX, deviceIDs []int64) (int64, error) {
	if len(deviceIDs) == 0 {
		return 0, nil
	}
	tag, err := q.Exec(ctx, `
		WITH jobs AS (
			SELECT mc.job_id
			FROM message_chunks mc
			JOIN river_job j ON j.id = mc.job_id AND j.kind = 'fan_out'
			WHERE EXISTS (
				SELECT 1 FROM deliveries d
				WHERE d.message_id = mc.message_id AND d.device_id = ANY ($1::bigint[]) AND d.chunk = mc.chunk)
		)
		UPDATE river_job j
		SET args = jsonb_set(j.args, '{targets}', to_jsonb(coalesce((
			SELECT string_agg(l.line || E'\n', '' ORDER BY l.n)
			FROM regexp_split_to_table(j.args->>'targets', E'\n') WITH ORDINALITY AS l(line, n)
			WHERE l.line <> '' AND split_part(l.line, E'\t', 1)::bigint <> ALL ($1::bigint[])
		), '')))
		FROM jobs
		WHERE j.id = jobs.job_id`, deviceIDs)
	if err != nil {
		return 0, fmt.Errorf("scrub chunk targets: %w", err)
	}
	return tag.RowsAffected(), nil
}
