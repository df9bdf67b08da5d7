package store_test

import (
	"context"
	"errors"
	"runtime"
	"strings"
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

// A write refused because the database is read-only (a primary demoted, or a standby, during a
// failover) is ErrUnavailable, so the Host answers 503 and clients wait it out, not a 500.
func TestAReadOnlyDatabaseIsUnavailable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	err := store.WithTx(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SET TRANSACTION READ ONLY"); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, "INSERT INTO schema_migrations (version, dirty) VALUES (0, false)")
		return err
	})
	require.Error(t, err)
	require.True(t, errors.Is(store.Classify(err), store.ErrUnavailable), "%v", err)
}

// TestThePoolIsSizedToTheMachineUnlessTheURLSaysSo: Open's pool holds a few connections per core
// (more only queue on the database), and pool_max_conns in the URL wins.
func TestThePoolIsSizedToTheMachineUnlessTheURLSaysSo(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	require.Equal(t, int32(max(8, 4*runtime.NumCPU())), store.DefaultMaxConns())
	url := testdb.URL(t)
	pool, err := store.Open(ctx, url)
	require.NoError(t, err)
	defer pool.Close()
	require.Equal(t, store.DefaultMaxConns(), pool.Config().MaxConns)

	sep := "?"
	if strings.Contains(url, "?") {
		sep = "&"
	}
	sized, err := store.Open(ctx, url+sep+"pool_max_conns=3")
	require.NoError(t, err)
	defer sized.Close()
	require.Equal(t, int32(3), sized.Config().MaxConns)
}
