package db_test

import (
	"context"
	"io"
	"log/slog"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sync/errgroup"

	"github.com/heraldpush/herald/db"
	"github.com/heraldpush/herald/db/dbtest"
)

func discardLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func TestMigrateFromEmpty(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tdb := dbtest.NewEmpty(t)

	err := db.CheckMigrated(ctx, tdb.Pool)
	require.ErrorIs(t, err, db.ErrNotMigrated)

	res, err := db.Migrate(ctx, tdb.Pool, discardLogger())
	require.NoError(t, err)
	require.NotEmpty(t, res.RiverApplied)
	all, err := db.Migrations()
	require.NoError(t, err)
	require.Len(t, res.HeraldApplied, len(all))
	require.NoError(t, db.CheckMigrated(ctx, tdb.Pool))

	// A second run finds nothing to do.
	res, err = db.Migrate(ctx, tdb.Pool, discardLogger())
	require.NoError(t, err)
	require.Empty(t, res.RiverApplied)
	require.Empty(t, res.HeraldApplied)
}

func TestMigrateConcurrently(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tdb := dbtest.NewEmpty(t)

	// Four migrators at once, as when several Herald processes start with
	// --migrate together: all succeed and each migration is applied once.
	results := make([]db.MigrateResult, 4)
	var g errgroup.Group
	for i := range results {
		g.Go(func() error {
			var err error
			results[i], err = db.Migrate(ctx, tdb.Pool, discardLogger())
			return err
		})
	}
	require.NoError(t, g.Wait())

	var herald, river int
	for _, r := range results {
		herald += len(r.HeraldApplied)
		river += len(r.RiverApplied)
	}
	all, err := db.Migrations()
	require.NoError(t, err)
	require.Equal(t, len(all), herald)
	require.Positive(t, river)
	require.NoError(t, db.CheckMigrated(ctx, tdb.Pool))
}

func TestCheckMigratedNoticesMissingHeraldMigration(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tdb := dbtest.New(t)
	require.NoError(t, db.CheckMigrated(ctx, tdb.Pool))

	_, err := tdb.Pool.Exec(ctx, "DELETE FROM herald_migration WHERE version = 1")
	require.NoError(t, err)
	err = db.CheckMigrated(ctx, tdb.Pool)
	require.ErrorIs(t, err, db.ErrNotMigrated)
	require.Contains(t, err.Error(), "0001_initial.sql")
}
