package ratebudget_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/ratebudget"
	"github.com/takoform/terraform-provider-takoform/internal/testdb"
)

func TestMain(m *testing.M) { testdb.Main(m) }

func setup(t *testing.T, capacity, perSecond float64) (*ratebudget.Budget, *pgxpool.Pool) {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(testdb.URL(t))
	require.NoError(t, err)
	cfg.MaxConns = 16
	db, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(db.Close)
	return &ratebudget.Budget{DB: db, Capacity: capacity, PerSecond: perSecond}, db
}

// advance moves database time (db_now) for every connection.
func advance(t *testing.T, db *pgxpool.Pool, d time.Duration) {
	t.Helper()
	_, err := db.Exec(context.Background(), `INSERT INTO clock_skew (skew) VALUES (make_interval(secs => $1)) ON CONFLICT (singleton) DO UPDATE SET skew = clock_skew.skew + excluded.skew`, d.Seconds())
	require.NoError(t, err)
}

func TestTheBucketTakesUpToItsCapacityThenAnswersTheWaitAndTakesNothing(t *testing.T) {
	t.Parallel()
	b, db := setup(t, 5, 0.5)
	ctx := context.Background()
	start := time.Now()
	wait, err := b.Take(ctx, "cf", 5)
	require.NoError(t, err)
	require.Zero(t, wait)
	wait, err = b.Take(ctx, "cf", 1)
	require.NoError(t, err)
	// One call refills in 2 s, less what the clock refilled between the two takes (a loaded
	// machine may take a while between them).
	require.LessOrEqual(t, wait, 2*time.Second, "one call refills in 2 s")
	require.GreaterOrEqual(t, wait, 2*time.Second-time.Since(start)-50*time.Millisecond, "one call refills in 2 s")
	wait, err = b.Take(ctx, "other", 5)
	require.NoError(t, err)
	require.Zero(t, wait, "each installation has its own bucket")
	advance(t, db, 3*time.Second)
	wait, err = b.Take(ctx, "cf", 1)
	require.NoError(t, err)
	require.Zero(t, wait)
}

func TestA429BlocksTheInstallationUntilItsRetryAfterHasPassed(t *testing.T) {
	t.Parallel()
	b, db := setup(t, 100, 10)
	ctx := context.Background()
	require.NoError(t, b.Block(ctx, "cf", 5*time.Minute))
	wait, err := b.Take(ctx, "cf", 1)
	require.NoError(t, err)
	require.InDelta(t, 5*time.Minute, wait, float64(2*time.Second), "blocked, however full the bucket was")
	// A shorter Retry-After never shortens the block.
	require.NoError(t, b.Block(ctx, "cf", time.Second))
	wait, err = b.Take(ctx, "cf", 1)
	require.NoError(t, err)
	require.Greater(t, wait, 4*time.Minute)
	advance(t, db, 5*time.Minute+time.Second)
	wait, err = b.Take(ctx, "cf", 1)
	require.NoError(t, err)
	require.Zero(t, wait, "the bucket refills from the block's end")
}

// Takers on many connections (Host replicas) never take more than the bucket holds.
func TestConcurrentTakersNeverTakeMoreThanTheBucketHolds(t *testing.T) {
	t.Parallel()
	b, _ := setup(t, 10, 0.001)
	var taken, failed atomic.Int64
	var wg sync.WaitGroup
	start := make(chan struct{})
	for range 48 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			wait, err := b.Take(context.Background(), "cf", 1)
			switch {
			case err != nil:
				failed.Add(1)
			case wait == 0:
				taken.Add(1)
			}
		}()
	}
	close(start)
	wg.Wait()
	require.Zero(t, failed.Load(), "takes that failed")
	require.EqualValues(t, 10, taken.Load())
}
