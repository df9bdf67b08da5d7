package store

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Tx is a transaction on one pooled connection that spends no round trip of its own: its BEGIN
// travels in the same batch as its first statements, and its COMMIT in the same batch as the
// statements deferred to it (Deferred). A transaction of three statements the caller waits on,
// the last deferred, is three round trips where pgx's own is five.
//
// Deferred statements run, in order, before whatever the transaction sends next: a later
// statement, a savepoint's end, or the COMMIT. A deferred statement's error is therefore answered
// by that later call, and ends the transaction like any other.
//
// LargeObjects is not supported: nothing here uses large objects.
type Tx struct {
	conn       *pgxpool.Conn
	begun      bool               // BEGIN has been sent
	pending    []*pgx.QueuedQuery // deferred statements not sent yet
	closed     bool
	savepoints int
}

var _ pgx.Tx = (*Tx)(nil)

// Begin takes a connection from pool for a transaction whose BEGIN is sent with its first
// statement.
func Begin(ctx context.Context, pool *pgxpool.Pool) (*Tx, error) {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	return &Tx{conn: conn}, nil
}

// Deferred returns what runs statements for tx at its next round trip instead of now: on a Tx,
// Exec queues the statement and answers an empty command tag, and a statement that returns rows
// is refused (its answer would come too late to read). On any other transaction the statements
// run at once.
func Deferred(tx pgx.Tx) DBTX {
	if t, ok := tx.(*Tx); ok {
		return deferred{t}
	}
	if s, ok := tx.(*savepoint); ok {
		return deferred{s.Tx}
	}
	return tx
}

type deferred struct{ tx *Tx }

var errDeferredRows = errors.New("store: a deferred statement answers no rows; run it at once")

func (d deferred) Exec(_ context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if d.tx.closed {
		return pgconn.CommandTag{}, pgx.ErrTxClosed
	}
	d.tx.pending = append(d.tx.pending, &pgx.QueuedQuery{SQL: sql, Arguments: args})
	return pgconn.CommandTag{}, nil
}

func (d deferred) Query(context.Context, string, ...any) (pgx.Rows, error) {
	return nil, errDeferredRows
}

func (d deferred) QueryRow(context.Context, string, ...any) pgx.Row { return errRow{errDeferredRows} }

// prefixed reports whether the next statement must carry BEGIN or deferred statements.
func (tx *Tx) prefixed() bool { return !tx.begun || len(tx.pending) > 0 }

// send sends b's statements after what must precede them (BEGIN, deferred statements) in one
// batch, and reads those first answers: the results handed back start at b's first statement.
func (tx *Tx) send(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if tx.closed {
		return errResults{pgx.ErrTxClosed}
	}
	if tx.begun && tx.conn.Conn().PgConn().TxStatus() == 'E' {
		// In a failed transaction PostgreSQL parses nothing but its end, and pgx prepares a
		// batch's new statements before it sends them: what is owed (a savepoint's rollback
		// first of all) goes alone.
		for len(tx.pending) > 0 {
			q := tx.pending[0]
			tx.pending = tx.pending[1:]
			if _, err := tx.conn.Exec(ctx, q.SQL, q.Arguments...); err != nil {
				return errResults{err}
			}
		}
	}
	full := &pgx.Batch{}
	if !tx.begun {
		full.Queue("begin")
		tx.begun = true
	}
	full.QueuedQueries = append(full.QueuedQueries, tx.pending...)
	tx.pending = nil
	prefix := full.Len()
	full.QueuedQueries = append(full.QueuedQueries, b.QueuedQueries...)
	results := tx.conn.SendBatch(ctx, full)
	for range prefix {
		if _, err := results.Exec(); err != nil {
			_ = results.Close()
			return errResults{err}
		}
	}
	return results
}

// Exec runs one statement.
func (tx *Tx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if tx.closed {
		return pgconn.CommandTag{}, pgx.ErrTxClosed
	}
	if len(args) == 0 {
		// pgx sends an Exec without arguments in the simple protocol, which allows several
		// statements in one string; a batch would refuse them.
		if err := tx.flush(ctx); err != nil {
			return pgconn.CommandTag{}, err
		}
	}
	if !tx.prefixed() {
		return tx.conn.Exec(ctx, sql, args...)
	}
	b := &pgx.Batch{}
	b.Queue(sql, args...)
	results := tx.send(ctx, b)
	tag, err := results.Exec()
	if cerr := results.Close(); err == nil {
		err = cerr
	}
	return tag, err
}

// Query runs one statement that returns rows.
func (tx *Tx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if tx.closed {
		return nil, pgx.ErrTxClosed
	}
	if !tx.prefixed() {
		return tx.conn.Query(ctx, sql, args...)
	}
	b := &pgx.Batch{}
	b.Queue(sql, args...)
	results := tx.send(ctx, b)
	rows, err := results.Query()
	if err != nil {
		_ = results.Close()
		return nil, err
	}
	return &batchRows{Rows: rows, results: results}, nil
}

// QueryRow runs one statement and answers its first row at Scan.
func (tx *Tx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if tx.closed {
		return errRow{pgx.ErrTxClosed}
	}
	if !tx.prefixed() {
		return tx.conn.QueryRow(ctx, sql, args...)
	}
	rows, err := tx.Query(ctx, sql, args...)
	if err != nil {
		return errRow{err}
	}
	return firstRow{rows}
}

// SendBatch sends b's statements in one round trip, with whatever must precede them.
func (tx *Tx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if tx.closed {
		return errResults{pgx.ErrTxClosed}
	}
	if !tx.prefixed() {
		return tx.conn.SendBatch(ctx, b)
	}
	return tx.send(ctx, b)
}

// flush sends what is owed (BEGIN, deferred statements) on its own.
func (tx *Tx) flush(ctx context.Context) error {
	if !tx.prefixed() {
		return nil
	}
	return tx.send(ctx, &pgx.Batch{}).Close()
}

// CopyFrom copies rows in after what is owed.
func (tx *Tx) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	if tx.closed {
		return 0, pgx.ErrTxClosed
	}
	if err := tx.flush(ctx); err != nil {
		return 0, err
	}
	return tx.conn.CopyFrom(ctx, table, columns, src)
}

// Prepare prepares a statement on the transaction's connection.
func (tx *Tx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	if tx.closed {
		return nil, pgx.ErrTxClosed
	}
	return tx.conn.Conn().Prepare(ctx, name, sql)
}

// LargeObjects is not supported (see Tx).
func (tx *Tx) LargeObjects() pgx.LargeObjects { panic("store: Tx does not support large objects") }

// Conn is the transaction's connection. What is owed is not sent first: use the Tx's own methods.
func (tx *Tx) Conn() *pgx.Conn { return tx.conn.Conn() }

// Begin starts a savepoint, sent with the next statement; its Commit and Rollback are sent the
// same way.
func (tx *Tx) Begin(context.Context) (pgx.Tx, error) {
	if tx.closed {
		return nil, pgx.ErrTxClosed
	}
	tx.savepoints++
	name := fmt.Sprintf("store_sp_%d", tx.savepoints)
	tx.pending = append(tx.pending, &pgx.QueuedQuery{SQL: "savepoint " + name})
	return &savepoint{Tx: tx, name: name}, nil
}

// Commit sends the deferred statements and COMMIT in one round trip, and gives the connection
// back. A transaction that sent nothing commits nothing.
func (tx *Tx) Commit(ctx context.Context) error {
	if tx.closed {
		return pgx.ErrTxClosed
	}
	defer tx.release(ctx)
	if !tx.begun && len(tx.pending) == 0 {
		return nil
	}
	b := &pgx.Batch{}
	b.Queue("commit")
	results := tx.send(ctx, b)
	tag, err := results.Exec()
	if cerr := results.Close(); err == nil {
		err = cerr
	}
	switch {
	case err != nil:
		return err
	case tag.String() == "ROLLBACK":
		return pgx.ErrTxCommitRollback
	}
	return nil
}

// Rollback ends the transaction without its writes (deferred statements are dropped) and gives
// the connection back; after Commit it answers ErrTxClosed.
func (tx *Tx) Rollback(ctx context.Context) error {
	if tx.closed {
		return pgx.ErrTxClosed
	}
	tx.pending = nil
	tx.release(ctx)
	return nil
}

// release ends whatever is still open on the connection and returns it to the pool; a connection
// that cannot be brought back to idle is closed by the pool instead.
func (tx *Tx) release(ctx context.Context) {
	tx.closed = true
	if tx.begun && tx.conn.Conn().PgConn().TxStatus() != 'I' {
		_, _ = tx.conn.Conn().Exec(context.WithoutCancel(ctx), "rollback")
	}
	tx.conn.Release()
}

// savepoint is a pseudo nested transaction of a Tx: its statements are the Tx's.
type savepoint struct {
	*Tx
	name   string
	closed bool
}

func (s *savepoint) Commit(context.Context) error {
	if s.closed {
		return pgx.ErrTxClosed
	}
	return s.end("release savepoint " + s.name)
}

func (s *savepoint) Rollback(context.Context) error {
	if s.closed {
		return pgx.ErrTxClosed
	}
	return s.end("rollback to savepoint " + s.name)
}

// end queues the savepoint's end like a deferred statement: it runs before anything the
// transaction sends next.
func (s *savepoint) end(sql string) error {
	s.closed = true
	if s.Tx.closed {
		return pgx.ErrTxClosed
	}
	s.Tx.pending = append(s.Tx.pending, &pgx.QueuedQuery{SQL: sql})
	return nil
}

// batchRows are one statement's rows from a batch; closing them closes the batch.
type batchRows struct {
	pgx.Rows
	results  pgx.BatchResults
	closeErr error
}

func (r *batchRows) Close() {
	r.Rows.Close()
	if r.results != nil {
		r.closeErr = r.results.Close()
		r.results = nil
	}
}

func (r *batchRows) Err() error {
	if err := r.Rows.Err(); err != nil {
		return err
	}
	return r.closeErr
}

func (r *batchRows) Next() bool {
	if r.Rows.Next() {
		return true
	}
	r.Close()
	return false
}

// firstRow answers QueryRow from rows, as pgx's own row does.
type firstRow struct{ rows pgx.Rows }

func (r firstRow) Scan(dest ...any) error {
	defer r.rows.Close()
	if !r.rows.Next() {
		if err := r.rows.Err(); err != nil {
			return err
		}
		return pgx.ErrNoRows
	}
	if err := r.rows.Scan(dest...); err != nil {
		return err
	}
	r.rows.Close()
	return r.rows.Err()
}

// errResults answers every statement of a batch that was never sent with the same error.
type errResults struct{ err error }

func (e errResults) Exec() (pgconn.CommandTag, error) { return pgconn.CommandTag{}, e.err }
func (e errResults) Query() (pgx.Rows, error)         { return nil, e.err }
func (e errResults) QueryRow() pgx.Row                { return errRow{e.err} }
func (e errResults) Close() error                     { return e.err }
func (e errResults) Tx() pgx.Tx                       { return nil }
