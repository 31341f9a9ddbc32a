package db_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/heraldpush/herald/db"
	"github.com/heraldpush/herald/db/dbtest"
)

// expandedSnapshot is what an expansion wrote: its answer and its chunks'
// snapshots, each snapshot's devices in order, and the localization of
// each ("-" for none).
type expandedSnapshot struct {
	Out     db.Expanded
	Chunks  [][]int64
	Locales [][]string
}

// TestPlainExpansionCutsAsTheGeneralOne checks that a plain message's
// expansion, which reads a segment's devices in the order of their users
// and cuts its chunks from one sorted array, writes exactly what the
// general statement does (chunk by chunk, the same devices, ranges and
// counts, the same localizations, and the same recipients), on a
// population whose devices were registered in no order of their users,
// some evicted, of two apps, its users of several locales or none: for a
// segment, a segment's devices of one app, a list of users, an audience
// without devices, a localized message, and the rest of a message sent now
// after its head.
func TestPlainExpansionCutsAsTheGeneralOne(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tdb := dbtest.New(t)
	_, err := tdb.Pool.Exec(ctx, `
		INSERT INTO apps (id, name) VALUES (2, 'other');
		INSERT INTO users (id, locale) SELECT 'user_' || g, (ARRAY['en', 'fr', 'de', NULL])[g % 4 + 1] FROM generate_series(1, 300) g;
		INSERT INTO devices (user_id, channel, token, app_id, status, evicted_at)
		SELECT 'user_' || (g * 7919 % 300 + 1), (ARRAY['apns', 'fcm'])[g % 2 + 1], 'tok-' || g, g % 3 / 2 + 1,
		       CASE WHEN g % 11 = 0 THEN 'evicted' ELSE 'active' END,
		       CASE WHEN g % 11 = 0 THEN now() END
		FROM generate_series(1, 700) g
		WHERE (g * 7919 % 300 + 1) % 5 <> 0;
		INSERT INTO segments (id) VALUES ('most'), ('none');
		INSERT INTO segment_members (segment_id, user_id) SELECT 'most', 'user_' || g FROM generate_series(1, 300) g WHERE g % 3 <> 0;
		INSERT INTO segment_members (segment_id, user_id) SELECT 'none', 'user_' || g FROM generate_series(5, 300, 5) g;
		ANALYZE`)
	require.NoError(t, err)

	due := time.Now().Add(time.Hour).Truncate(time.Microsecond)
	plan := db.Expansion{ChunkSize: 20, FirstChunkSize: 7, DispatchAt: due, Snapshot: true}
	// write expands a in a transaction it rolls back: after a head of 7
	// devices when rest, plainly or with the general statement.
	write := func(a db.Audience, general, rest, localized bool) expandedSnapshot {
		var got expandedSnapshot
		err := pgx.BeginFunc(ctx, tdb.Pool, func(tx pgx.Tx) error {
			id := scheduledMessage(t, tx, due)
			e := plan
			e.MessageID = id
			if localized {
				// No localization for "de": those users get the message's
				// own text.
				e.Locales, e.Keys = []string{"en", "fr", ""}, []string{"en", "fr-FR", "default"}
			}
			if rest {
				head := e
				head.Head = 7
				out, err := db.ExpandAudience(ctx, tx, a, head)
				require.NoError(t, err)
				require.True(t, out.More)
				e.After = out.Chunks[len(out.Chunks)-1].LastDevice
			}
			var err error
			if general {
				got.Out, err = db.ExpandGeneral(ctx, tx, a, e)
			} else {
				got.Out, err = db.ExpandAudience(ctx, tx, a, e)
			}
			require.NoError(t, err)
			rows, err := tx.Query(ctx, `
				SELECT (SELECT array_agg(d ORDER BY d) FROM unnest(devices, locales) x(d, l)),
				       (SELECT array_agg(coalesce(l, '-') ORDER BY d) FROM unnest(devices, locales) x(d, l))
				FROM chunk_devices
				WHERE message_id = $1 ORDER BY chunk`, id)
			require.NoError(t, err)
			for rows.Next() {
				var ids []int64
				var locales []string
				require.NoError(t, rows.Scan(&ids, &locales))
				got.Chunks, got.Locales = append(got.Chunks, ids), append(got.Locales, locales)
			}
			require.NoError(t, rows.Err())
			return errRollBack
		})
		require.ErrorIs(t, err, errRollBack)
		return got
	}
	for name, c := range map[string]struct {
		a               db.Audience
		rest, localized bool
	}{
		"segment":        {a: db.Audience{SegmentID: "most"}},
		"one app":        {a: db.Audience{SegmentID: "most", Apps: []string{"other"}}},
		"list":           {a: db.Audience{UserIDs: []string{"user_1", "user_2", "user_3", "user_4", "user_150", "user_299", "nobody"}}},
		"no devices":     {a: db.Audience{SegmentID: "none"}},
		"rest":           {a: db.Audience{SegmentID: "most"}, rest: true},
		"localized":      {a: db.Audience{SegmentID: "most"}, localized: true},
		"rest localized": {a: db.Audience{SegmentID: "most"}, rest: true, localized: true},
		"rest of list":   {a: db.Audience{UserIDs: []string{"user_1", "user_2", "user_3", "user_4", "user_7", "user_8", "user_9", "user_11"}}, rest: true},
	} {
		t.Run(name, func(t *testing.T) {
			plain, general := write(c.a, false, c.rest, c.localized), write(c.a, true, c.rest, c.localized)
			require.Equal(t, general, plain)
			if name != "no devices" {
				require.NotEmpty(t, plain.Chunks)
			}
			if c.localized {
				require.Contains(t, plain.Locales[len(plain.Locales)-1], "fr-FR")
				require.Contains(t, plain.Locales[len(plain.Locales)-1], "-")
			}
			// After a head, the snapshots begin with the head's.
			head := len(plain.Chunks) - len(plain.Out.Chunks)
			for i, ch := range plain.Out.Chunks {
				ids := plain.Chunks[head+i]
				require.Equal(t, ch.FirstDevice, ids[0])
				require.Equal(t, ch.LastDevice, ids[len(ids)-1])
				if i > 0 {
					require.Greater(t, ch.FirstDevice, plain.Out.Chunks[i-1].LastDevice, "chunks' ranges overlap")
				}
			}
		})
	}
}

var errRollBack = errors.New("roll back")

// TestPlainExpansionMergesWhateverTheStatistics: a plain message's
// expansion of a large segment walks the segment's members and their
// devices side by side and counts its users as they come, whatever the
// planner estimates, and one of a small segment looks up its members'
// devices alone. A population registered user by user (a bulk import),
// each user's devices side by side in the table, makes ANALYZE's sample
// find far fewer users than there are (on ten million devices, 511,814 of
// 4,000,000): the planner then read every device and looked its user up in
// the segment (a nested loop, memoized for the few users it expected), and
// hashed the users to count them, spilling, and the POST of that message
// took 40-55 s instead of 9. Here the estimate is set as wrong as that.
func TestPlainExpansionMergesWhateverTheStatistics(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tdb := dbtest.New(t)
	_, err := tdb.Pool.Exec(ctx, `
		INSERT INTO users (id) SELECT 'user_' || g FROM generate_series(1, 20000) g;
		INSERT INTO devices (user_id, channel, token)
		SELECT 'user_' || g, (ARRAY['apns', 'fcm'])[k], 'tok-' || g || '-' || k
		FROM generate_series(1, 20000) g, generate_series(1, 2) k ORDER BY g, k;
		INSERT INTO segments (id) VALUES ('all'), ('few');
		INSERT INTO segment_members (segment_id, user_id) SELECT 'all', id FROM users;
		INSERT INTO segment_members (segment_id, user_id) SELECT 'few', 'user_' || g FROM generate_series(100, 20000, 2000) g;
		ALTER TABLE devices ALTER COLUMN user_id SET (n_distinct = 2500)`)
	require.NoError(t, err)
	_, err = tdb.Pool.Exec(ctx, `VACUUM ANALYZE devices, users, segment_members`)
	require.NoError(t, err)

	cfg := tdb.Pool.Config().ConnConfig.Copy()
	var notices []string
	cfg.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) { notices = append(notices, n.Message) }
	conn, err := pgx.ConnectConfig(ctx, cfg)
	require.NoError(t, err)
	defer conn.Close(ctx)
	// The plan each statement ran with, and the rows each of its nodes
	// gave, sent back as a notice.
	_, err = conn.Exec(ctx, `LOAD 'auto_explain'; SET auto_explain.log_min_duration = 0;
		SET auto_explain.log_analyze = on; SET auto_explain.log_timing = off;
		SET auto_explain.log_level = notice; SET auto_explain.log_format = json`)
	require.NoError(t, err)

	// expand expands the segment in a transaction it rolls back and returns
	// the expansion's plan's nodes, and how many devices it wrote.
	expand := func(segment string) (nodes []planNode, devices int) {
		tx, err := conn.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(ctx) }()
		due := time.Now().Add(time.Hour)
		id := scheduledMessage(t, tx, due)
		notices = nil
		out, err := db.ExpandAudience(ctx, tx, db.Audience{SegmentID: segment},
			db.Expansion{MessageID: id, ChunkSize: 500, DispatchAt: due, Snapshot: true})
		require.NoError(t, err)
		for _, c := range out.Chunks {
			devices += int(c.Devices)
		}
		for _, n := range notices {
			if i := strings.Index(n, "{"); i >= 0 && strings.Contains(n, "chunk_devices") {
				var explained struct{ Plan planNode }
				require.NoError(t, json.Unmarshal([]byte(n[i:]), &explained))
				nodes = explained.Plan.flatten()
			}
		}
		require.NotEmpty(t, nodes, "no plan of the expansion among %d notices", len(notices))
		return nodes, devices
	}

	nodes, devices := expand("all")
	require.Equal(t, 40_000, devices)
	var merged bool
	for _, n := range nodes {
		require.NotEqual(t, "Memoize", n.Type, "a device's user looked up in the segment")
		require.NotEqual(t, "Hashed", n.Strategy, "the users hashed to count them")
		merged = merged || n.Type == "Merge Join"
	}
	require.True(t, merged, "the segment's members and their devices are walked side by side")

	nodes, devices = expand("few")
	require.Equal(t, 20, devices)
	for _, n := range nodes {
		if n.Relation == "devices" || n.Index == "devices_by_user_idx" {
			require.LessOrEqual(t, n.Rows*n.Loops, 20.0, "%s read more devices than the segment's", n.Type)
		}
	}
}

// scheduledMessage inserts a bulk message due at due, with nothing
// expanded yet, and returns its id.
func scheduledMessage(t *testing.T, tx pgx.Tx, due time.Time) int64 {
	t.Helper()
	var id int64
	require.NoError(t, tx.QueryRow(context.Background(), `
		WITH p AS (INSERT INTO payloads (content) VALUES ('{}') RETURNING id)
		INSERT INTO messages (state, priority, dispatch_at, expires_at, payload_id, audience, device_count, chunk_count, pending_count)
		SELECT 'scheduled', 'bulk', $1, $1::timestamptz + interval '1 hour', p.id, '{}', 0, 0, 0 FROM p
		RETURNING id`, due).Scan(&id))
	return id
}

// planNode is a node of a JSON plan with its rows, as auto_explain gives
// it with log_analyze.
type planNode struct {
	Type     string     `json:"Node Type"`
	Strategy string     `json:"Strategy"`
	Relation string     `json:"Relation Name"`
	Index    string     `json:"Index Name"`
	Rows     float64    `json:"Actual Rows"`
	Loops    float64    `json:"Actual Loops"`
	Plans    []planNode `json:"Plans"`
}

// flatten lists the node and every node under it.
func (n planNode) flatten() []planNode {
	out := []planNode{n}
	for _, p := range n.Plans {
		out = append(out, p.flatten()...)
	}
	return out
}
