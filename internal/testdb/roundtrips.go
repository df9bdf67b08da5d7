package testdb

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// RoundTrips counts what a pool sends and waits on: each Exec, Query or QueryRow, and each batch
// (a statement's first preparation on a connection is not counted).
type RoundTrips struct{ n atomic.Int64 }

// Take answers the count so far and starts it again from zero.
func (r *RoundTrips) Take() int64 { return r.n.Swap(0) }

func (r *RoundTrips) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	r.n.Add(1)
	return ctx
}

func (r *RoundTrips) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (r *RoundTrips) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	r.n.Add(1)
	return ctx
}

func (r *RoundTrips) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}

func (r *RoundTrips) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// CountedPool returns a pool of at most maxConns connections on a fresh, fully migrated database
// for this test, with its round trips counted.
func CountedPool(t testing.TB, maxConns int32) (*pgxpool.Pool, *RoundTrips) {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(URL(t))
	if err != nil {
		t.Fatalf("parse test database URL: %v", err)
	}
	trips := &RoundTrips{}
	cfg.ConnConfig.Tracer = trips
	cfg.MaxConns = maxConns
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatalf("connect to test database: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool, trips
}
