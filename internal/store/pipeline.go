package store

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// DBTX is what the generated queries run on (dbsqlc.DBTX's methods).
type DBTX interface {
	Exec(context.Context, string, ...any) (pgconn.CommandTag, error)
	Query(context.Context, string, ...any) (pgx.Rows, error)
	QueryRow(context.Context, string, ...any) pgx.Row
}

// A Step is one generated statement of a pipeline, written as an ordinary call on db: Pipeline
// calls it twice, once to queue the statement and once to read its answer. A step runs exactly one
// statement and decides nothing before it has its answer; what it returns on the first call is
// ignored.
type Step func(db DBTX) error

// Pipeline sends the steps' statements in tx in one round trip (a pgx batch) and reads their
// answers in order, returning the first step's error. The statements run in order whatever their
// answers: a step that refuses (a quota past its ceiling) must be one whose refusal ends the
// transaction, so that the statements after it are rolled back with it.
func Pipeline(ctx context.Context, tx pgx.Tx, steps ...Step) error {
	batch := &pgx.Batch{}
	queue := queued{batch: batch}
	for _, step := range steps {
		_ = step(queue)
	}
	results := tx.SendBatch(ctx, batch)
	answers := answered{results: results}
	var first error
	for _, step := range steps {
		if err := step(answers); err != nil {
			first = err
			break
		}
	}
	if err := results.Close(); first == nil {
		first = err
	}
	return first
}

// errQueued is what a queued statement answers on the first call: its answer comes later.
var errQueued = errors.New("store: statement queued, not answered yet")

// queued takes each statement into the batch.
type queued struct{ batch *pgx.Batch }

func (q queued) Exec(_ context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	q.batch.Queue(sql, args...)
	return pgconn.CommandTag{}, nil
}

func (q queued) Query(_ context.Context, sql string, args ...any) (pgx.Rows, error) {
	q.batch.Queue(sql, args...)
	return nil, errQueued
}

func (q queued) QueryRow(_ context.Context, sql string, args ...any) pgx.Row {
	q.batch.Queue(sql, args...)
	return queuedRow{}
}

type queuedRow struct{}

func (queuedRow) Scan(...any) error { return errQueued }

// answered hands each statement its answer from the batch, in queue order.
type answered struct{ results pgx.BatchResults }

func (a answered) Exec(context.Context, string, ...any) (pgconn.CommandTag, error) {
	return a.results.Exec()
}

func (a answered) Query(context.Context, string, ...any) (pgx.Rows, error) {
	return a.results.Query()
}

func (a answered) QueryRow(context.Context, string, ...any) pgx.Row {
	return a.results.QueryRow()
}
