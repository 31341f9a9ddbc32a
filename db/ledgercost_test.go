package db_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/heraldpush/herald/db"
	"github.com/heraldpush/herald/db/dbtest"
)

// TestLedgerWritesEachDeviceOnce schedules a message with its chunks'
// snapshots and writes its results as the fan-out does: every delivery's
// ledger row is written once, by its result (an insert), and none is ever
// updated; scheduling wrote no ledger row at all. (A message scheduled
// with rows, by an earlier release, wrote each twice: a pending row, then
// its update; see BenchmarkLedgerLife.)
func TestLedgerWritesEachDeviceOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tdb := dbtest.New(t)
	const devices = 2000
	lifePopulation(t, tdb.Pool, devices)
	id, _ := scheduleLifeMessage(t, tdb.Pool, devices, true)
	var rows int
	require.NoError(t, tdb.Pool.QueryRow(ctx, "SELECT count(*) FROM deliveries WHERE message_id = $1", id).Scan(&rows))
	require.Zero(t, rows, "scheduling wrote ledger rows")
	require.NoError(t, pgx.BeginFunc(ctx, tdb.Pool, func(tx pgx.Tx) error {
		at := time.Now().UnixMicro()
		for c := 0; c < devices/lifeChunkSize; c++ {
			pending, err := db.On(tx).ChunkPendingOf(ctx, db.Chunk{Snapshot: true, ChunkPendingParams: db.ChunkPendingParams{
				MessageID: id, Chunk: int32(c), FirstDevice: int64(c*lifeChunkSize + 1), LastDevice: int64((c + 1) * lifeChunkSize)}})
			require.NoError(t, err)
			require.Len(t, pending, lifeChunkSize)
			var r db.RecordResultsParams
			for i, p := range pending {
				r.Add(db.DeliveryKey{MessageID: id, DeviceID: p.DeviceID, UserID: p.UserID, Channel: p.Channel, Chunk: int32(c), DueUs: at,
					First: !p.Written},
					[]string{"accepted", "failed"}[i%2], []string{"", "unregistered"}[i%2], at, []int64{at, 0}[i%2])
			}
			if _, err := db.On(tx).RecordResults(ctx, r); err != nil {
				return err
			}
		}
		// This transaction's own counts, which need no statistics flush.
		var inserted, updated int64
		require.NoError(t, tx.QueryRow(ctx, `
			SELECT pg_stat_get_xact_tuples_inserted('deliveries'::regclass),
			       pg_stat_get_xact_tuples_updated('deliveries'::regclass)`).Scan(&inserted, &updated))
		require.EqualValues(t, devices, inserted)
		require.Zero(t, updated)
		return nil
	}))
}

// Sizes of BenchmarkLedgerLife's messages: the fan-out's defaults, 25,000
// devices in chunks of 500, and the ledger writer's grouping (the chunks
// that finish within one of its 25 ms windows share a write).
const (
	lifeDevices       = 25_000
	lifeChunkSize     = 500
	lifeChunksPerSave = 5
)

// BenchmarkLedgerLife measures what PostgreSQL spends, in CPU per device, on
// the ledger's part of a message's whole life: scheduling it (message,
// ledger rows, chunks), its chunks' starts and result writes as the fan-out
// makes them, its settling, and the VACUUM that cleans up after it, as
// autovacuum would. Messages go to the same devices one after the other on
// one database, so every message but the first finds a ledger that holds
// earlier ones. It reports the first message and the median of the later
// ones (run with -benchtime Nx for N messages, at least 2), and how many of
// the ledger's updates were HOT.
//
// It runs on an empty ledger, and on one that already holds 2,000,000
// settled deliveries: a VACUUM that finds dead index entries reads the
// whole primary key, so its cost grows with the ledger.
//
// The CPU is that of every process of the PostgreSQL cluster (its
// postmaster and every child, running or ended), so the cluster must be
// local and quiet: run it alone on the test cluster.
//
// Each runs for every way of writing the ledger: a pending row a device at
// scheduling, settled by its result (rows); a snapshot of each chunk's
// devices at scheduling, each device's row written once, by its result
// (snapshot, migration 0022); and the snapshot with each write's
// acceptances kept as one run a chunk (runs, migration 0028).
func BenchmarkLedgerLife(b *testing.B) {
	for _, ledger := range []string{"rows", "snapshot", "runs"} {
		for _, history := range []int{0, 2_000_000} {
			b.Run(fmt.Sprintf("ledger=%s/history=%d", ledger, history),
				func(b *testing.B) { benchmarkLedgerLife(b, ledger, history) })
		}
	}
}

// benchmarkLedgerLife is BenchmarkLedgerLife on a ledger that first holds
// history settled deliveries, in messages of lifeDevices, written with SQL
// and vacuumed.
func benchmarkLedgerLife(b *testing.B, ledger string, history int) {
	snapshot, withRuns := ledger != "rows", ledger == "runs"
	ctx := context.Background()
	tdb := dbtest.New(b)
	cpu := clusterCPU(b, tdb.Pool)
	lifePopulation(b, tdb.Pool, lifeDevices)
	if history > 0 {
		_, err := tdb.Pool.Exec(ctx, `
			INSERT INTO deliveries (message_id, device_id, user_id, channel, chunk, due_at, status, attempt, attempted_at, accepted_at)
			SELECT -1 - g / $2, g % $2 + 1, 'user_' || g % $2, 'apns', g % $2 / $3, now(), 'accepted', 1, now(), now()
			FROM generate_series(0, $1::integer - 1) g`, history, lifeDevices, lifeChunkSize)
		require.NoError(b, err)
		_, err = tdb.Pool.Exec(ctx, "VACUUM ANALYZE deliveries")
		require.NoError(b, err)
	}
	// The benchmark runs the cleanup itself, after each message, so that
	// its cost lands on the message that left it.
	for _, table := range []string{"deliveries", "chunk_devices", "accepted_runs", "messages", "message_chunks", "payloads"} {
		_, err := tdb.Pool.Exec(ctx, "ALTER TABLE "+table+" SET (autovacuum_enabled = false)")
		require.NoError(b, err)
	}
	type phases struct{ schedule, begin, write, cleanup time.Duration }
	var runs []phases
	b.ResetTimer()
	for range b.N {
		var p phases
		t0 := cpu()
		id, payload := scheduleLifeMessage(b, tdb.Pool, lifeDevices, snapshot)
		t1 := cpu()
		p.begin, p.write = fanOutLifeMessage(b, tdb.Pool, cpu, id, payload, lifeDevices, snapshot, withRuns)
		t2 := cpu()
		_, err := tdb.Pool.Exec(ctx, "VACUUM deliveries, chunk_devices, accepted_runs, messages, message_chunks, payloads")
		require.NoError(b, err)
		t3 := cpu()
		p.schedule, p.cleanup = t1-t0, t3-t2
		runs = append(runs, p)
	}
	b.StopTimer()
	perDevice := func(d time.Duration) float64 { return float64(d.Microseconds()) / lifeDevices }
	report := func(name string, ps []phases) {
		pick := func(f func(phases) time.Duration) float64 {
			v := make([]float64, len(ps))
			for i, p := range ps {
				v[i] = perDevice(f(p))
			}
			slices.Sort(v)
			return v[len(v)/2]
		}
		b.ReportMetric(pick(func(p phases) time.Duration { return p.schedule }), name+"_schedule_us/device")
		b.ReportMetric(pick(func(p phases) time.Duration { return p.begin }), name+"_begin_us/device")
		b.ReportMetric(pick(func(p phases) time.Duration { return p.write }), name+"_write_us/device")
		b.ReportMetric(pick(func(p phases) time.Duration { return p.cleanup }), name+"_vacuum_us/device")
		b.ReportMetric(pick(func(p phases) time.Duration { return p.schedule + p.begin + p.write + p.cleanup }), name+"_total_us/device")
	}
	report("first", runs[:1])
	if len(runs) > 1 {
		report("later", runs[1:])
	}
	for i, p := range runs {
		b.Logf("message %d: schedule %.1f, chunk starts %.1f, result writes %.1f, vacuum %.1f µs/device",
			i+1, perDevice(p.schedule), perDevice(p.begin), perDevice(p.write), perDevice(p.cleanup))
	}
	var upd, hot int64
	require.NoError(b, tdb.Pool.QueryRow(ctx, `
		SELECT pg_stat_get_tuples_updated(c.oid) + pg_stat_get_xact_tuples_updated(c.oid),
		       pg_stat_get_tuples_hot_updated(c.oid) + pg_stat_get_xact_tuples_hot_updated(c.oid)
		FROM pg_class c WHERE c.oid = 'deliveries'::regclass`).Scan(&upd, &hot))
	b.Logf("deliveries: %d updates, %d HOT", upd, hot)
}

// lifePopulation registers devices users, user_0 to user_(devices-1),
// each with one device, and the segment "life" of them all, on a fresh
// database, so that the devices' ids run from 1 to devices in user order.
func lifePopulation(tb testing.TB, pool *pgxpool.Pool, devices int) {
	_, err := pool.Exec(context.Background(), `
		WITH u AS (INSERT INTO users (id) SELECT 'user_' || g FROM generate_series(0, $1::integer - 1) g),
		d AS (INSERT INTO devices (user_id, channel, token)
		      SELECT 'user_' || g, (ARRAY['apns', 'fcm'])[g % 2 + 1], 'tok-' || g FROM generate_series(0, $1::integer - 1) g ORDER BY g),
		s AS (INSERT INTO segments (id) VALUES ('life'))
		INSERT INTO segment_members (segment_id, user_id) SELECT 'life', 'user_' || g FROM generate_series(0, $1::integer - 1) g`, devices)
	require.NoError(tb, err)
}

// scheduleLifeMessage schedules a message to segment "life" of devices
// devices (lifePopulation) as scheduling does, in one transaction, but for
// River's jobs: the payload, the message, the ledger expanded in the
// database (db.ExpandAudience: pending rows, or with snapshot the chunks'
// snapshots) and the chunks.
func scheduleLifeMessage(tb testing.TB, pool *pgxpool.Pool, devices int, snapshot bool) (id, payload int64) {
	ctx := context.Background()
	now := time.Now()
	chunks := (devices + lifeChunkSize - 1) / lifeChunkSize
	require.NoError(tb, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		q := db.On(tx)
		var err error
		if payload, err = q.InsertPayload(ctx, []byte(`{"title":"ledger life"}`)); err != nil {
			return err
		}
		msg, err := q.InsertMessage(ctx, db.InsertMessageParams{
			State: "scheduled", Priority: "bulk", DispatchAt: now, ExpiresAt: now.Add(time.Hour),
			PayloadID: payload, Audience: []byte(`{}`), RecipientCount: int32(devices),
			DeviceCount: int32(devices), ChunkCount: int32(chunks), PendingCount: int32(devices),
		})
		if err != nil {
			return err
		}
		id = msg.ID
		expanded, err := db.ExpandAudience(ctx, tx, db.Audience{SegmentID: "life"},
			db.Expansion{MessageID: id, ChunkSize: lifeChunkSize, DispatchAt: now, Snapshot: snapshot})
		if err != nil {
			return err
		}
		require.Len(tb, expanded.Chunks, chunks)
		cp := db.InsertMessageChunksParams{MessageID: id}
		for _, c := range expanded.Chunks {
			cp.Chunks = append(cp.Chunks, c.Chunk)
			cp.JobIds = append(cp.JobIds, id*1000+int64(c.Chunk))
			cp.DueAts = append(cp.DueAts, c.DueAt)
			cp.DeviceCounts = append(cp.DeviceCounts, c.Devices)
		}
		return q.InsertMessageChunks(ctx, cp)
	}))
	return id, payload
}

// fanOutLifeMessage begins every chunk of message id (to devices devices)
// and writes their results, every delivery accepted, lifeChunksPerSave
// chunks to a write, as the fan-out's workers and ledger writer do; each
// write asks to settle. It returns the cluster's CPU in the chunks' starts
// and in the writes.
func fanOutLifeMessage(b testing.TB, pool *pgxpool.Pool, cpu func() time.Duration, id, payload int64, devices int, snapshot, runs bool) (begin, write time.Duration) {
	ctx := context.Background()
	chunks := (devices + lifeChunkSize - 1) / lifeChunkSize
	for first := 0; first < chunks; first += lifeChunksPerSave {
		w := db.ChunkWrite{MessageID: id, Settle: true}
		t0 := cpu()
		for c := first; c < min(first+lifeChunksPerSave, chunks); c++ {
			// lifePopulation's devices are 1 to devices, cut in order.
			chunk := db.ChunkPendingParams{MessageID: id, Chunk: int32(c),
				FirstDevice: int64(c*lifeChunkSize + 1), LastDevice: int64(min((c+1)*lifeChunkSize, devices))}
			var withPayload int64
			if c == 0 {
				withPayload = payload
			}
			start := time.Now()
			begun, err := db.BeginChunk(ctx, pool, db.Chunk{ChunkPendingParams: chunk, Snapshot: snapshot}, withPayload)
			require.NoError(b, err)
			require.Equal(b, "dispatching", begun.State)
			require.Len(b, begun.Pending, int(chunk.LastDevice-chunk.FirstDevice+1))
			at := time.Now()
			if runs {
				if w.Executions == nil {
					w.Executions = map[int32]int64{}
				}
				w.Executions[int32(c)] = int64(c) + 1
			}
			w.Chunks = append(w.Chunks, db.RecordChunkParams{
				MessageID: id, Chunk: int32(c), StartedAt: &start, FirstAcceptedAt: &at, LastAcceptedAt: &at, FinishedAt: &at,
			})
			for _, p := range begun.Pending {
				w.Results.Add(db.DeliveryKey{MessageID: id, DeviceID: p.DeviceID, UserID: p.UserID, Channel: p.Channel,
					Chunk: int32(c), DueUs: start.UnixMicro(), First: !p.Written}, "accepted", "", at.UnixMicro(), at.UnixMicro())
			}
		}
		t1 := cpu()
		_, err := db.WriteChunks(ctx, pool, []db.ChunkWrite{w})
		require.NoError(b, err)
		t2 := cpu()
		begin, write = begin+t1-t0, write+t2-t1
	}
	var state string
	require.NoError(b, pool.QueryRow(ctx, "SELECT state FROM messages WHERE id = $1", id).Scan(&state))
	require.Equal(b, "dispatched", state)
	return begin, write
}

// clusterCPU returns a reader of the CPU that the PostgreSQL cluster behind
// pool has used so far: its postmaster's and every child's, running or
// reaped. The benchmark is skipped when the cluster is not a readable
// process of this host.
func clusterCPU(b *testing.B, pool *pgxpool.Pool) func() time.Duration {
	var dir string
	require.NoError(b, pool.QueryRow(context.Background(), "SHOW data_directory").Scan(&dir))
	raw, err := os.ReadFile(filepath.Join(dir, "postmaster.pid"))
	if err != nil {
		b.Skipf("the cluster's processes cannot be read: %v", err)
	}
	pm, err := strconv.Atoi(strings.TrimSpace(strings.SplitN(string(raw), "\n", 2)[0]))
	require.NoError(b, err)
	return func() time.Duration {
		_, own, reaped, err := procCPU(pm)
		require.NoError(b, err)
		total := own + reaped
		entries, err := os.ReadDir("/proc")
		require.NoError(b, err)
		for _, e := range entries {
			pid, err := strconv.Atoi(e.Name())
			if err != nil {
				continue
			}
			// A child that ends between the listing and the read moves to
			// the postmaster's reaped children: the next reading has it.
			if ppid, own, _, err := procCPU(pid); err == nil && ppid == pm {
				total += own
			}
		}
		return total
	}
}

// procCPU reads a process's parent, its CPU and that of the children it
// reaped from /proc/PID/stat (in clock ticks of 10 ms).
func procCPU(pid int) (ppid int, own, reaped time.Duration, err error) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, 0, 0, err
	}
	f := strings.Fields(string(raw[bytes.LastIndexByte(raw, ')')+2:]))
	n := func(i int) int64 { v, _ := strconv.ParseInt(f[i], 10, 64); return v }
	const tick = 10 * time.Millisecond
	return int(n(1)), time.Duration(n(11)+n(12)) * tick, time.Duration(n(13)+n(14)) * tick, nil
}
