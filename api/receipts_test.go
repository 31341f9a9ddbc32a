package api

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/heraldpush/herald/db"
	"github.com/heraldpush/herald/jobs/receipt"
)

// signer signs receipt tokens as the workers do: under the key every
// process shares, which the server read in Refresh.
func (b *bundle) signer(t testing.TB) *receipt.Signer {
	t.Helper()
	s, err := receipt.Shared(context.Background(), b.db.Pool)
	require.NoError(t, err)
	return s
}

// token is a day-long receipt token for device's delivery of message.
func token(s *receipt.Signer, message, device int64) string {
	return s.Sign(receipt.Delivery{MessageID: message, DeviceID: device}, time.Now().Add(24*time.Hour))
}

// postReceipts posts receipts without an API key, as an app does.
func (b *bundle) postReceipts(t testing.TB, receipts ...map[string]any) (int, map[string]any) {
	t.Helper()
	rec := b.call(t, request{method: http.MethodPost, path: "/v1/receipts", body: map[string]any{"receipts": receipts}, noAuth: true})
	return rec.Code, decodeBody(t, rec)
}

func delivered(tok string) map[string]any { return map[string]any{"token": tok, "event": "delivered"} }

// results reads an answer's per-receipt results, from a 200 or a 401.
func results(t testing.TB, body map[string]any) []string {
	t.Helper()
	raw, ok := body["results"].([]any)
	if !ok {
		raw = body["error"].(map[string]any)["results"].([]any)
	}
	out := make([]string, len(raw))
	for i, r := range raw {
		out[i] = r.(map[string]any)["result"].(string)
	}
	return out
}

// acceptAll writes the message's deliveries as accepted at their due
// instant plus 10 ms, as a chunk's ledger write does.
func acceptAll(t testing.TB, b *bundle, n int64, ledger []ledgerRow) {
	t.Helper()
	var r db.RecordResultsParams
	for _, d := range ledger {
		addResult(&r, n, d, "accepted", "", d.DueAt.Add(10*time.Millisecond))
	}
	_, err := b.q.RecordResults(context.Background(), r)
	require.NoError(t, err)
}

// acceptedMessage is a started message to users one-device users of
// prefix, every delivery accepted, on a server of its own, and the signer
// of its receipts.
func acceptedMessage(t *testing.T, prefix string, users int) (b *bundle, id string, n int64, ledger []ledgerRow, s *receipt.Signer) {
	t.Helper()
	b = setup(t)
	id, n, ledger = startedMessage(t, b, prefix, users)
	acceptAll(t, b, n, ledger)
	return b, id, n, ledger, b.signer(t)
}

// receiptFigures is the message's receipts object.
func receiptFigures(t testing.TB, b *bundle, id string) map[string]any {
	t.Helper()
	status, st := b.do(t, http.MethodGet, "/v1/messages/"+id, nil)
	require.Equal(t, http.StatusOK, status, st)
	return st["receipts"].(map[string]any)
}

// requireCounts checks the message's confirmed, opened and unconfirmed
// counts, and returns its receipts object.
func requireCounts(t testing.TB, b *bundle, id string, confirmed, opened, unconfirmed int) map[string]any {
	t.Helper()
	rc := receiptFigures(t, b, id)
	require.Equal(t, map[string]any{"confirmed": float64(confirmed), "opened": float64(opened), "unconfirmed": float64(unconfirmed)},
		map[string]any{"confirmed": rc["confirmed"], "opened": rc["opened"], "unconfirmed": rc["unconfirmed"]})
	return rc
}

// receiptRows counts the receipts table's rows whose column is value.
func receiptRows(t testing.TB, b *bundle, column string, value int64) int {
	t.Helper()
	var n int
	require.NoError(t, b.db.Pool.QueryRow(context.Background(), "SELECT count(*) FROM receipts WHERE "+column+" = $1", value).Scan(&n))
	return n
}

// TestReceiptRecordedOnceAndCounted: a delivered receipt is recorded with
// Herald's clock, the device's beside it and its skew from the delivery's
// due instant, and counted once; a replay, in a later request or the same
// one, answers success and changes nothing; opened counts apart.
func TestReceiptRecordedOnceAndCounted(t *testing.T) {
	t.Parallel()
	b, id, n, ledger, s := acceptedMessage(t, "rc", 3)
	tok := token(s, n, ledger[0].ID)

	deviceTime := "2026-01-02T03:04:05.123Z"
	before := time.Now()
	status, body := b.postReceipts(t, map[string]any{"token": tok, "event": "delivered", "device_time": deviceTime})
	require.Equal(t, http.StatusOK, status, body)
	require.Equal(t, []string{"recorded"}, results(t, body))

	var (
		receivedAt, deviceAt time.Time
		skewMs               float64
	)
	require.NoError(t, b.db.Pool.QueryRow(context.Background(),
		"SELECT received_at, device_at, skew_ms FROM receipts WHERE message_id = $1 AND device_id = $2 AND event = 'delivered'",
		n, ledger[0].ID).Scan(&receivedAt, &deviceAt, &skewMs))
	require.WithinDuration(t, time.Now(), receivedAt, time.Since(before)+time.Second)
	require.Equal(t, "2026-01-02T03:04:05.123Z", deviceAt.UTC().Format("2006-01-02T15:04:05.000Z"))
	require.InDelta(t, float64(receivedAt.Sub(ledger[0].DueAt).Microseconds())/1000, skewMs, 0.01)

	rc := requireCounts(t, b, id, 1, 0, 2)
	require.Len(t, rc["histogram"], 1)

	// A replay, alone and twice in one request, then opened beside one.
	status, body = b.postReceipts(t, delivered(tok))
	require.Equal(t, http.StatusOK, status, body)
	require.Equal(t, []string{"replayed"}, results(t, body))
	status, body = b.postReceipts(t, delivered(tok), map[string]any{"token": tok, "event": "opened"}, map[string]any{"token": tok, "event": "opened"})
	require.Equal(t, http.StatusOK, status, body)
	require.Equal(t, []string{"replayed", "recorded", "replayed"}, results(t, body))
	requireCounts(t, b, id, 1, 1, 2)
	require.Equal(t, 2, receiptRows(t, b, "message_id", n))
}

// TestReceiptRefusals: a forged token is refused without reading the
// database, an expired one too, and one whose device was erased after the
// push; each alone is a 401 naming why, and in a batch with a good one,
// each has its result beside the good one's 200. An unknown event is a
// 400 naming it, and nothing of its request is recorded.
func TestReceiptRefusals(t *testing.T) {
	t.Parallel()
	b, id, n, ledger, s := acceptedMessage(t, "rf", 2)
	good := token(s, n, ledger[0].ID)
	other, err := receipt.NewSigner(make([]byte, receipt.KeySize))
	require.NoError(t, err)
	forged := token(other, n, ledger[0].ID)
	expired := s.Sign(receipt.Delivery{MessageID: n, DeviceID: ledger[0].ID}, time.Now().Add(-time.Second))

	for _, tc := range []struct {
		token, want string
	}{{forged, "forged"}, {expired, "expired"}, {"not-a-token", "forged"}, {strings.Repeat("A", 500), "forged"}} {
		rec := b.call(t, request{method: http.MethodPost, path: "/v1/receipts", body: map[string]any{"receipts": []any{delivered(tc.token)}}, noAuth: true})
		requireError(t, rec, http.StatusUnauthorized, "invalid_receipt", "")
		require.Equal(t, []string{tc.want}, results(t, decodeBody(t, rec)))
	}

	// An unknown event, even beside a good receipt, records nothing.
	rec := b.call(t, request{method: http.MethodPost, path: "/v1/receipts", noAuth: true,
		body: map[string]any{"receipts": []any{delivered(good), map[string]any{"token": good, "event": "read"}}}})
	requireError(t, rec, http.StatusBadRequest, "invalid_field", "receipts[1].event")
	rec = b.call(t, request{method: http.MethodPost, path: "/v1/receipts", noAuth: true,
		body: map[string]any{"receipts": []any{map[string]any{"token": good, "event": "delivered", "device_time": "yesterday"}}}})
	requireError(t, rec, http.StatusBadRequest, "invalid_field", "receipts[0].device_time")
	require.EqualValues(t, 0, receiptFigures(t, b, id)["confirmed"])

	// A mixed batch: 200, each result in its place.
	status, body := b.postReceipts(t, delivered(forged), delivered(good), delivered(expired))
	require.Equal(t, http.StatusOK, status, body)
	require.Equal(t, []string{"forged", "recorded", "expired"}, results(t, body))

	// The second device's user is erased: its receipts go with it, and
	// its token names a delivery Herald no longer has a device for.
	erasedTok := token(s, n, ledger[1].ID)
	status, body = b.postReceipts(t, delivered(erasedTok))
	require.Equal(t, http.StatusOK, status, body)
	status, _ = b.do(t, http.MethodDelete, "/v1/users/rf1", nil)
	require.Equal(t, http.StatusNoContent, status)
	require.Zero(t, receiptRows(t, b, "device_id", ledger[1].ID))
	rec = b.call(t, request{method: http.MethodPost, path: "/v1/receipts", body: map[string]any{"receipts": []any{map[string]any{"token": erasedTok, "event": "opened"}}}, noAuth: true})
	requireError(t, rec, http.StatusUnauthorized, "invalid_receipt", "")
	require.Equal(t, []string{"erased"}, results(t, decodeBody(t, rec)))
	// The first device's receipt stays.
	require.Equal(t, 1, receiptRows(t, b, "message_id", n))
}

// TestReceiptBeforeAcceptance: a device can answer before its delivery's
// acceptance is in the ledger. Its receipt counts as confirmed at once, and
// the unconfirmed count (accepted deliveries without a delivered receipt)
// and listing stay right before and after the ledger catches up.
func TestReceiptBeforeAcceptance(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id, n, ledger := startedMessage(t, b, "ra", 3)
	s := b.signer(t)

	// Device 0 answers while its delivery is pending.
	status, body := b.postReceipts(t, delivered(token(s, n, ledger[0].ID)))
	require.Equal(t, http.StatusOK, status, body)
	requireCounts(t, b, id, 1, 0, 0)

	// The ledger writes devices 0 and 1 accepted, 2 failed.
	var r db.RecordResultsParams
	addResult(&r, n, ledger[0], "accepted", "", ledger[0].DueAt.Add(time.Millisecond))
	addResult(&r, n, ledger[1], "accepted", "", ledger[1].DueAt.Add(time.Millisecond))
	addResult(&r, n, ledger[2], "failed", "unregistered", ledger[2].DueAt.Add(time.Millisecond))
	_, err := b.q.RecordResults(context.Background(), r)
	require.NoError(t, err)
	requireCounts(t, b, id, 1, 0, 1)

	// The failed device says it got it all the same: confirmed, but not
	// among the accepted ones.
	status, body = b.postReceipts(t, delivered(token(s, n, ledger[2].ID)))
	require.Equal(t, http.StatusOK, status, body)
	requireCounts(t, b, id, 2, 0, 1)

	// The unconfirmed population, listed: device 1 alone.
	status, page := b.do(t, http.MethodGet, "/v1/messages/"+id+"/deliveries?status=accepted&confirmed=false", nil)
	require.Equal(t, http.StatusOK, status, page)
	items := page["items"].([]any)
	require.Len(t, items, 1)
	require.Equal(t, formatDeviceID(ledger[1].ID), items[0].(map[string]any)["device_id"])
	require.Nil(t, items[0].(map[string]any)["confirmed_at"])
	// The confirmed ones carry their receipt's times.
	_, page = b.do(t, http.MethodGet, "/v1/messages/"+id+"/deliveries?confirmed=true&limit=1", nil)
	items = page["items"].([]any)
	require.Len(t, items, 1)
	first := items[0].(map[string]any)
	require.Equal(t, formatDeviceID(ledger[0].ID), first["device_id"])
	require.NotNil(t, first["confirmed_at"])
	require.NotNil(t, first["confirmed_skew_ms"])
	require.Nil(t, first["opened_at"])
	require.NotNil(t, page["next_cursor"])
	_, page = b.do(t, http.MethodGet, "/v1/messages/"+id+"/deliveries?confirmed=true&limit=1&cursor="+page["next_cursor"].(string), nil)
	require.Equal(t, formatDeviceID(ledger[2].ID), page["items"].([]any)[0].(map[string]any)["device_id"])
	require.Nil(t, page["next_cursor"])
	requireError(t, b.call(t, request{method: http.MethodGet, path: "/v1/messages/" + id + "/deliveries?confirmed=maybe"}), http.StatusBadRequest, "invalid_field", "confirmed")
}

// TestReceiptSkewHistogram: the confirmed skew's percentiles and buckets
// come from the message row's histogram, and the metrics count each
// receipt by outcome and time each confirmed delivery's skew.
func TestReceiptSkewHistogram(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	b := setupWith(t, dbtestNew(t), Config{Registerer: reg})
	id, n, ledger := startedMessage(t, b, "rh", 4)
	acceptAll(t, b, n, ledger)
	// Three devices due 2 s ago answer now; one due 40 s ago. "Now" is
	// when the receipt is written, later on a busy machine: each skew is
	// at most its due time's distance plus what passed until the answer.
	since := time.Now()
	_, err := b.db.Pool.Exec(context.Background(), `
		UPDATE deliveries SET due_at = clock_timestamp() - CASE WHEN device_id = $2 THEN interval '40 s' ELSE interval '2 s' END
		WHERE message_id = $1`, n, ledger[3].ID)
	require.NoError(t, err)
	s := b.signer(t)
	var receipts []map[string]any
	for _, d := range ledger {
		receipts = append(receipts, delivered(token(s, n, d.ID)))
	}
	status, body := b.postReceipts(t, receipts...)
	require.Equal(t, http.StatusOK, status, body)
	passed := float64(time.Since(since).Milliseconds() + 1)

	rc := receiptFigures(t, b, id)
	skew := rc["skew_ms"].(map[string]any)
	// Each figure is the top of its 10% bucket: above the exact skew, by
	// at most 10% of it.
	require.Greater(t, skew["p50"].(float64), 2000.0)
	require.Less(t, skew["p50"].(float64), (2000+passed)*1.1*1.1)
	require.Greater(t, skew["max"].(float64), 40000.0)
	require.Less(t, skew["max"].(float64), (40000+passed)*1.1*1.1)
	var total float64
	for _, h := range rc["histogram"].([]any) {
		bucket := h.(map[string]any)
		total += bucket["count"].(float64)
		require.Equal(t, bucketUpper(int(bucket["bucket"].(float64))), bucket["upper_ms"])
	}
	require.EqualValues(t, 4, total)

	// Replays and a forgery, for the counters.
	b.postReceipts(t, receipts[0])
	b.postReceipts(t, delivered("forged"))
	require.EqualValues(t, 4, testutil.ToFloat64(b.srv.receiptMetrics.receipts.WithLabelValues("delivered", "recorded")))
	require.EqualValues(t, 1, testutil.ToFloat64(b.srv.receiptMetrics.receipts.WithLabelValues("delivered", "replayed")))
	require.EqualValues(t, 1, testutil.ToFloat64(b.srv.receiptMetrics.receipts.WithLabelValues("delivered", "forged")))
	families, err := reg.Gather()
	require.NoError(t, err)
	for _, f := range families {
		if f.GetName() == "herald_receipt_skew_seconds" {
			h := f.GetMetric()[0].GetHistogram()
			require.EqualValues(t, 4, h.GetSampleCount())
			require.GreaterOrEqual(t, h.GetSampleSum(), 46.0)
			require.LessOrEqual(t, h.GetSampleSum(), 46+4*passed/1000)
			return
		}
	}
	t.Fatal("herald_receipt_skew_seconds is not exported")
}

// receiptFrom posts body from the client address addr.
func receiptFrom(t testing.TB, b *bundle, addr string, body string) *httptest.ResponseRecorder {
	t.Helper()
	req := httptest.NewRequest(http.MethodPost, "/v1/receipts", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.RemoteAddr = addr
	rec := httptest.NewRecorder()
	b.srv.ServeHTTP(rec, req)
	checkAgainstSpec(t, req, rec)
	return rec
}

// TestReceiptRateLimitPerAddress: each client address has its own bucket;
// one spent is a 429 with Retry-After, refused before its body is read,
// and another address is not slowed. An IPv6 client's /64 is one address.
func TestReceiptRateLimitPerAddress(t *testing.T) {
	t.Parallel()
	b := setupWith(t, dbtestNew(t), Config{ReceiptRateLimit: 0.01, ReceiptRateBurst: 2})
	body := `{"receipts":[{"token":"x","event":"delivered"}]}`
	for range 2 {
		require.Equal(t, http.StatusUnauthorized, receiptFrom(t, b, "198.51.100.7:4000", body).Code)
	}
	rec := receiptFrom(t, b, "198.51.100.7:4001", "not even JSON")
	requireError(t, rec, http.StatusTooManyRequests, "rate_limited", "")
	require.NotEmpty(t, rec.Header().Get("Retry-After"))
	require.Equal(t, http.StatusUnauthorized, receiptFrom(t, b, "198.51.100.8:4000", body).Code)

	for range 2 {
		require.Equal(t, http.StatusUnauthorized, receiptFrom(t, b, "[2001:db8:1:2::1]:4000", body).Code)
	}
	requireError(t, receiptFrom(t, b, "[2001:db8:1:2::ffff]:4000", body), http.StatusTooManyRequests, "rate_limited", "")
	require.EqualValues(t, 2, testutil.ToFloat64(b.srv.receiptMetrics.receipts.WithLabelValues("unknown", "rate_limited")))
}

// TestReceiptBodyBounds: at most 100 receipts a request and 32 KB a body.
func TestReceiptBodyBounds(t *testing.T) {
	t.Parallel()
	b := setup(t)
	many := make([]map[string]any, maxReceiptsPerRequest+1)
	for i := range many {
		many[i] = delivered("x")
	}
	rec := b.call(t, request{method: http.MethodPost, path: "/v1/receipts", body: map[string]any{"receipts": many}, noAuth: true})
	requireError(t, rec, http.StatusBadRequest, "invalid_field", "receipts")
	rec = b.call(t, request{method: http.MethodPost, path: "/v1/receipts", body: map[string]any{"receipts": []any{}}, noAuth: true})
	requireError(t, rec, http.StatusBadRequest, "invalid_field", "receipts")
	huge := `{"receipts":[{"token":"` + strings.Repeat("A", receiptBodyLimit) + `","event":"delivered"}]}`
	rec = b.call(t, request{method: http.MethodPost, path: "/v1/receipts", body: huge, noAuth: true})
	require.Equal(t, http.StatusRequestEntityTooLarge, rec.Code, rec.Body.String())
}

// TestConcurrentReceiptsAllCounted: many phones answering one message at
// once, each twice, are all counted exactly once, by writes that carry many
// receipts each; and every receipt answered as recorded is in the table as
// the answer arrives: the answer follows the commit.
func TestConcurrentReceiptsAllCounted(t *testing.T) {
	t.Parallel()
	const devices = 300
	b, id, n, ledger, s := acceptedMessage(t, "cc", devices)

	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		recorded int
		problems []string
	)
	for round := range 2 {
		for _, d := range ledger {
			wg.Go(func() {
				tok := token(s, n, d.ID)
				req := httptest.NewRequest(http.MethodPost, "/v1/receipts", strings.NewReader(`{"receipts":[{"token":"`+tok+`","event":"delivered"}]}`))
				req.Header.Set("Content-Type", "application/json")
				rec := httptest.NewRecorder()
				b.srv.ServeHTTP(rec, req)
				var inTable bool
				err := b.db.Pool.QueryRow(context.Background(),
					"SELECT EXISTS (SELECT 1 FROM receipts WHERE message_id = $1 AND device_id = $2)", n, d.ID).Scan(&inTable)
				mu.Lock()
				defer mu.Unlock()
				switch {
				case err != nil:
					problems = append(problems, err.Error())
				case rec.Code != http.StatusOK:
					problems = append(problems, fmt.Sprintf("round %d device %d: %d %s", round, d.ID, rec.Code, rec.Body.String()))
				case !inTable:
					problems = append(problems, fmt.Sprintf("device %d answered before its receipt was committed", d.ID))
				case strings.Contains(rec.Body.String(), `"recorded"`):
					recorded++
				}
			})
		}
	}
	wg.Wait()
	require.Empty(t, problems)
	require.Equal(t, devices, recorded)
	rc := requireCounts(t, b, id, devices, 0, 0)
	var total float64
	for _, h := range rc["histogram"].([]any) {
		total += h.(map[string]any)["count"].(float64)
	}
	require.EqualValues(t, devices, total)
}

// TestForgedReceiptsReadNothing: forged and expired tokens are refused
// without the database: with the server's pool closed, they are still
// 401, while a genuine receipt, which must be written, is a 503.
func TestForgedReceiptsReadNothing(t *testing.T) {
	t.Parallel()
	tdb := dbtestNew(t)
	pool, err := db.Open(context.Background(), tdb.URL, db.PoolConfig{})
	require.NoError(t, err)
	b := setupWith(t, tdb, Config{})
	srv, err := NewServer(Config{Logger: discard, Pool: pool, River: insertOnlyRiver(t, tdb)})
	require.NoError(t, err)
	require.NoError(t, srv.Refresh(context.Background()))
	pool.Close()
	b.srv = srv

	s := b.signer(t)
	other, err := receipt.NewSigner(make([]byte, receipt.KeySize))
	require.NoError(t, err)
	for tok, want := range map[string]string{
		token(other, 1, 1): "forged",
		s.Sign(receipt.Delivery{MessageID: 1, DeviceID: 1}, time.Now().Add(-time.Minute)): "expired",
	} {
		rec := b.call(t, request{method: http.MethodPost, path: "/v1/receipts", body: map[string]any{"receipts": []any{delivered(tok)}}, noAuth: true})
		requireError(t, rec, http.StatusUnauthorized, "invalid_receipt", "")
		require.Equal(t, []string{want}, results(t, decodeBody(t, rec)))
	}
	rec := b.call(t, request{method: http.MethodPost, path: "/v1/receipts", body: map[string]any{"receipts": []any{delivered(token(s, 1, 1))}}, noAuth: true})
	require.GreaterOrEqual(t, rec.Code, http.StatusInternalServerError, rec.Body.String())
}

// TestReceiptsFromAnyOrigin: a service worker posts receipts from its
// site's origin, so the browser's preflight is answered and every answer,
// a refusal too, lets any origin read it.
func TestReceiptsFromAnyOrigin(t *testing.T) {
	t.Parallel()
	b := setup(t)
	req := httptest.NewRequest(http.MethodOptions, "/v1/receipts", nil)
	req.Header.Set("Origin", "https://app.example.test")
	req.Header.Set("Access-Control-Request-Method", "POST")
	req.Header.Set("Access-Control-Request-Headers", "content-type")
	rec := httptest.NewRecorder()
	b.srv.ServeHTTP(rec, req)
	require.Equal(t, http.StatusNoContent, rec.Code)
	require.Equal(t, "*", rec.Header().Get("Access-Control-Allow-Origin"))
	require.Equal(t, "POST", rec.Header().Get("Access-Control-Allow-Methods"))
	require.Equal(t, "Content-Type", rec.Header().Get("Access-Control-Allow-Headers"))

	rec = b.call(t, request{method: http.MethodPost, path: "/v1/receipts", body: map[string]any{"receipts": []any{delivered("forged")}},
		noAuth: true, header: map[string]string{"Origin": "https://app.example.test"}})
	require.Equal(t, http.StatusUnauthorized, rec.Code)
	require.Equal(t, "*", rec.Header().Get("Access-Control-Allow-Origin"))
	// The API's other routes answer no origin but their own.
	rec = b.call(t, request{method: http.MethodGet, path: "/v1/messages", header: map[string]string{"Origin": "https://app.example.test"}})
	require.Empty(t, rec.Header().Get("Access-Control-Allow-Origin"))
}
