package ownership_test

import (
	"context"
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/ownership"
	"github.com/takoform/terraform-provider-takoform/internal/testdb"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// managed is a Manager on a fresh database with one organization, its pool's round trips counted.
func managed(t *testing.T) (*ownership.Manager, *pgxpool.Pool, *testdb.RoundTrips) {
	t.Helper()
	pool, counted := testdb.CountedPool(t, 4)
	_, err := pool.Exec(context.Background(), "INSERT INTO organizations (id, name) VALUES ('org_firstread', 'first')")
	require.NoError(t, err)
	return &ownership.Manager{DB: pool, Holder: "test"}, pool, counted
}

func probeIntent(body string) ownership.Intent {
	return ownership.Intent{OrganizationID: "org_firstread", Kind: "probe", Key: "k1", Token: "token-first-read-0001",
		Method: http.MethodPut, Path: "/v1/probes/k1", Body: []byte(body), ResourceType: "probe", ImportID: "k1"}
}

// committing is an effect of one transaction with one statement of its own; ran counts its runs.
func committing(ran *atomic.Int64) ownership.Effect {
	uid := uuid.New()
	return func(ctx context.Context, m *ownership.Mutation) (ownership.Response, error) {
		ran.Add(1)
		return m.Commit(ctx, func(tx pgx.Tx) (ownership.Response, error) {
			var one int
			if err := tx.QueryRow(ctx, "SELECT $1::integer", 1).Scan(&one); err != nil {
				return ownership.Response{}, err
			}
			return ownership.Response{Status: http.StatusCreated, Body: []byte(`{"n":1}`), UID: uid}, nil
		})
	}
}

// created is a Manager whose new work gives up at once on a held key, with probeIntent's create
// done; ran counts the effects run.
func created(t *testing.T) (*ownership.Manager, *pgxpool.Pool, ownership.Intent, *atomic.Int64) {
	t.Helper()
	mgr, pool, _ := managed(t)
	mgr.BusyWait = 1
	ran := new(atomic.Int64)
	in := probeIntent(`{"n":1}`)
	_, err := mgr.Put(context.Background(), in, committing(ran))
	require.NoError(t, err)
	return mgr, pool, in, ran
}

// holdKey takes probeIntent's key lock in a transaction of its own until the test ends, as a
// request in flight holds it.
func holdKey(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	ctx := context.Background()
	holder, err := pool.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = holder.Rollback(ctx) })
	_, err = holder.Exec(ctx, "SELECT pg_advisory_xact_lock(hashtextextended('org_firstread/probe/k1', 0))")
	require.NoError(t, err)
}

// TestANewRequestIsThreeRoundTripsAndAReplayTwo: the first read carries BEGIN and takes the key's
// lock, the effect's statement follows in the same transaction, and the outcome travels with
// COMMIT; a replay is the first read and the end of its transaction, and runs no effect.
func TestANewRequestIsThreeRoundTripsAndAReplayTwo(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	mgr, _, counted := managed(t)
	var ran atomic.Int64
	in := probeIntent(`{"n":1}`)

	counted.Take()
	resp, err := mgr.Put(ctx, in, committing(&ran))
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, resp.Status)
	require.Equal(t, int64(3), counted.Take(), "first read with BEGIN, the effect's statement, the outcome with COMMIT")

	resp, err = mgr.Put(ctx, in, committing(&ran))
	require.NoError(t, err)
	require.True(t, resp.Replayed)
	require.Equal(t, `{"n":1}`, string(resp.Body))
	require.Equal(t, int64(2), counted.Take(), "the first read, and its transaction's end")
	require.Equal(t, int64(1), ran.Load(), "a replay runs no effect")
}

// TestAReplayIsAnsweredWhileAnotherRequestHoldsTheKey: with the key's lock held by a request in
// flight for the whole call, a replay of a finished request still gets its stored answer at once
// and a conflicting token its refusal, while new work waits and gives up with intent_in_progress.
func TestAReplayIsAnsweredWhileAnotherRequestHoldsTheKey(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	mgr, pool, in, ran := created(t)

	holdKey(t, pool)

	resp, err := mgr.Put(ctx, in, committing(ran))
	require.NoError(t, err)
	require.True(t, resp.Replayed)
	require.Equal(t, `{"n":1}`, string(resp.Body))

	other := in
	other.Token = "token-first-read-0002"
	_, err = mgr.Put(ctx, other, committing(ran))
	require.ErrorContains(t, err, "owned by another ownership token")

	changed := probeIntent(`{"n":2}`)
	_, err = mgr.Put(ctx, changed, committing(ran))
	require.ErrorContains(t, err, "still in progress")
	require.Equal(t, int64(2), ran.Load(), "the first request's effect, and the new work's, which waited")
}

// TestADeletedKeysTombstoneIsAnsweredWhileAnotherRequestHoldsTheKey: after a delete, with the
// key's lock held by a request in flight, a replay of the delete gets the tombstone's stored answer
// and a late replay of the create under the same token its refusal, both without waiting.
func TestADeletedKeysTombstoneIsAnsweredWhileAnotherRequestHoldsTheKey(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	mgr, pool, in, ran := created(t)
	del := in
	del.Method, del.Body = http.MethodDelete, nil
	deleting := func(ctx context.Context, m *ownership.Mutation) (ownership.Response, error) {
		ran.Add(1)
		return m.Commit(ctx, func(pgx.Tx) (ownership.Response, error) {
			return ownership.Response{Status: http.StatusOK, Body: []byte(`{"deleted":true}`)}, nil
		})
	}
	_, err := mgr.Delete(ctx, del, deleting)
	require.NoError(t, err)

	holdKey(t, pool)

	resp, err := mgr.Delete(ctx, del, deleting)
	require.NoError(t, err)
	require.True(t, resp.Replayed)
	require.Equal(t, `{"deleted":true}`, string(resp.Body))
	_, err = mgr.Put(ctx, in, committing(ran))
	require.ErrorContains(t, err, "was deleted")
	require.Equal(t, int64(2), ran.Load(), "the create and the delete; neither replay ran an effect")
}
