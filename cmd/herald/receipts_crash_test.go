package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/heraldpush/herald/api/client"
	"github.com/heraldpush/herald/db/dbtest"
	"github.com/heraldpush/herald/jobs/push"
	"github.com/heraldpush/herald/jobs/receipt"
)

// TestReceiptsSurviveACrash kills an API process while phones post
// receipts to it: every receipt it answered as recorded is in the table,
// each message's counters agree with its receipts (they move in one
// transaction), and posting everything again to a new process counts each
// receipt once.
func TestReceiptsSurviveACrash(t *testing.T) {
	t.Parallel()
	const devices = 1000
	tdb := dbtest.New(t)
	vars := map[string]string{"DATABASE_URL": tdb.URL, "HERALD_API_KEYS": testAPIKey, "HERALD_LOG_LEVEL": "warn"}
	// The first process's connections are named, so that the test can
	// wait for PostgreSQL to end their work once the process is killed.
	firstVars := maps.Clone(vars)
	sep := "?"
	if strings.Contains(tdb.URL, "?") {
		sep = "&"
	}
	firstVars["DATABASE_URL"] = tdb.URL + sep + "application_name=receipts-killed"
	first := startServeProcess(t, firstVars, "--migrate", "--role", "api")
	e := &e2e{t: t, base: first.base, api: newAPIClient(t, first.base, testAPIKey)}
	var batch []client.DeviceRegistration
	users := make([]string, devices)
	for i := range devices {
		users[i] = fmt.Sprintf("u%d", i)
		batch = append(batch, client.DeviceRegistration{UserID: users[i], Channel: client.ChannelFCM, Token: new(fmt.Sprintf("fcm-token-%d", i))})
	}
	e.registerDevices(batch)
	// Due in an hour: its deliveries are pending, which a receipt may
	// already confirm.
	msg := e.send(client.NewMessage{
		DispatchAt: new(time.Now().Add(time.Hour).Truncate(time.Second)), Audience: toUsers(users...), Payload: titled("Soon"),
	}).MessageID
	id, ok := push.ParseMessageID(msg)
	require.True(t, ok)

	ctx := context.Background()
	signer, err := receipt.Shared(ctx, tdb.Pool)
	require.NoError(t, err)
	rows, err := tdb.Pool.Query(ctx, "SELECT device_id FROM ledger WHERE message_id = $1 ORDER BY device_id", id)
	require.NoError(t, err)
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	require.NoError(t, err)
	require.Len(t, ids, devices)
	type sent struct {
		device int64
		event  string
	}
	var all []sent
	for _, event := range []string{"delivered", "opened"} {
		for _, d := range ids {
			all = append(all, sent{d, event})
		}
	}
	post := func(base string, rs []sent) ([]string, error) {
		var body struct {
			Receipts []map[string]string `json:"receipts"`
		}
		for _, r := range rs {
			tok := signer.Sign(receipt.Delivery{MessageID: id, DeviceID: r.device}, time.Now().Add(time.Hour))
			body.Receipts = append(body.Receipts, map[string]string{"token": tok, "event": r.event})
		}
		raw, err := json.Marshal(body)
		require.NoError(t, err)
		resp, err := http.Post(base+"/v1/receipts", "application/json", bytes.NewReader(raw))
		if err != nil {
			return nil, err
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return nil, fmt.Errorf("status %d", resp.StatusCode)
		}
		var answer struct {
			Results []struct{ Result string } `json:"results"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&answer); err != nil {
			return nil, err
		}
		out := make([]string, len(answer.Results))
		for i, r := range answer.Results {
			out[i] = r.Result
		}
		return out, nil
	}

	killedConnections := func() int {
		var n int
		require.NoError(t, tdb.Pool.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'receipts-killed'").Scan(&n))
		return n
	}
	require.NotZero(t, killedConnections(), "the first process's connections are named")

	// 32 phones post one receipt a request; the process is killed once 300
	// are answered.
	var (
		next     atomic.Int64
		answered atomic.Int64
		mu       sync.Mutex
		recorded []sent
		problems []string
		kill     sync.Once
		wg       sync.WaitGroup
	)
	for range 32 {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= len(all) {
					return
				}
				results, err := post(first.base, all[i:i+1])
				if err != nil {
					return // the process is gone
				}
				mu.Lock()
				if len(results) == 1 && results[0] == "recorded" {
					recorded = append(recorded, all[i])
				} else {
					problems = append(problems, fmt.Sprintf("%d %s: %v", all[i].device, all[i].event, results))
				}
				mu.Unlock()
				if answered.Add(1) == 300 {
					kill.Do(func() { first.kill(t) })
				}
			}
		})
	}
	wg.Wait()
	require.Empty(t, problems)
	require.GreaterOrEqual(t, len(recorded), 300)
	require.Less(t, len(recorded), len(all), "the process was killed before the phones were done")

	// A write the process sent just before it died may still commit:
	// its backends are waited for before the table is read.
	require.Eventually(t, func() bool { return killedConnections() == 0 }, 30*time.Second, 20*time.Millisecond,
		"the killed process's connections never ended")

	// Every answered receipt is there, and the counters are the table's.
	kept := map[sent]bool{}
	rows, err = tdb.Pool.Query(ctx, "SELECT device_id, event FROM receipts WHERE message_id = $1", id)
	require.NoError(t, err)
	for rows.Next() {
		var s sent
		require.NoError(t, rows.Scan(&s.device, &s.event))
		kept[s] = true
	}
	require.NoError(t, rows.Err())
	for _, r := range recorded {
		require.True(t, kept[r], "device %d's %s receipt was answered recorded and is not in the table", r.device, r.event)
	}
	counts := func() (confirmed, opened, delivered, openedRows int) {
		require.NoError(t, tdb.Pool.QueryRow(ctx, `
			SELECT m.confirmed_count, m.opened_count,
			       (SELECT count(*) FROM receipts r WHERE r.message_id = m.id AND r.event = 'delivered'),
			       (SELECT count(*) FROM receipts r WHERE r.message_id = m.id AND r.event = 'opened')
			FROM messages m WHERE m.id = $1`, id).Scan(&confirmed, &opened, &delivered, &openedRows))
		return
	}
	confirmed, opened, delivered, openedRows := counts()
	require.Equal(t, [2]int{delivered, openedRows}, [2]int{confirmed, opened}, "the counters move with the receipts")

	// The phones try again with a new process: each receipt is counted once.
	second := startServeProcess(t, vars, "--role", "api")
	for start := 0; start < len(all); start += 100 {
		results, err := post(second.base, all[start:start+100])
		require.NoError(t, err)
		for i, r := range results {
			want := "recorded"
			if kept[all[start+i]] {
				want = "replayed"
			}
			require.Equal(t, want, r, "device %d's %s receipt", all[start+i].device, all[start+i].event)
		}
	}
	confirmed, opened, delivered, openedRows = counts()
	require.Equal(t, [4]int{devices, devices, devices, devices}, [4]int{confirmed, opened, delivered, openedRows})
}
