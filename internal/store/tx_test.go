package store_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/store"
	"github.com/takoform/terraform-provider-takoform/internal/testdb"
)

// tracedPool is a one-connection pool on a fresh database with a probe table, counting round trips.
func tracedPool(t *testing.T) (*pgxpool.Pool, *testdb.RoundTrips) {
	t.Helper()
	pool, trips := testdb.CountedPool(t, 1)
	_, err := pool.Exec(context.Background(), "CREATE TABLE probe (n integer PRIMARY KEY)")
	require.NoError(t, err)
	trips.Take()
	return pool, trips
}

func probeRows(t *testing.T, pool *pgxpool.Pool) []int {
	t.Helper()
	rows, err := pool.Query(context.Background(), "SELECT n FROM probe ORDER BY n")
	require.NoError(t, err)
	ns, err := pgx.CollectRows(rows, pgx.RowTo[int])
	require.NoError(t, err)
	return ns
}

// idle asserts that the pool's connection came back out of any transaction.
func idle(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	conn, err := pool.Acquire(context.Background())
	require.NoError(t, err)
	defer conn.Release()
	require.Equal(t, byte('I'), conn.Conn().PgConn().TxStatus())
}

// TestATransactionSpendsNoRoundTripOnBeginOrCommit: BEGIN travels with the first statement and
// COMMIT with the deferred last one, so three statements are three round trips, and all of them
// commit, in order.
func TestATransactionSpendsNoRoundTripOnBeginOrCommit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, trips := tracedPool(t)
	var seen int
	err := store.WithTx(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "INSERT INTO probe (n) VALUES ($1)", 1); err != nil {
			return err
		}
		if err := tx.QueryRow(ctx, "SELECT count(*) FROM probe WHERE n > $1", 0).Scan(&seen); err != nil {
			return err
		}
		_, err := store.Deferred(tx).Exec(ctx, "INSERT INTO probe (n) VALUES ($1)", 2)
		return err
	})
	require.NoError(t, err)
	require.Equal(t, int64(3), trips.Take(), "the insert with BEGIN, the count, the deferred insert with COMMIT")
	require.Equal(t, 1, seen)
	require.Equal(t, []int{1, 2}, probeRows(t, pool))
	idle(t, pool)
}

// TestAFailingDeferredStatementFailsTheCommitAndKeepsNothing: the error of a statement deferred to
// COMMIT is Commit's, no write of the transaction stays, and the connection is idle again.
func TestAFailingDeferredStatementFailsTheCommitAndKeepsNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := tracedPool(t)
	err := store.WithTx(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "INSERT INTO probe (n) VALUES ($1)", 1); err != nil {
			return err
		}
		_, err := store.Deferred(tx).Exec(ctx, "INSERT INTO probe (n) VALUES ($1)", 1) // a duplicate key
		return err
	})
	var pgErr *pgconn.PgError
	require.True(t, errors.As(err, &pgErr), "%v", err)
	require.Equal(t, "23505", pgErr.Code)
	require.Empty(t, probeRows(t, pool))
	idle(t, pool)

	// A deferred statement runs before the next statement, which answers its error.
	err = store.WithTx(ctx, pool, func(tx pgx.Tx) error {
		if _, err := store.Deferred(tx).Exec(ctx, "INSERT INTO probe (n) VALUES ($1), ($1)", 5); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, "INSERT INTO probe (n) VALUES ($1)", 6)
		return err
	})
	require.True(t, errors.As(err, &pgErr), "%v", err)
	require.Empty(t, probeRows(t, pool))
	idle(t, pool)
}

// TestARolledBackTransactionDropsItsDeferredStatements: a transaction that ends in an error keeps
// neither what it sent nor what it deferred, and its connection goes back to the pool; one that
// sent nothing spends no round trip at all.
func TestARolledBackTransactionDropsItsDeferredStatements(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, trips := tracedPool(t)
	var backend, after int
	require.NoError(t, pool.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&backend))
	refused := errors.New("refused")
	err := store.WithTx(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "INSERT INTO probe (n) VALUES ($1)", 1); err != nil {
			return err
		}
		if _, err := store.Deferred(tx).Exec(ctx, "INSERT INTO probe (n) VALUES ($1)", 2); err != nil {
			return err
		}
		return refused
	})
	require.ErrorIs(t, err, refused)
	require.Empty(t, probeRows(t, pool))
	idle(t, pool)
	// The rollback was sent: the pool kept the connection rather than closing one left in a
	// transaction.
	require.NoError(t, pool.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&after))
	require.Equal(t, backend, after)

	trips.Take()
	require.NoError(t, store.WithTx(ctx, pool, func(pgx.Tx) error { return nil }))
	require.Zero(t, trips.Take())
}

// TestASavepointUndoesOnlyItsOwnWrites: a savepoint rolled back undoes what was written since it
// began, including a failed statement, and the transaction goes on; one released keeps its writes.
func TestASavepointUndoesOnlyItsOwnWrites(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := tracedPool(t)
	err := store.WithTx(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "INSERT INTO probe (n) VALUES ($1)", 1); err != nil {
			return err
		}
		sp, err := tx.Begin(ctx)
		if err != nil {
			return err
		}
		if _, err := sp.Exec(ctx, "INSERT INTO probe (n) VALUES ($1)", 2); err != nil {
			return err
		}
		if _, err := sp.Exec(ctx, "INSERT INTO probe (n) VALUES ($1)", 1); err == nil {
			return errors.New("a duplicate key was accepted")
		}
		if err := sp.Rollback(ctx); err != nil {
			return err
		}
		kept, err := tx.Begin(ctx)
		if err != nil {
			return err
		}
		if _, err := kept.Exec(ctx, "INSERT INTO probe (n) VALUES ($1)", 3); err != nil {
			return err
		}
		if err := kept.Commit(ctx); err != nil {
			return err
		}
		_, err = tx.Exec(ctx, "INSERT INTO probe (n) VALUES ($1)", 4)
		return err
	})
	require.NoError(t, err)
	require.Equal(t, []int{1, 3, 4}, probeRows(t, pool))
	idle(t, pool)
}

// TestAFailedFirstStatementEndsTheTransaction: a first statement that fails once it runs (BEGIN,
// sent with it, has run) leaves the transaction failed; the transaction is rolled back on the same
// connection, which goes back to the pool and serves the next transaction. (A statement PostgreSQL
// refuses to parse fails before BEGIN runs, and proves nothing here.)
func TestAFailedFirstStatementEndsTheTransaction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := tracedPool(t)
	var backend, after int
	require.NoError(t, pool.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&backend))
	err := store.WithTx(ctx, pool, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, "INSERT INTO probe (n) VALUES ($1)", nil) // a NOT NULL column
		return err
	})
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, "23502", pgErr.Code, "the statement ran and failed: %v", err)
	idle(t, pool)
	require.NoError(t, pool.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&after))
	require.Equal(t, backend, after, "the failed transaction was rolled back, not left for the pool to close its connection")
	err = store.WithTx(ctx, pool, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, "SELECT n FROM probe WHERE n > $1", 0)
		if err != nil {
			return err
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		_, err = tx.Exec(ctx, "INSERT INTO probe (n) VALUES ($1)", 9)
		return err
	})
	require.NoError(t, err)
	require.Equal(t, []int{9}, probeRows(t, pool))
}
