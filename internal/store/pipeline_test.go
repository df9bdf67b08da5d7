package store_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/store"
	"github.com/takoform/terraform-provider-takoform/internal/testdb"
)

// TestPipelineAnswersEachStepInOrder: the steps' statements run in order in the transaction and
// each step reads its own statement's answer (a count after an insert sees it; rows scan into the
// step that asked for them).
func TestPipelineAnswersEachStepInOrder(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	_, err := pool.Exec(ctx, "CREATE TABLE probe (n integer PRIMARY KEY)")
	require.NoError(t, err)
	var before, after int
	var listed []int
	err = store.WithTx(ctx, pool, func(tx pgx.Tx) error {
		return store.Pipeline(ctx, tx,
			func(db store.DBTX) error { return db.QueryRow(ctx, "SELECT count(*) FROM probe").Scan(&before) },
			func(db store.DBTX) error {
				_, err := db.Exec(ctx, "INSERT INTO probe (n) VALUES ($1), ($2)", 7, 3)
				return err
			},
			func(db store.DBTX) error { return db.QueryRow(ctx, "SELECT count(*) FROM probe").Scan(&after) },
			func(db store.DBTX) error {
				rows, err := db.Query(ctx, "SELECT n FROM probe ORDER BY n")
				if err != nil {
					return err
				}
				listed, err = pgx.CollectRows(rows, pgx.RowTo[int])
				return err
			})
	})
	require.NoError(t, err)
	require.Equal(t, 0, before)
	require.Equal(t, 2, after)
	require.Equal(t, []int{3, 7}, listed)
}

// TestPipelineRefusalEndsTheTransaction: a step that refuses on its answer is the pipeline's
// error even though the statements after it already ran, and the transaction that ends with the
// refusal leaves none of them; a statement that fails is the error too.
func TestPipelineRefusalEndsTheTransaction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	_, err := pool.Exec(ctx, "CREATE TABLE probe (n integer PRIMARY KEY)")
	require.NoError(t, err)
	refused := errors.New("over the ceiling")
	err = store.WithTx(ctx, pool, func(tx pgx.Tx) error {
		return store.Pipeline(ctx, tx,
			func(db store.DBTX) error {
				var n int
				if err := db.QueryRow(ctx, "SELECT 41 + 1").Scan(&n); err != nil {
					return err
				}
				if n >= 42 {
					return refused
				}
				return nil
			},
			func(db store.DBTX) error {
				_, err := db.Exec(ctx, "INSERT INTO probe (n) VALUES (1)")
				return err
			})
	})
	require.ErrorIs(t, err, refused)
	var n int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM probe").Scan(&n))
	require.Zero(t, n, "the insert queued after the refusal was rolled back")

	err = store.WithTx(ctx, pool, func(tx pgx.Tx) error {
		return store.Pipeline(ctx, tx,
			func(db store.DBTX) error {
				_, err := db.Exec(ctx, "INSERT INTO probe (n) VALUES (1), (1)")
				return err
			},
			func(db store.DBTX) error {
				_, err := db.Exec(ctx, "INSERT INTO probe (n) VALUES (2)")
				return err
			})
	})
	require.True(t, store.IsUniqueViolation(err, "probe_pkey"), "%v", err)
}

// TestPipelineRefusesAStepThatIsNotOneStatement: a step that queues two statements, or none, or
// asks on its second call for another statement than the one it queued, is refused instead of
// being handed a neighbour's answer.
func TestPipelineRefusesAStepThatIsNotOneStatement(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	one := func(db store.DBTX) error { var n int; return db.QueryRow(ctx, "SELECT 1").Scan(&n) }
	for name, tc := range map[string]struct {
		step store.Step
		want string
	}{
		"two statements": {func(db store.DBTX) error {
			_, _ = db.Exec(ctx, "SELECT 1")
			_, err := db.Exec(ctx, "SELECT 2")
			return err
		}, "queued 2 statements"},
		"no statement": {func(store.DBTX) error { return nil }, "queued 0 statements"},
		"another answer": {func() store.Step {
			calls := 0
			return func(db store.DBTX) error {
				calls++
				var n int
				if calls == 1 {
					return db.QueryRow(ctx, "SELECT 1").Scan(&n)
				}
				return db.QueryRow(ctx, "SELECT 2").Scan(&n)
			}
		}(), "another statement's answer"},
	} {
		err := store.WithTx(ctx, pool, func(tx pgx.Tx) error { return store.Pipeline(ctx, tx, one, tc.step, one) })
		require.ErrorContains(t, err, tc.want, name)
	}
}
