package jobs

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// lazyPool is a pool that never connects unless asked to: what a service's
// constructor checks is only that it was given one.
func lazyPool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), "postgres://herald@127.0.0.1:1/none")
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// TestServicesTakeTheDefaults: each background service built with nothing
// but what it requires holds the defaults of defaults.go, filled once by its
// constructor.
func TestServicesTakeTheDefaults(t *testing.T) {
	t.Parallel()
	pool := lazyPool(t)
	clock := NewClock(pool, discard)

	waker, err := NewWaker(&WakerConfig{Pool: pool, Clock: clock, Logger: discard})
	require.NoError(t, err)
	require.Equal(t, DefaultWakeEvery, waker.cfg.Every)
	require.Equal(t, DefaultWakeAhead, waker.cfg.Ahead)
	// A look ahead no longer than the interval would miss instants.
	waker, err = NewWaker(&WakerConfig{Pool: pool, Clock: clock, Logger: discard, Every: 3 * time.Second, Ahead: time.Second})
	require.NoError(t, err)
	require.Equal(t, 6*time.Second, waker.cfg.Ahead)

	promoter, err := NewPromoter(&PromoterConfig{Pool: pool, Logger: discard})
	require.NoError(t, err)
	require.Equal(t, DefaultLookahead, promoter.cfg.Lookahead)
	require.Equal(t, DefaultPromoteEvery, promoter.cfg.Interval)

	status, err := NewStatusReporter(&StatusReporterConfig{Pool: pool, Logger: discard, ProcessID: "p", Breakers: NewBreakers(BreakerConfig{})})
	require.NoError(t, err)
	require.Equal(t, DefaultStatusEvery, status.cfg.Interval)

	retainer, err := NewRetainer(&RetainerConfig{Pool: pool, Logger: discard})
	require.NoError(t, err)
	require.Equal(t, RetainerConfig{
		Pool: pool, Logger: discard, Retention: DefaultRetention, DeviceRetention: DefaultDeviceRetention, AuditRetention: DefaultAuditRetention,
		BatchRows: DefaultRetainBatchRows, BatchMessages: DefaultRetainBatchMessages, Budget: DefaultRetainBudget,
		CompactAbove: DefaultCompactAbove,
	}, retainer.cfg)

	materializer, err := NewMaterializer(&MaterializerConfig{Pool: pool, Logger: discard})
	require.NoError(t, err)
	require.Equal(t, DefaultChunkSize, materializer.cfg.ChunkSize)
	require.Equal(t, DefaultScheduleLead, materializer.cfg.Lead)
	require.Equal(t, ScheduleLimits{}.WithDefaults(), materializer.cfg.Limits)

	reconciler, err := NewReconciler(&ReconcilerConfig{Pool: pool, Logger: discard})
	require.NoError(t, err)
	require.Equal(t, DefaultReconcileGrace, reconciler.cfg.Grace)
	require.Equal(t, DefaultChunkTimeout+recordTimeout, reconciler.cfg.AttemptSpan)
}

// TestServicesNameTheSettingTheyRefuse: a service's constructor refuses a
// configuration it cannot work with, naming the field.
func TestServicesNameTheSettingTheyRefuse(t *testing.T) {
	t.Parallel()
	pool := lazyPool(t)
	clock := NewClock(pool, discard)
	for _, tc := range []struct {
		build func() error
		want  string
	}{
		{func() error { _, err := NewWaker(&WakerConfig{Clock: clock, Logger: discard}); return err }, "WakerConfig.Pool is required"},
		{func() error { _, err := NewWaker(&WakerConfig{Pool: pool, Logger: discard}); return err }, "WakerConfig.Clock is required"},
		{func() error {
			_, err := NewWaker(&WakerConfig{Pool: pool, Clock: clock, Logger: discard, Every: -time.Second})
			return err
		}, "WakerConfig.Every is -1s"},
		{func() error { _, err := NewPromoter(&PromoterConfig{Pool: pool}); return err }, "PromoterConfig.Logger is required"},
		{func() error {
			_, err := NewPromoter(&PromoterConfig{Pool: pool, Logger: discard, Interval: -time.Second})
			return err
		}, "PromoterConfig.Interval is -1s"},
		{func() error {
			_, err := NewStatusReporter(&StatusReporterConfig{Pool: pool, Logger: discard, ProcessID: "p"})
			return err
		}, "StatusReporterConfig.Breakers is required"},
		{func() error {
			_, err := NewStatusReporter(&StatusReporterConfig{Pool: pool, Logger: discard, Breakers: NewBreakers(BreakerConfig{})})
			return err
		}, "StatusReporterConfig.ProcessID is required"},
		{func() error { _, err := NewRetainer(&RetainerConfig{Logger: discard}); return err }, "RetainerConfig.Pool is required"},
		{func() error {
			_, err := NewRetainer(&RetainerConfig{Pool: pool, Logger: discard, BatchRows: -1})
			return err
		}, "RetainerConfig.BatchRows is -1"},
		{func() error {
			_, err := NewMaterializer(&MaterializerConfig{Pool: pool, Logger: discard, Limits: ScheduleLimits{MinInterval: -time.Minute}})
			return err
		}, "MaterializerConfig.Limits"},
		{func() error { _, err := NewReconciler(&ReconcilerConfig{Pool: pool}); return err }, "ReconcilerConfig.Logger is required"},
		{func() error {
			_, err := NewReconciler(&ReconcilerConfig{Pool: pool, Logger: discard, Grace: -time.Minute})
			return err
		}, "ReconcilerConfig.Grace is -1m0s"},
		{func() error {
			_, err := NewReconciler(&ReconcilerConfig{Pool: pool, Logger: discard, AttemptSpan: -time.Second})
			return err
		}, "ReconcilerConfig.AttemptSpan is -1s"},
		{func() error {
			_, err := NewRetainer(&RetainerConfig{Pool: pool, Logger: discard, CompactAbove: -1})
			return err
		}, "RetainerConfig.CompactAbove is -1"},
	} {
		err := tc.build()
		require.Error(t, err, tc.want)
		require.Contains(t, err.Error(), tc.want)
	}
}
