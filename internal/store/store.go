// Package store owns the Host's SQL: the connection pool, migrations, transactions, and the typed
// query functions sqlc generates into dbsqlc from queries/*.sql. Domain packages call it; nothing
// else talks to PostgreSQL.
package store

//go:generate go tool sqlc generate

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"strings"

	"github.com/golang-migrate/migrate/v4"
	migratepgx "github.com/golang-migrate/migrate/v4/database/pgx/v5"
	"github.com/golang-migrate/migrate/v4/source/iofs"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/takoform/terraform-provider-takoform/migrations"
)

// Open connects a pool to databaseURL and checks that the database answers.
func Open(ctx context.Context, databaseURL string) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(databaseURL)
	if err != nil {
		return nil, fmt.Errorf("parse database URL: %w", redactParseError(err))
	}
	cfg.ConnConfig.RuntimeParams["application_name"] = "takoserver"
	// Each connection is a backend the database runs at once, and past a few per core more of them
	// only queue on the database's CPUs and locks: requests wait better in the pool. With make bench
	// on two cores (Host and database on one machine), a new reservation PUT's p99 at 16 clients was
	// 27-34 ms with 4 to 8 connections, 38-46 ms with 12 and 51-65 ms with 32, and its database CPU
	// grew with the count. The URL's pool_max_conns wins (size it to the database's cores, shared
	// among replicas).
	if !strings.Contains(databaseURL, "pool_max_conns") {
		cfg.MaxConns = DefaultMaxConns()
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connect to PostgreSQL: %w", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("connect to PostgreSQL: %w", err)
	}
	return pool, nil
}

// DefaultMaxConns is the pool's size when the database URL sets none: four connections per core of
// this machine (a Host usually runs beside its database or on one of its size), at least eight.
func DefaultMaxConns() int32 { return int32(max(8, 4*runtime.NumCPU())) }

// redactParseError drops the connection string (which may carry a password) from a parse error.
func redactParseError(err error) error {
	var pe *pgconn.ParseConfigError
	if errors.As(err, &pe) {
		return errors.New("invalid connection string")
	}
	return err
}

// Migrator returns a golang-migrate instance over the embedded migrations for db. Closing it
// closes db too.
func Migrator(db *sql.DB) (*migrate.Migrate, error) {
	src, err := iofs.New(migrations.FS, ".")
	if err != nil {
		return nil, fmt.Errorf("read embedded migrations: %w", err)
	}
	driver, err := migratepgx.WithInstance(db, &migratepgx.Config{})
	if err != nil {
		return nil, fmt.Errorf("prepare migrations: %w", err)
	}
	m, err := migrate.NewWithInstance("iofs", src, "pgx5", driver)
	if err != nil {
		return nil, fmt.Errorf("prepare migrations: %w", err)
	}
	return m, nil
}

// OpenSQL opens a database/sql handle (used only by migrations) for databaseURL.
func OpenSQL(databaseURL string) (*sql.DB, error) {
	cfg, err := pgx.ParseConfig(databaseURL)
	if err != nil {
		return nil, fmt.Errorf("parse database URL: %w", redactParseError(err))
	}
	return stdlib.OpenDB(*cfg), nil
}

// MigrateUp applies every pending migration to the database at databaseURL.
func MigrateUp(databaseURL string) error {
	db, err := OpenSQL(databaseURL)
	if err != nil {
		return err
	}
	defer db.Close()
	m, err := Migrator(db)
	if err != nil {
		return err
	}
	defer m.Close()
	if err := m.Up(); err != nil && !errors.Is(err, migrate.ErrNoChange) {
		return fmt.Errorf("migrate up: %w", err)
	}
	return nil
}

// Beginner starts transactions: a pool, or a connection.
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// WithTx runs fn in a transaction, committing when it returns nil. The rollback uses a fresh
// context so that a cancelled request never leaves a transaction open. Serialization failures,
// deadlocks and lock timeouts come back as ErrContention, so that callers answer them as a
// retryable conflict.
//
// On a pool the transaction is a Tx: its BEGIN and COMMIT travel with its statements.
func WithTx(ctx context.Context, db Beginner, fn func(pgx.Tx) error) error {
	var tx pgx.Tx
	var err error
	if pool, ok := db.(*pgxpool.Pool); ok {
		tx, err = Begin(ctx, pool)
	} else {
		tx, err = db.Begin(ctx)
	}
	if err != nil {
		return fmt.Errorf("begin transaction: %w", Classify(err))
	}
	return RunTx(ctx, tx, fn)
}

// RunTx runs fn in tx, a transaction already begun, and ends it as WithTx does.
func RunTx(ctx context.Context, tx pgx.Tx, fn func(pgx.Tx) error) error {
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if err := fn(tx); err != nil {
		return Classify(err)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("commit transaction: %w", Classify(err))
	}
	return nil
}

// ErrContention marks a transaction PostgreSQL gave up on because of other transactions: a
// serialization failure, a deadlock or a lock timeout. Retrying it is safe.
var ErrContention = errors.New("the database refused the transaction because of concurrent work")

// ErrUnavailable marks an error reaching PostgreSQL at all.
var ErrUnavailable = errors.New("the database is unavailable")

type classified struct {
	kind  error
	cause error
}

func (c *classified) Error() string        { return c.kind.Error() + ": " + c.cause.Error() }
func (c *classified) Unwrap() []error      { return []error{c.kind, c.cause} }
func (c *classified) Is(target error) bool { return target == c.kind }

// Classify marks contention and unavailability in err's chain with ErrContention or
// ErrUnavailable, leaving every other error as it is.
func Classify(err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, ErrContention) || errors.Is(err, ErrUnavailable) {
		return err
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case "40001", "40P01", "55P03": // serialization_failure, deadlock_detected, lock_not_available
			return &classified{kind: ErrContention, cause: err}
		case "57P01", "57P02", "57P03", "53300": // shutdown, crash, cannot connect now, too many connections
			return &classified{kind: ErrUnavailable, cause: err}
		case "25006": // read_only_sql_transaction: a primary demoted, or a standby, mid-failover
			return &classified{kind: ErrUnavailable, cause: err}
		}
		return err
	}
	var connectErr *pgconn.ConnectError
	var netErr net.Error
	if errors.As(err, &connectErr) || errors.As(err, &netErr) || errors.Is(err, io.ErrUnexpectedEOF) ||
		pgconn.SafeToRetry(err) || strings.Contains(err.Error(), "conn closed") {
		return &classified{kind: ErrUnavailable, cause: err}
	}
	return err
}

// IsUniqueViolation reports whether err is a unique-constraint violation on constraint (any
// constraint when constraint is empty).
func IsUniqueViolation(err error, constraint string) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "23505" && (constraint == "" || pgErr.ConstraintName == constraint)
}

// SweepBatch is how many rows one statement of a janitor's sweep changes, and SweepBatches how
// many statements one pass runs at most (what is left waits for the next pass).
const (
	SweepBatch   = 500
	SweepBatches = 100
)

// Sweep runs a janitor's batched statement (each call changes at most SweepBatch rows, each in
// its own transaction) until a call changes fewer, or SweepBatches calls ran, and returns how many
// rows all of them changed. A statement that changes rows of many organizations at once would take
// every one's locks in one transaction.
func Sweep(ctx context.Context, step func(ctx context.Context, batch int32) (int64, error)) (int64, error) {
	var total int64
	for range SweepBatches {
		n, err := step(ctx, SweepBatch)
		total += n
		if err != nil || n < SweepBatch {
			return total, err
		}
	}
	return total, nil
}
