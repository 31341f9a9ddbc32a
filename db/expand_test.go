package db_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
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
			var id int64
			require.NoError(t, tx.QueryRow(ctx, `
				WITH p AS (INSERT INTO payloads (content) VALUES ('{}') RETURNING id)
				INSERT INTO messages (state, priority, dispatch_at, expires_at, payload_id, audience, device_count, chunk_count, pending_count)
				SELECT 'scheduled', 'bulk', $1, $1::timestamptz + interval '1 hour', p.id, '{}', 0, 0, 0 FROM p
				RETURNING id`, due).Scan(&id))
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
