package store

import (
	"context"
	"errors"
	"fmt"

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
//
// A step that queues other than one statement, or asks for another statement's answer than the
// one it queued, is a programming error: Pipeline refuses it rather than hand a step its
// neighbour's answer.
func Pipeline(ctx context.Context, tx pgx.Tx, steps ...Step) error {
	batch := &pgx.Batch{}
	queue := &queued{batch: batch}
	for i, step := range steps {
		before := batch.Len()
		_ = step(queue)
		if batch.Len() != before+1 {
			return fmt.Errorf("store: pipeline step %d queued %d statements, not one", i, batch.Len()-before)
		}
	}
	results := tx.SendBatch(ctx, batch)
	answers := &answered{results: results, sql: queue.sql}
	var first error
	for i, step := range steps {
		answers.step, answers.asked = i, 0
		err := step(answers)
		if err == nil && answers.asked != 1 {
			err = fmt.Errorf("store: pipeline step %d asked for %d answers, not one", i, answers.asked)
		}
		if err != nil {
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

// queued takes each statement into the batch, and keeps its text to check the answer's.
type queued struct {
	batch *pgx.Batch
	sql   []string
}

func (q *queued) queue(sql string, args []any) {
	q.batch.Queue(sql, args...)
	q.sql = append(q.sql, sql)
}

func (q *queued) Exec(_ context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	q.queue(sql, args)
	return pgconn.CommandTag{}, nil
}

func (q *queued) Query(_ context.Context, sql string, args ...any) (pgx.Rows, error) {
	q.queue(sql, args)
	return nil, errQueued
}

func (q *queued) QueryRow(_ context.Context, sql string, args ...any) pgx.Row {
	q.queue(sql, args)
	return queuedRow{}
}

type queuedRow struct{}

func (queuedRow) Scan(...any) error { return errQueued }

// answered hands each step its statement's answer from the batch, in queue order, after checking
// that the step asks for the statement it queued.
type answered struct {
	results pgx.BatchResults
	sql     []string
	step    int
	asked   int
}

func (a *answered) check(sql string) error {
	a.asked++
	if a.asked != 1 || a.sql[a.step] != sql {
		return fmt.Errorf("store: pipeline step %d asked for another statement's answer than the one it queued", a.step)
	}
	return nil
}

func (a *answered) Exec(_ context.Context, sql string, _ ...any) (pgconn.CommandTag, error) {
	if err := a.check(sql); err != nil {
		return pgconn.CommandTag{}, err
	}
	return a.results.Exec()
}

func (a *answered) Query(_ context.Context, sql string, _ ...any) (pgx.Rows, error) {
	if err := a.check(sql); err != nil {
		return nil, err
	}
	return a.results.Query()
}

func (a *answered) QueryRow(_ context.Context, sql string, _ ...any) pgx.Row {
	if err := a.check(sql); err != nil {
		return errRow{err}
	}
	return a.results.QueryRow()
}

type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }
