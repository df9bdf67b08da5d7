package store_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/store"
	"github.com/takoform/terraform-provider-takoform/internal/testdb"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// TestLockTimeoutIsContention: a transaction that gives up waiting for a lock comes back as the
// retryable ErrContention, never as a bare database error.
func TestLockTimeoutIsContention(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	holder, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer holder.Rollback(ctx)
	_, err = holder.Exec(ctx, "SELECT pg_advisory_xact_lock(42)")
	require.NoError(t, err)
	err = store.WithTx(ctx, pool, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, "SET LOCAL lock_timeout = '50ms'; SELECT pg_advisory_xact_lock(42)")
		return err
	})
	require.ErrorIs(t, err, store.ErrContention)
}

// TestUnreachableDatabaseIsUnavailable: failing to reach PostgreSQL is ErrUnavailable.
func TestUnreachableDatabaseIsUnavailable(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := store.Open(ctx, "postgres://nobody@127.0.0.1:1/none?connect_timeout=2")
	require.Error(t, err)
	require.True(t, errors.Is(store.Classify(err), store.ErrUnavailable), "%v", err)
}
