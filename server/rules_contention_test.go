package server_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// deadlockOnce makes the next request that binds an ownership token die in a real deadlock
// (SQLSTATE 40P01), the way two requests locking the same rows in opposite orders would: a
// trigger on ownership_bindings takes advisory lock 41 and then waits for 42, which the test's
// own transaction holds; the test's transaction then asks for 41. Each session checks for a
// deadlock once it has waited deadlock_timeout (a second), and the first to check is the one
// aborted: the test's transaction asks for 41 only once the request has waited half a second,
// so the request's check comes first and its transaction is the one given up. The trigger is
// gone when deadlockOnce returns.
func (h *harness) deadlockOnce(send func() reply) reply {
	h.t.Helper()
	ctx := context.Background()
	h.exec(`CREATE FUNCTION rule_deadlock() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_advisory_xact_lock(41);
  PERFORM pg_advisory_xact_lock(42);
  RETURN NEW;
END $$`)
	h.exec(`CREATE TRIGGER rule_deadlock BEFORE INSERT ON ownership_bindings FOR EACH ROW EXECUTE FUNCTION rule_deadlock()`)
	tx, err := h.db.Begin(ctx)
	require.NoError(h.t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, `SELECT pg_advisory_xact_lock(42)`)
	require.NoError(h.t, err)

	answered := make(chan reply, 1)
	go func() { answered <- send() }()
	// The request holds 41 and has waited for 42 for half a second.
	require.Eventually(h.t, func() bool {
		var waiting int
		err := h.db.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objid = 42 AND NOT granted
  AND waitstart < clock_timestamp() - interval '500 milliseconds'`).Scan(&waiting)
		return err == nil && waiting == 1
	}, 30*time.Second, 10*time.Millisecond, "the request never reached the trigger")
	// Now the cycle closes; the request's session finds it and gives up its transaction.
	_, err = tx.Exec(ctx, `SELECT pg_advisory_xact_lock(41)`)
	require.NoError(h.t, err, "the test's transaction was chosen as the deadlock's victim")
	_, err = tx.Exec(ctx, `DROP TRIGGER rule_deadlock ON ownership_bindings`)
	require.NoError(h.t, err)
	_, err = tx.Exec(ctx, `DROP FUNCTION rule_deadlock`)
	require.NoError(h.t, err)
	require.NoError(h.t, tx.Commit(ctx))
	select {
	case r := <-answered:
		return r
	case <-time.After(30 * time.Second):
		h.t.Fatal("the request never answered after its deadlock")
		return reply{}
	}
}

// TestRuleADeadlockIsARetryableIntentInProgressNeverA500: "a deadlock is a retryable 409
// intent_in_progress" (SPEC 2). A real deadlock kills the request's transaction, once in an
// effect that is one transaction from start to end (a reservation) and once in the last phase of
// one that called its backend first (a worker): each answers 409 intent_in_progress with
// Retry-After, leaves nothing behind, and the same request sent again succeeds.
func TestRuleADeadlockIsARetryableIntentInProgressNeverA500(t *testing.T) {
	t.Parallel()
	// The request waits for no other request on its key: the deadlock's answer is its own.
	h := setup(t, func(o *options) { o.busyWait = time.Millisecond })

	r := h.deadlockOnce(func() reply {
		rep, err := h.try(req{method: http.MethodPut, path: resPath + "res-a", key: h.key, token: tokenA, body: apiBody("prod", "api")})
		if err != nil {
			return reply{body: []byte(err.Error())}
		}
		return rep
	})
	r.problem(t, http.StatusConflict, "intent_in_progress")
	require.NotEmpty(t, r.header.Get("Retry-After"))
	h.getReservation(h.key, "res-a").problem(t, http.StatusNotFound, "not_found")
	require.Equal(t, http.StatusCreated, h.putReservation(h.key, "res-a", tokenA, apiBody("prod", "api")).status)

	r = h.deadlockOnce(func() reply { return h.tryPutWorker("prod", "api", workerToken, workerBody()) })
	r.problem(t, http.StatusConflict, "intent_in_progress")
	require.NotEmpty(t, r.header.Get("Retry-After"))
	h.do(req{method: http.MethodGet, path: "/v1/spaces/prod/workers/api", key: h.key}).problem(t, http.StatusNotFound, "not_found")
	again := h.putWorker("prod", "api", workerToken, workerBody())
	require.Equal(t, http.StatusCreated, again.status, "body: %s", again.body)
}
