package api

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/heraldpush/herald/db"
)

// BenchmarkReceipts measures POST /v1/receipts as the phones of one
// 25,000-device message answer it at once: 512 concurrent posters
// (b.SetParallelism(256) on 2 cores), one receipt a request, each a new
// delivered or opened receipt until every delivery has both, end to end
// through the handler, the group commit and a real PostgreSQL. It reports
// receipts a second, the receipts a write carried, and PostgreSQL's CPU a
// receipt when the cluster is a process of this host. Run it with at most
// 50000x (go test ./api -run '^$' -bench Receipts -benchtime 20000x): past
// that the receipts are replays.
func BenchmarkReceipts(b *testing.B) {
	rb := setupReceiptBench(b)
	rb.run(b, func(i int) {
		req := httptest.NewRequest(http.MethodPost, "/v1/receipts", strings.NewReader(rb.bodies[i%len(rb.bodies)]))
		req.Header.Set("Content-Type", "application/json")
		// Each phone posts from an address of its own.
		req.RemoteAddr = fmt.Sprintf("10.%d.%d.1:443", i/256%256, i%256)
		rec := httptest.NewRecorder()
		rb.srv.ServeHTTP(rec, req)
		if rec.Code != http.StatusOK {
			b.Errorf("%d %s", rec.Code, rec.Body.String())
		}
	})
}

// BenchmarkReceiptsOneTransactionEach is BenchmarkReceipts without the
// group commit: each receipt written by its own db.WriteReceipts, as a
// handler writing its own receipts would. The difference is what the
// group commit saves.
func BenchmarkReceiptsOneTransactionEach(b *testing.B) {
	rb := setupReceiptBench(b)
	rb.run(b, func(i int) {
		if _, err := db.WriteReceipts(context.Background(), rb.db.Pool, []db.ReceiptWrite{rb.writes[i%len(rb.writes)]}); err != nil {
			b.Error(err)
		}
	})
}

// receiptBench is a 25,000-device message whose deliveries are accepted,
// and a receipt of each event for each of them, as a request's body and as
// a write.
type receiptBench struct {
	*bundle
	bodies []string
	writes []db.ReceiptWrite
}

func setupReceiptBench(b *testing.B) *receiptBench {
	bb := setup(b)
	bb.segmentOf25k(b)
	status, resp := bb.do(b, http.MethodPost, "/v1/messages", messageBody(map[string]any{"type": "segment", "id": "all"}))
	require.Equal(b, http.StatusAccepted, status)
	n, ok := parsePrefixed(resp["message_id"].(string))
	require.True(b, ok)
	ctx := context.Background()
	_, err := bb.db.Pool.Exec(ctx, `
		WITH a AS (UPDATE deliveries SET status = 'accepted', attempt = 1, attempted_at = due_at,
			accepted_at = due_at + interval '10 ms' WHERE message_id = $1 RETURNING 1)
		UPDATE messages SET state = 'dispatching', accepted_count = (SELECT count(*) FROM a), pending_count = 0 WHERE id = $1`, n)
	require.NoError(b, err)
	_, err = bb.db.Pool.Exec(ctx, "ANALYZE")
	require.NoError(b, err)
	rows, err := bb.db.Pool.Query(ctx, "SELECT device_id FROM ledger WHERE message_id = $1 ORDER BY device_id", n)
	require.NoError(b, err)
	devices, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	require.NoError(b, err)
	s := bb.signer(b)
	rb := &receiptBench{bundle: bb}
	for _, event := range []string{"delivered", "opened"} {
		for _, d := range devices {
			rb.bodies = append(rb.bodies, `{"receipts":[{"token":"`+token(s, n, d)+`","event":"`+event+`"}]}`)
			rb.writes = append(rb.writes, db.ReceiptWrite{MessageID: n, DeviceID: d, Event: event})
		}
	}
	return rb
}

// run runs post(i) for receipts 0 to b.N-1 from 512 goroutines, and reports
// receipts a second, receipts a commit and PostgreSQL's CPU a receipt.
func (rb *receiptBench) run(b *testing.B, post func(i int)) {
	ctx := context.Background()
	cpu := postgresCPU(b, rb.db.Pool)
	commits := func() int64 {
		var c int64
		require.NoError(b, rb.db.Pool.QueryRow(ctx, "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()").Scan(&c))
		return c
	}
	var next atomic.Int64
	cpuBefore, commitsBefore := cpu(), commits()
	b.SetParallelism(256)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			post(int(next.Add(1) - 1))
		}
	})
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "receipts/s")
	used := cpu() - cpuBefore
	// The statistics collector lags its backends by up to a second.
	time.Sleep(1100 * time.Millisecond)
	if writes := commits() - commitsBefore; writes > 0 {
		b.ReportMetric(float64(b.N)/float64(writes), "receipts/commit")
	}
	if used > 0 {
		b.ReportMetric(float64(used.Microseconds())/float64(b.N), "pg-µs/receipt")
	}
}

// postgresCPU returns a reader of the CPU the PostgreSQL cluster behind
// pool has used (its postmaster, its live backends and those it reaped),
// in clock ticks; one that reads zero when the cluster is not a process of
// this host.
func postgresCPU(b *testing.B, pool db.DBTX) func() time.Duration {
	b.Helper()
	dir, err := db.On(pool).DataDirectory(context.Background())
	require.NoError(b, err)
	raw, err := os.ReadFile(filepath.Join(dir, "postmaster.pid"))
	if err != nil {
		return func() time.Duration { return 0 }
	}
	postmaster := strings.TrimSpace(strings.SplitN(string(raw), "\n", 2)[0])
	// stat reads a process's ppid and its own CPU, or with reaped, its
	// reaped children's too.
	stat := func(pid string, reaped bool) (string, time.Duration) {
		raw, err := os.ReadFile("/proc/" + pid + "/stat")
		if err != nil {
			return "", 0
		}
		f := strings.Fields(string(raw[strings.LastIndexByte(string(raw), ')')+2:]))
		fields := []int{11, 12}
		if reaped {
			fields = append(fields, 13, 14)
		}
		var ticks int64
		for _, i := range fields {
			v, _ := strconv.ParseInt(f[i], 10, 64)
			ticks += v
		}
		return f[1], time.Duration(ticks) * 10 * time.Millisecond
	}
	return func() time.Duration {
		_, total := stat(postmaster, true)
		entries, _ := os.ReadDir("/proc")
		for _, e := range entries {
			if ppid, used := stat(e.Name(), false); ppid == postmaster {
				total += used
			}
		}
		return total
	}
}
