package db_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/heraldpush/herald/db"
	"github.com/heraldpush/herald/db/dbtest"
)

func TestCheckSchema(t *testing.T) {
	t.Parallel()
	for name, ok := range map[string]bool{
		"herald": true, "public": true, "_h2": true, "herald_prod_2": true,
		"": false, "Herald": false, "2herald": false, "her-ald": false, `"x"`: false, "a.b": false,
		"pg_herald": false, "information_schema": false,
		"a_name_of_forty_seven_characters_is_one_too_lon": false, "a_name_of_forty_six_characters_is_just_allowed": true,
	} {
		err := db.CheckSchema(name)
		require.Equal(t, ok, err == nil, "%q: %v", name, err)
	}
	_, err := db.Open(context.Background(), "postgres://localhost/x", db.PoolConfig{Schema: "Herald"})
	require.ErrorContains(t, err, `schema "Herald"`)
}

// Herald's tables are in its schema, beside an application's own tables of
// the same names in public, which its pools never see.
func TestMigrateKeepsToItsSchema(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tdb := dbtest.NewEmpty(t)
	_, err := tdb.Pool.Exec(ctx, `CREATE TABLE public.messages (body text); CREATE TABLE public.users (name text);
		INSERT INTO public.users VALUES ('the application''s')`)
	require.NoError(t, err)

	_, err = db.Migrate(ctx, tdb.Pool, discardLogger())
	require.NoError(t, err)
	require.NoError(t, db.CheckMigrated(ctx, tdb.Pool))
	require.Equal(t, db.DefaultSchema, db.PoolSchema(tdb.Pool))

	var public, herald []string
	require.NoError(t, tdb.Pool.QueryRow(ctx, `SELECT
		array(SELECT tablename FROM pg_tables WHERE schemaname = 'public' ORDER BY 1),
		array(SELECT tablename FROM pg_tables WHERE schemaname = 'herald' ORDER BY 1)`).Scan(&public, &herald))
	require.Equal(t, []string{"messages", "users"}, public)
	require.Contains(t, herald, "messages")
	require.Contains(t, herald, "river_job")
	require.Contains(t, herald, "herald_migration")

	var users int
	require.NoError(t, tdb.Pool.QueryRow(ctx, "SELECT count(*) FROM users").Scan(&users))
	require.Zero(t, users, "Herald's pool sees Herald's users, not the application's")
}
