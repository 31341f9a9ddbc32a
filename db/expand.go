package db

import (
	"cmp"
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// Audience names who a message goes to: a segment's members, or a list of
// users; and of their devices, those of every app or of the apps named.
type Audience struct {
	SegmentID string
	UserIDs   []string
	// Apps are app names (migration 0021), each of an app's name's shape
	// ([a-z0-9._-], which needs no quoting); none means every app.
	Apps []string
}

// appsFilter is the condition on the devices d of a's apps: none when a
// names no app. The names are of an app name's shape, checked here again,
// so that they can be written into the statement, which keeps its one
// parameter.
func (a Audience) appsFilter() string {
	if len(a.Apps) == 0 {
		return ""
	}
	names := make([]string, 0, len(a.Apps))
	for _, n := range a.Apps {
		if !appNameShape(n) {
			// Matches no app: a message for an app that cannot exist.
			n = "-"
		}
		names = append(names, "'"+n+"'")
	}
	// The ids are read once, before the devices: a filter on the index
	// entries (devices_by_user_idx holds app_id), not a join with apps.
	return " AND d.app_id = ANY (ARRAY(SELECT id FROM apps WHERE name IN (" + strings.Join(names, ", ") + ")))"
}

// appNameShape reports whether n is of an app name's shape.
func appNameShape(n string) bool {
	if n == "" || len(n) > 63 {
		return false
	}
	for i := 0; i < len(n); i++ {
		c := n[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || i > 0 && (c == '.' || c == '_' || c == '-')) {
			return false
		}
	}
	return true
}

// audienceSQL selects the active devices of a's users: id, user_id,
// channel, and the user's time zone and locale when withUser (NULLs
// otherwise, which spares the join). The segment or the user ids are the
// parameter param ("$1").
func (a Audience) sql(withUser bool, param string) (query string, arg any) {
	user := "NULL::text AS timezone, NULL::text AS locale"
	join := ""
	if withUser {
		user, join = "u.timezone, u.locale", "JOIN users u ON u.id = d.user_id"
	}
	if a.SegmentID != "" {
		return `SELECT d.id, d.user_id, d.channel, ` + user + `
			FROM segment_members m
			JOIN devices d ON d.user_id = m.user_id AND d.status = 'active'` + a.appsFilter() + `
			` + join + `
			WHERE m.segment_id = ` + param, a.SegmentID
	}
	return `SELECT d.id, d.user_id, d.channel, ` + user + `
		FROM devices d
		` + join + `
		WHERE d.user_id = ANY (` + param + `::text[]) AND d.status = 'active'` + a.appsFilter(), a.UserIDs
}

// AudienceKeys are the distinct time zones and locales of an audience's
// users ("" for a user without one): what the caller needs to place a
// local-time message's waves and pick each locale's localization before
// ExpandAudience, without reading the audience itself.
type AudienceKeys struct {
	Zones, Locales []string
}

// ReadAudienceKeys reads a's distinct zones and locales.
func ReadAudienceKeys(ctx context.Context, q DBTX, a Audience) (AudienceKeys, error) {
	audience, arg := a.sql(true, "$1")
	rows, err := interpreting{q}.Query(ctx, `
		WITH audience AS (`+audience+`)
		SELECT DISTINCT coalesce(timezone, ''), coalesce(locale, '') FROM audience`, arg)
	if err != nil {
		return AudienceKeys{}, fmt.Errorf("read the audience's zones and locales: %w", err)
	}
	defer rows.Close()
	var keys AudienceKeys
	zones, locales := map[string]bool{}, map[string]bool{}
	for rows.Next() {
		var zone, locale string
		if err := rows.Scan(&zone, &locale); err != nil {
			return AudienceKeys{}, err
		}
		if !zones[zone] {
			zones[zone] = true
			keys.Zones = append(keys.Zones, zone)
		}
		if !locales[locale] {
			locales[locale] = true
			keys.Locales = append(keys.Locales, locale)
		}
	}
	if err := rows.Err(); err != nil {
		return AudienceKeys{}, fmt.Errorf("read the audience's zones and locales: %w", err)
	}
	return keys, nil
}

// Expansion is how ExpandAudience writes a message's ledger.
type Expansion struct {
	MessageID int64
	// ChunkSize is the most devices a chunk holds; FirstChunkSize, when
	// smaller, the most the first chunk of each due instant holds.
	ChunkSize, FirstChunkSize int
	// DispatchAt is when every device is due, unless the message has
	// waves (Zones).
	DispatchAt time.Time
	// Zones, DueAts and Passed place a local-time message's waves: the
	// devices of users in Zones[i] ("" for users without a zone) are due at
	// DueAts[i], or expired at once when Passed[i]. Every zone of the
	// audience must be there (ReadAudienceKeys).
	Zones  []string
	DueAts []time.Time
	Passed []bool
	// Locales and Keys pick localizations: the devices of users whose
	// locale is Locales[i] ("" for none) get the localization Keys[i].
	// Users of other locales get the message's own text.
	Locales, Keys []string
	// Head, when positive, writes the audience's first Head devices (at
	// most ChunkSize) alone, as chunk 0 (a message sent now commits its first chunk before the
	// rest is written: jobs.Enqueuer's Submit); Expanded.More says whether
	// the audience has more. Not with Zones.
	Head int
	// After, when positive, writes only the devices whose ids are above
	// it, in chunks of ChunkSize numbered from 1: the rest after a Head.
	// Not with Zones.
	After int64
	// Snapshot writes the devices due in each chunk as one row of
	// chunk_devices (migration 0022) instead of a pending ledger row each:
	// the ledger row of a delivery is then written once, with its result.
	// Deliveries expired at once are written as rows either way.
	Snapshot bool
}

// ExpandedChunk is one chunk ExpandAudience cut: the devices due at DueAt
// whose ids run from FirstDevice to LastDevice among the message's pending
// deliveries of chunk Chunk. Chunk -1 holds the deliveries that expired at
// once (a local-time message's recipients whose time had passed).
type ExpandedChunk struct {
	Chunk                   int32
	DueAt                   time.Time
	Devices                 int32
	FirstDevice, LastDevice int64
}

// Expanded is what ExpandAudience wrote.
type Expanded struct {
	// Chunks are in the order of their numbers, -1 first.
	Chunks     []ExpandedChunk
	Recipients int32
	// More says that a Head expansion left devices of the audience
	// unwritten.
	More bool
}

// ExpandAudience writes the message's ledger from the directory in one
// statement, in the caller's transaction: a row for each active device of
// a's users, pending in its chunk, or expired. The rows never leave the
// server, so no Herald process holds an audience however large it is; what
// comes back is a row per chunk. Chunks are cut in device order within
// each due instant, so a chunk is a range of the message's part of the
// ledger's primary key, which is how its worker reads it (ChunkPending).
// The caller has taken LockDirectoryShared.
func ExpandAudience(ctx context.Context, q DBTX, a Audience, e Expansion) (Expanded, error) {
	q = interpreting{q}
	// The statement sorts the audience by device and counts its users in
	// memory when work_mem allows: 128 MB holds a million devices, which
	// otherwise spill to disk in four places. A plain message's expansion
	// (expandSnapshot) reads a segment's devices in the order of their
	// users: a large segment's index merged with the devices' (no hash of
	// either), which the planner would not choose on its own, a small one's
	// members' devices looked up. Its users are counted as they come, in
	// that order. The planner is kept from the plans it would take instead
	// when it underestimates the users, as ANALYZE does on a table whose
	// devices lie user by user (a bulk import: 511,814 users estimated of
	// 4,000,000): reading every device and looking its user up in the
	// segment, memoized for the few users it expects, and hashing the
	// users, spilling. That took a ten-million-device POST from 9 s to
	// 40-55 s. All are set for this statement alone, in the caller's
	// transaction.
	plain := e.Snapshot && len(e.Zones) == 0 && e.Head == 0
	// Hash joins, memoize (a hash table of the rows looked up) and hash
	// aggregation: off for a plain expansion.
	hashing := "on"
	if plain {
		hashing = "off"
	}
	var saved [4]string
	if err := q.QueryRow(ctx, `
		SELECT current_setting('work_mem'), current_setting('enable_hashjoin'),
		       current_setting('enable_memoize'), current_setting('enable_hashagg'),
		       set_config('work_mem', '128MB', true), set_config('enable_hashjoin', $1, true),
		       set_config('enable_memoize', $1, true), set_config('enable_hashagg', $1, true)`, hashing).
		Scan(&saved[0], &saved[1], &saved[2], &saved[3], new(string), new(string), new(string), new(string)); err != nil {
		return Expanded{}, fmt.Errorf("set the expansion's plan settings: %w", err)
	}
	var out Expanded
	var err error
	if plain {
		out, err = expandSnapshot(ctx, q, a, e)
	} else {
		out, err = expand(ctx, q, a, e)
	}
	if err != nil {
		return Expanded{}, err
	}
	if _, err := q.Exec(ctx, `SELECT set_config('work_mem', $1, true), set_config('enable_hashjoin', $2, true),
		set_config('enable_memoize', $3, true), set_config('enable_hashagg', $4, true)`, saved[0], saved[1], saved[2], saved[3]); err != nil {
		return Expanded{}, fmt.Errorf("restore the plan settings: %w", err)
	}
	return out, nil
}

// expandSnapshot is ExpandAudience's one statement for a message with one
// due instant, written as snapshots: every expansion but a local-time
// message's and the head of a message sent now.
//
// It carries the audience's device ids alone, sorted into one array, and
// cuts the chunks from it as slices; its users are counted in a second read
// of the audience, grouped as they come. For a segment, both reads merge
// the segment's members (its primary key) with the devices of each user
// (devices_by_user_idx, which holds each device's status and app): two
// index-only walks in the order of users, with nothing hashed. A
// million-device segment's expansion takes 0.8 s this way against 2.8 s
// for the general statement (expand), which hashes the segment, sorts whole
// rows by device, numbers them, materializes them and hashes their users.
func expandSnapshot(ctx context.Context, q DBTX, a Audience, e Expansion) (Expanded, error) {
	var args statementArgs
	param := args.add
	message := param(e.MessageID)
	localized := len(e.Locales) > 0
	audience, arg := a.sql(localized, "$2")
	param(arg)
	// The users are counted without their time zones and locales.
	counted, _ := a.sql(false, "$2")
	// Chunk number+0 holds the first `first` devices, each next one the
	// next `size`. After a head: chunks of ChunkSize from chunk 1.
	first, size, number := min(cmp.Or(e.FirstChunkSize, e.ChunkSize), e.ChunkSize), e.ChunkSize, 0
	recipients := `SELECT a.user_id FROM (` + counted + `) a GROUP BY a.user_id`
	if e.After > 0 {
		after := param(e.After)
		audience = `SELECT * FROM (` + audience + `) a WHERE a.id > ` + after
		counted = `SELECT * FROM (` + counted + `) a WHERE a.id > ` + after
		first, number = e.ChunkSize, 1
		// As in expand: the head's users are counted once with the rest's.
		// The head's snapshot is read as it was before this statement.
		recipients = `SELECT a.user_id FROM (` + counted + `) a UNION ` + headUsers(message)
	}
	// A localized message's snapshots hold, beside each device, the
	// localization its user's locale picked (NULL for the message's own
	// text): an array lookup a device, sorted with the ids.
	keys := `NULL::text[]`
	if localized {
		keys = `array_agg((` + param(e.Keys) + `::text[])[array_position(` + param(e.Locales) + `::text[], coalesce(a.locale, ''))] ORDER BY a.id)`
	}
	f, s, n := param(first), param(size), param(number)
	due := param(e.DispatchAt)
	slice := func(array string) string {
		return array + `[CASE WHEN k = 0 THEN 1 ELSE ` + f + `::integer + (k - 1) * ` + s + `::integer + 1 END
			             : ` + f + `::integer + k * ` + s + `::integer]`
	}
	rows, err := q.Query(ctx, `
		WITH audience AS (
			SELECT array_agg(a.id ORDER BY a.id) AS ids, `+keys+` AS keys FROM (`+audience+`) a
		),
		cut AS (
			SELECT k + `+n+`::integer AS chunk, `+slice("a.ids")+` AS ids, `+slice("a.keys")+` AS keys
			FROM audience a
			CROSS JOIN generate_series(0, (cardinality(a.ids) - `+f+`::integer + `+s+`::integer - 1) / `+s+`::integer) AS k
		),
		snap AS (
			INSERT INTO chunk_devices (message_id, chunk, due_at, first_device, last_device, devices, locales)
			SELECT `+message+`::bigint, chunk, `+due+`::timestamptz, ids[1], ids[cardinality(ids)], ids, keys
			FROM cut
			RETURNING chunk, due_at, cardinality(devices)::integer AS n, first_device, last_device
		)
		SELECT chunk, due_at, n, first_device, last_device,
		       (SELECT count(*) FROM (`+recipients+`) u)::integer, false
		FROM snap
		ORDER BY chunk`, args...)
	return readExpanded(rows, err)
}

// expand is ExpandAudience's one statement. The waves and localizations
// are joined in only when there are some: a join that finds nothing still
// costs a lookup a device.
func expand(ctx context.Context, q DBTX, a Audience, e Expansion) (Expanded, error) {
	var args statementArgs
	param := args.add
	message := param(e.MessageID)
	audience, arg := a.sql(len(e.Zones) > 0 || len(e.Locales) > 0, "$2")
	param(arg)
	size := param(e.ChunkSize)
	firstSize, number := min(cmp.Or(e.FirstChunkSize, e.ChunkSize), e.ChunkSize), "1"
	head, more := "", "false"
	recipients := `SELECT user_id FROM kept GROUP BY user_id`
	switch {
	case e.Head > 0:
		// The first Head devices (no more than a chunk), and one more to
		// tell whether there are more: the audience is not read further.
		n := min(e.Head, e.ChunkSize)
		audience = `SELECT * FROM (` + audience + `) a ORDER BY a.id LIMIT ` + param(n+1)
		firstSize, head = n, ` WHERE n < `+strconv.Itoa(n)
		more = `(SELECT count(*) FROM chunked) > ` + strconv.Itoa(n)
	case e.After > 0:
		// The rest after a head: chunks of ChunkSize from chunk 1.
		audience = `SELECT * FROM (` + audience + `) a WHERE a.id > ` + param(e.After)
		firstSize, number = e.ChunkSize, "2"
		// Its users may have devices in the head too, in its ledger rows
		// or its snapshot: the union counts each user once.
		recipients = `SELECT user_id FROM kept UNION ` + headUsers(message)
	}
	first := param(firstSize)
	// Within a due instant, the first chunk is the first FirstChunkSize
	// devices, and each next one the next ChunkSize (cut is -1 for the
	// first). One due instant: that is the chunk's number. Several (a
	// local-time message): chunks are numbered across the waves in the
	// order of their instants.
	cut := `CASE WHEN n < ` + first + ` THEN -1 ELSE (n - ` + first + `) / ` + size + ` END`
	chunk := `(` + cut + ` + ` + number + `)::integer`
	var due, passed, waves string
	if len(e.Zones) == 0 {
		due, passed = param(e.DispatchAt)+`::timestamptz`, `false`
	} else {
		chunk = `(dense_rank() OVER (ORDER BY passed, due_at, ` + cut + `) - 1)::integer`
		due, passed, waves = `w.due_at`, `w.passed`, `
			JOIN unnest(`+param(e.Zones)+`::text[], `+param(e.DueAts)+`::timestamptz[], `+param(e.Passed)+`::boolean[]) AS w(zone, due_at, passed)
			  ON w.zone = coalesce(a.timezone, '')`
	}
	locale, localizations := `NULL::text`, ``
	if len(e.Locales) > 0 {
		locale, localizations = `l.key`, `
			LEFT JOIN unnest(`+param(e.Locales)+`::text[], `+param(e.Keys)+`::text[]) AS l(locale, key)
			       ON l.locale = coalesce(a.locale, '')`
	}
	write := `
		ins AS (
			INSERT INTO deliveries (message_id, device_id, user_id, channel, chunk, due_at, status, locale)
			SELECT ` + message + `::bigint, id, user_id, channel, chunk, due_at,
			       CASE WHEN passed THEN 'expired' ELSE 'pending' END, locale
			FROM kept
			RETURNING chunk, due_at, device_id
		),
		written AS (
			SELECT chunk, due_at, count(*)::integer AS n, min(device_id) AS first, max(device_id) AS last
			FROM ins
			GROUP BY chunk, due_at
		)`
	if e.Snapshot {
		// What is due goes into its chunk's snapshot, one row a chunk;
		// only what expired at once is a ledger row. The ids are in no
		// particular order (every reader orders or looks them up), so the
		// aggregate needs no sort of its own: 0.6 s of a million-device
		// POST. The locales are aggregated beside them, in the same order.
		locales := `NULL::text[]`
		if len(e.Locales) > 0 {
			locales = `array_agg(locale)`
		}
		write = `
		ins AS (
			INSERT INTO deliveries (message_id, device_id, user_id, channel, chunk, due_at, status, locale)
			SELECT ` + message + `::bigint, id, user_id, channel, chunk, due_at, 'expired', locale
			FROM kept
			WHERE passed
			RETURNING chunk, due_at, device_id
		),
		snap AS (
			INSERT INTO chunk_devices (message_id, chunk, due_at, first_device, last_device, devices, locales)
			SELECT ` + message + `::bigint, chunk, due_at, min(id), max(id), array_agg(id), ` + locales + `
			FROM kept
			WHERE NOT passed
			GROUP BY chunk, due_at
			RETURNING chunk, due_at, cardinality(devices) AS n, first_device AS first, last_device AS last
		),
		written AS (
			SELECT chunk, due_at, count(*)::integer AS n, min(device_id) AS first, max(device_id) AS last
			FROM ins
			GROUP BY chunk, due_at
			UNION ALL
			SELECT chunk, due_at, n, first, last FROM snap
		)`
	}
	rows, err := q.Query(ctx, `
		WITH audience AS (`+audience+`),
		placed AS (
			SELECT a.id, a.user_id, a.channel, `+due+` AS due_at, `+passed+` AS passed, `+locale+` AS locale
			FROM audience a`+waves+localizations+`
		),
		numbered AS (
			SELECT p.*, row_number() OVER (PARTITION BY p.passed, p.due_at ORDER BY p.id) - 1 AS n
			FROM placed p
		),
		chunked AS (
			SELECT n.id, n.user_id, n.channel, n.due_at, n.passed, n.locale, n.n,
			       CASE WHEN n.passed THEN -1 ELSE `+chunk+` END AS chunk
			FROM numbered n
		),
		kept AS (
			SELECT * FROM chunked`+head+`
		),`+write+`
		SELECT chunk, due_at, n, first, last,
		       (SELECT count(*) FROM (`+recipients+`) u)::integer,
		       `+more+`
		FROM written
		ORDER BY chunk`, args...)
	return readExpanded(rows, err)
}

// statementArgs are the parameters of a statement being written.
type statementArgs []any

// add appends v and returns its placeholder.
func (a *statementArgs) add(v any) string {
	*a = append(*a, v)
	return "$" + strconv.Itoa(len(*a))
}

// headUsers selects the users of a message's head (message is its
// placeholder), in its ledger rows or its snapshot, as they were before
// the statement: the rest's expansion counts its recipients with them.
func headUsers(message string) string {
	return `SELECT user_id FROM deliveries WHERE message_id = ` + message + `::bigint
			UNION SELECT v.user_id FROM chunk_devices c CROSS JOIN unnest(c.devices) AS s(id)
			      JOIN devices v ON v.id = s.id WHERE c.message_id = ` + message + `::bigint`
}

// readExpanded reads an expansion's answer: a row a chunk it wrote (its
// number, due time, devices, first and last device), each with the
// audience's recipients and whether a head left devices unwritten.
func readExpanded(rows pgx.Rows, err error) (Expanded, error) {
	if err != nil {
		return Expanded{}, fmt.Errorf("write the ledger: %w", err)
	}
	defer rows.Close()
	var out Expanded
	for rows.Next() {
		var c ExpandedChunk
		if err := rows.Scan(&c.Chunk, &c.DueAt, &c.Devices, &c.FirstDevice, &c.LastDevice, &out.Recipients, &out.More); err != nil {
			return Expanded{}, err
		}
		out.Chunks = append(out.Chunks, c)
	}
	if err := rows.Err(); err != nil {
		return Expanded{}, fmt.Errorf("write the ledger: %w", err)
	}
	return out, nil
}
