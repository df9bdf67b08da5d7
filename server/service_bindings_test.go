package server_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/quota"
	"github.com/takoform/terraform-provider-takoform/internal/runtime"
)

// callerBody is a worker body that binds name to the worker callee.
func callerBody(name, callee string) map[string]any {
	body := workerBody()
	body["serviceBindings"] = map[string]string{name: callee}
	return body
}

// A service binding names one of the organization's own workers on the caller's installation:
// another organization's UID is not found (the answer is the one a UID nobody has gets), another
// installation's is refused, and binding names obey the rules of vars (SPEC 3.6).
func TestAServiceBindingReachesOnlyTheOrganizationsWorkersOnItsInstallation(t *testing.T) {
	t.Parallel()
	h := setup(t)
	calleeBody := workerBody()
	callee := h.putWorker("prod", "auth", "token-worker-auth-00001", calleeBody)
	require.Equal(t, http.StatusCreated, callee.status, "body: %s", callee.body)
	calleeUID := callee.json(t)["uid"].(string)

	_, otherKey := h.newOrg("globex")
	theirs := h.do(req{method: http.MethodPut, path: "/v1/spaces/prod/workers/secret-auth", key: otherKey, token: "token-worker-theirs-001", body: calleeBody})
	require.Equal(t, http.StatusCreated, theirs.status, "body: %s", theirs.body)
	theirUID := theirs.json(t)["uid"].(string)

	nobody := uuid.NewString()
	pTheirs := h.putWorker("prod", "api", workerToken, callerBody("AUTH", theirUID)).problem(t, http.StatusNotFound, "not_found")
	pNobody := h.putWorker("prod", "api", workerToken, callerBody("AUTH", nobody)).problem(t, http.StatusNotFound, "not_found")
	// The two answers differ only in the UID each names: nothing says that one of them exists.
	require.Equal(t, pNobody["detail"], strings.ReplaceAll(pTheirs["detail"].(string), theirUID, nobody))
	require.NotContains(t, pTheirs["detail"], "globex")

	// A worker on another installation of the same organization: one node cannot serve two
	// installations, so this one is moved there behind the Host's back.
	b := h.putWorker("prod", "auth-b", "token-worker-auth-b-001", workerBody())
	require.Equal(t, http.StatusCreated, b.status, "body: %s", b.body)
	h.exec(`UPDATE workers SET installation = 'local-b' WHERE name = 'auth-b'`)
	p := h.putWorker("prod", "api", workerToken, callerBody("AUTH", b.json(t)["uid"].(string))).problem(t, http.StatusUnprocessableEntity, "invalid_request")
	require.Contains(t, p["detail"], "installation local-b")

	clash := callerBody("AUTH", calleeUID)
	clash["vars"] = map[string]string{"AUTH": "plain"}
	h.putWorker("prod", "api", workerToken, clash).problem(t, http.StatusUnprocessableEntity, "invalid_request")
	h.putWorker("prod", "api", workerToken, callerBody("TAKOFORM_AUTH", calleeUID)).problem(t, http.StatusUnprocessableEntity, "invalid_request")
	require.Zero(t, h.workerCount("name = 'api' AND status <> 'deleted'"), "a refused put leaves no worker")

	ok := h.putWorker("prod", "api", workerToken, callerBody("AUTH", calleeUID))
	require.Equal(t, http.StatusCreated, ok.status, "body: %s", ok.body)
	require.Equal(t, map[string]any{"AUTH": calleeUID}, ok.json(t)["serviceBindings"])
}

// A worker that a live worker binds to refuses deletion with 409 worker_has_callers naming the
// callers; once the caller is gone (or binds elsewhere) it deletes (SPEC 3.6).
func TestAWorkerALiveWorkerBindsToRefusesDeletionNamingItsCallers(t *testing.T) {
	t.Parallel()
	h := setup(t)
	callee := h.putWorker("prod", "auth", "token-worker-auth-00001", workerBody())
	require.Equal(t, http.StatusCreated, callee.status, "body: %s", callee.body)
	calleeUID := callee.json(t)["uid"].(string)
	other := h.putWorker("prod", "auth2", "token-worker-auth2-0001", workerBody())
	require.Equal(t, http.StatusCreated, other.status, "body: %s", other.body)

	for _, name := range []string{"api", "web"} {
		r := h.putWorker("prod", name, "token-worker-"+name+"-000001", callerBody("AUTH", calleeUID))
		require.Equal(t, http.StatusCreated, r.status, "body: %s", r.body)
	}
	p := h.deleteWorker("prod", "auth", "token-worker-auth-00001").problem(t, http.StatusConflict, "worker_has_callers")
	require.Equal(t, []any{"prod/api", "prod/web"}, p["callers"])
	require.Contains(t, p["detail"], "prod/api, prod/web")
	require.Equal(t, "live", h.workerStatus("auth"), "a refused delete changes nothing")

	// web binds elsewhere now (in place), api is destroyed: the callee is free.
	moved := h.putWorker("prod", "web", "token-worker-web-000001", callerBody("AUTH", other.json(t)["uid"].(string)))
	require.Equal(t, http.StatusOK, moved.status, "body: %s", moved.body)
	require.Equal(t, callee.json(t)["uid"], calleeUID)
	p = h.deleteWorker("prod", "auth", "token-worker-auth-00001").problem(t, http.StatusConflict, "worker_has_callers")
	require.Equal(t, []any{"prod/api"}, p["callers"])
	require.Equal(t, http.StatusOK, h.deleteWorker("prod", "api", "token-worker-api-000001").status)
	require.Equal(t, http.StatusOK, h.deleteWorker("prod", "auth", "token-worker-auth-00001").status)
	// A binding to a deleted worker is not found.
	h.putWorker("prod", "late", "token-worker-late-00001", callerBody("AUTH", calleeUID)).problem(t, http.StatusNotFound, "not_found")
}

func (h *harness) workerCount(where string) int {
	h.t.Helper()
	var n int
	require.NoError(h.t, h.db.QueryRow(context.Background(), "SELECT count(*) FROM workers WHERE "+where).Scan(&n))
	return n
}

func (h *harness) workerStatus(name string) string {
	h.t.Helper()
	var status string
	require.NoError(h.t, h.db.QueryRow(context.Background(), `SELECT status FROM workers WHERE name = $1 AND status <> 'deleted'`, name).Scan(&status))
	return status
}

// A delete of the callee concurrent with a put of a caller that binds to it: never both. The test
// holds the callee's row the way a delete does between its check and its commit (locked, then
// marked deleting); the put must wait for that lock and then refuse, not bind to a worker whose
// delete found no callers.
func TestABindingPutWaitsForTheCalleesDeleteAndNeverBothSucceed(t *testing.T) {
	t.Parallel()
	h := setup(t)
	callee := h.putWorker("prod", "auth", "token-worker-auth-00001", workerBody())
	require.Equal(t, http.StatusCreated, callee.status, "body: %s", callee.body)
	calleeUID := callee.json(t)["uid"].(string)

	ctx := context.Background()
	tx, err := h.db.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, `SELECT 1 FROM workers WHERE uid = $1 FOR UPDATE`, calleeUID)
	require.NoError(t, err)

	done := make(chan reply, 1)
	go func() { done <- h.tryPutWorker("prod", "api", workerToken, callerBody("AUTH", calleeUID)) }()
	select {
	case r := <-done:
		t.Fatalf("the caller's put did not wait for the callee's lock: %d %s", r.status, r.body)
	case <-time.After(time.Second):
	}
	_, err = tx.Exec(ctx, `UPDATE workers SET status = 'deleting' WHERE uid = $1`, calleeUID)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	r := <-done
	require.Equal(t, http.StatusConflict, r.status, "body: %s", r.body)
	require.Contains(t, string(r.body), "is being deleted")
	require.Zero(t, h.workerCount("name = 'api' AND status <> 'deleted'"))

	// And for real, a few times: a caller put and a callee delete at once never both succeed.
	for round := range 3 {
		name := "auth-" + string(rune('a'+round))
		c := h.putWorker("prod", name, "token-worker-"+name+"-0001", workerBody())
		require.Equal(t, http.StatusCreated, c.status, "body: %s", c.body)
		uid := c.json(t)["uid"].(string)
		put := make(chan reply, 1)
		go func() {
			put <- h.tryPutWorker("prod", "caller-"+name, "token-caller-"+name+"-001", callerBody("AUTH", uid))
		}()
		del, err := h.try(req{method: http.MethodDelete, path: "/v1/spaces/prod/workers/" + name, key: h.key, token: "token-worker-" + name + "-0001"})
		require.NoError(t, err)
		p := <-put
		require.False(t, del.status == http.StatusOK && p.status == http.StatusCreated, "round %d: the callee was deleted and a caller bound to it: %s / %s", round, del.body, p.body)
		require.True(t, del.status == http.StatusOK || p.status == http.StatusCreated, "round %d: one of them succeeds: %s / %s", round, del.body, p.body)
	}
}

// A worker's limits stay within its offering's ceilings, which discovery shows (SPEC 3.6).
func TestLimitsAboveTheOfferingsCeilingsAreRefusedAndDiscoveryShowsThem(t *testing.T) {
	t.Parallel()
	h := setup(t)
	offerings := h.get("/v1/offerings").json(t)["offerings"].([]any)
	var ceilings map[string]any
	for _, o := range offerings {
		if o := o.(map[string]any); o["kind"] == "module-worker" {
			ceilings = o["ceilings"].(map[string]any)
		}
	}
	// A runtime node runs every worker under one heap limit (128 MB) and ends a request that
	// computes past its liveness bound (2 s) with its organization's process (SPEC 5.1).
	require.Equal(t, map[string]any{"cpuMs": float64(2000), "memoryMb": float64(128), "fixedMemory": true}, ceilings)

	// Below workerconf.MinMemoryMB workerd cannot start: refused too, as the provider refuses it.
	for _, limits := range []map[string]any{{"cpuMs": 2001}, {"memoryMb": 129}, {"memoryMb": 64}, {"cpuMs": -1}, {"memoryMb": 15}, {"memoryMb": 1}} {
		body := workerBody()
		body["limits"] = limits
		p := h.putWorker("prod", "api", workerToken, body).problem(t, http.StatusUnprocessableEntity, "invalid_request")
		require.Contains(t, p["detail"], "limits")
	}
	body := workerBody()
	body["limits"] = map[string]any{"cpuMs": 100, "memoryMb": 128}
	r := h.putWorker("prod", "api", workerToken, body)
	require.Equal(t, http.StatusCreated, r.status, "body: %s", r.body)
	require.Equal(t, map[string]any{"cpuMs": float64(100), "memoryMb": float64(128)}, r.json(t)["limits"])
}

// Two workers that come to bind to each other at the same moment both succeed: every put locks
// the caller and its callees in UID order, so neither waits for a lock the other holds while
// holding one it wants (without the order PostgreSQL ends one of them as a deadlock).
func TestTwoWorkersBindingToEachOtherAtOnceBothSucceed(t *testing.T) {
	t.Parallel()
	h := setup(t)
	for round := range 4 {
		a, b := "ping-"+string(rune('a'+round)), "pong-"+string(rune('a'+round))
		ra := h.putWorker("prod", a, "token-"+a+"-000000001", workerBody())
		rb := h.putWorker("prod", b, "token-"+b+"-000000001", workerBody())
		require.Equal(t, http.StatusCreated, ra.status, "body: %s", ra.body)
		require.Equal(t, http.StatusCreated, rb.status, "body: %s", rb.body)
		uidA, uidB := ra.json(t)["uid"].(string), rb.json(t)["uid"].(string)
		done := make(chan reply, 2)
		go func() { done <- h.tryPutWorker("prod", a, "token-"+a+"-000000001", callerBody("PEER", uidB)) }()
		go func() { done <- h.tryPutWorker("prod", b, "token-"+b+"-000000001", callerBody("PEER", uidA)) }()
		for range 2 {
			r := <-done
			require.Equal(t, http.StatusOK, r.status, "round %d: body: %s", round, r.body)
		}
	}
	require.NotContains(t, h.logs.String(), "deadlock")
}

// The order itself: a put waiting for one worker's lock holds the locks of the workers below it
// in UID order and none above it.
func TestABindingPutLocksTheCallerAndCalleesInUIDOrder(t *testing.T) {
	t.Parallel()
	h := setup(t)
	r1 := h.putWorker("prod", "one", "token-worker-one-000001", workerBody())
	r2 := h.putWorker("prod", "two", "token-worker-two-000001", workerBody())
	require.Equal(t, http.StatusCreated, r1.status, "body: %s", r1.body)
	require.Equal(t, http.StatusCreated, r2.status, "body: %s", r2.body)
	type w struct{ name, token, uid string }
	low, high := w{"one", "token-worker-one-000001", r1.json(t)["uid"].(string)}, w{"two", "token-worker-two-000001", r2.json(t)["uid"].(string)}
	if low.uid > high.uid {
		low, high = high, low
	}
	ctx := context.Background()
	lockedElsewhere := func(uid string) bool {
		tx, err := h.db.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(ctx) }()
		_, err = tx.Exec(ctx, `SELECT 1 FROM workers WHERE uid = $1 FOR UPDATE NOWAIT`, uid)
		return err != nil
	}
	for _, c := range []struct {
		held, caller w
		callerLocked bool
	}{
		{held: high, caller: low, callerLocked: true},  // low, then high: waits holding low
		{held: low, caller: high, callerLocked: false}, // low first: waits holding nothing
	} {
		tx, err := h.db.Begin(ctx)
		require.NoError(t, err)
		// A failure below must not leave the put waiting for ever.
		t.Cleanup(func() { _ = tx.Rollback(ctx) })
		_, err = tx.Exec(ctx, `SELECT 1 FROM workers WHERE uid = $1 FOR UPDATE`, c.held.uid)
		require.NoError(t, err)
		done := make(chan reply, 1)
		go func() { done <- h.tryPutWorker("prod", c.caller.name, c.caller.token, callerBody("PEER", c.held.uid)) }()
		require.Eventually(t, func() bool {
			var waiting int
			err := h.db.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%FOR UPDATE OF w%'`).Scan(&waiting)
			return err == nil && waiting > 0
		}, 10*time.Second, 20*time.Millisecond, "the put waits for the held worker")
		require.Equal(t, c.callerLocked, lockedElsewhere(c.caller.uid), "caller %s while it waits for %s", c.caller.name, c.held.name)
		require.NoError(t, tx.Rollback(ctx))
		r := <-done
		require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
	}
}

// A caller whose delete is still in flight still stands (its script may still run and call): the
// callee's delete waits for it as it waits for a live caller (resource_present, as for endpoints).
func TestACallerBeingDeletedStillBlocksTheCalleesDelete(t *testing.T) {
	t.Parallel()
	h := setup(t)
	callee := h.putWorker("prod", "auth", "token-worker-auth-00001", workerBody())
	require.Equal(t, http.StatusCreated, callee.status, "body: %s", callee.body)
	caller := h.putWorker("prod", "api", workerToken, callerBody("AUTH", callee.json(t)["uid"].(string)))
	require.Equal(t, http.StatusCreated, caller.status, "body: %s", caller.body)
	// The caller's delete began and has not finished (its backend delete failed, say).
	h.exec(`UPDATE workers SET status = 'deleting' WHERE name = 'api'`)
	p := h.deleteWorker("prod", "auth", "token-worker-auth-00001").problem(t, http.StatusConflict, "worker_has_callers")
	require.Equal(t, []any{"prod/api"}, p["callers"])
	require.Equal(t, "live", h.workerStatus("auth"))
}

// A worker whose v1 script name collided with an earlier worker's (SPEC 3.4) cannot be a callee:
// a Cloudflare binding names the callee's script, which is that earlier worker's. 409 script_held.
func TestABindingToAWorkerWithACollidingScriptNameIsRefused(t *testing.T) {
	t.Parallel()
	h := setup(t)
	callee := h.putWorker("prod", "auth", "token-worker-auth-00001", workerBody())
	require.Equal(t, http.StatusCreated, callee.status, "body: %s", callee.body)
	uid := callee.json(t)["uid"].(string)
	h.exec(`UPDATE workers SET script_collision = true WHERE name = 'auth'`)
	p := h.putWorker("prod", "api", workerToken, callerBody("AUTH", uid)).problem(t, http.StatusConflict, "script_held")
	require.Contains(t, p["detail"], uid)
	require.Zero(t, h.workerCount("name = 'api' AND status <> 'deleted'"), "a refused put leaves no worker")
}

// A create that binds to a worker locks its callees before it takes any quota slot: while a
// callee's row is held (its delete deciding), the caller's create waits for it holding none of
// the organization's slots (near the ceiling a create takes all 16), so other creates of the
// organization are not held behind a wait that has nothing to do with them.
func TestACreateWaitingForItsCalleeHoldsNoQuotaSlot(t *testing.T) {
	t.Parallel()
	h := setup(t)
	callee := h.putWorker("prod", "auth", "token-worker-auth-00001", workerBody())
	require.Equal(t, http.StatusCreated, callee.status, "body: %s", callee.body)
	calleeUID := callee.json(t)["uid"].(string)
	require.NoError(t, quota.Set(context.Background(), h.db, h.org.ID, quota.Workers, ptr(10)))

	ctx := context.Background()
	tx, err := h.db.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, `SELECT 1 FROM workers WHERE uid = $1 FOR UPDATE`, calleeUID)
	require.NoError(t, err)

	caller := make(chan reply, 1)
	go func() { caller <- h.tryPutWorker("prod", "api", workerToken, callerBody("AUTH", calleeUID)) }()
	// The advisory locks the waiting create holds: its ownership key's alone, no quota slot.
	held := -1
	require.Eventually(t, func() bool {
		err := h.db.QueryRow(ctx, `SELECT count(*) FROM pg_locks a
			WHERE a.locktype = 'advisory' AND a.granted
			  AND a.pid = (SELECT w.pid FROM pg_locks w WHERE NOT w.granted AND w.locktype IN ('transactionid', 'tuple') LIMIT 1)`).Scan(&held)
		return err == nil && held > 0
	}, 10*time.Second, 20*time.Millisecond, "the caller's create waits for its callee's row")
	require.Equal(t, 1, held, "the create waiting for its callee holds quota slots")
	require.NoError(t, tx.Rollback(ctx))
	<-caller
}

// The callers index covers every generation of a caller that may run: an update that moves a
// binding to another worker and fails at the backend leaves the deployed generation calling the
// old callee, so neither the old callee (still called) nor the new one (named by the generation
// a retry deploys) can be deleted; once the new generation is deployed the old callee is free.
func TestAFailedUpdateThatMovesABindingKeepsBothCalleesBound(t *testing.T) {
	t.Parallel()
	hb, wrap := holding()
	h := setup(t, wrap)
	auth := h.putWorker("prod", "auth", "token-worker-auth-00001", workerBody())
	require.Equal(t, http.StatusCreated, auth.status, "body: %s", auth.body)
	auth2 := h.putWorker("prod", "auth2", "token-worker-auth2-0001", workerBody())
	require.Equal(t, http.StatusCreated, auth2.status, "body: %s", auth2.body)
	api := h.putWorker("prod", "api", workerToken, callerBody("AUTH", auth.json(t)["uid"].(string)))
	require.Equal(t, http.StatusCreated, api.status, "body: %s", api.body)

	hb.failNext(api.json(t)["scriptName"].(string))
	h.putWorker("prod", "api", workerToken, callerBody("AUTH", auth2.json(t)["uid"].(string))).problem(t, http.StatusBadGateway, "backend_failed")
	p := h.deleteWorker("prod", "auth", "token-worker-auth-00001").problem(t, http.StatusConflict, "worker_has_callers")
	require.Equal(t, []any{"prod/api"}, p["callers"], "the deployed generation still calls auth")
	p = h.deleteWorker("prod", "auth2", "token-worker-auth2-0001").problem(t, http.StatusConflict, "worker_has_callers")
	require.Equal(t, []any{"prod/api"}, p["callers"], "the pending generation names auth2")

	// The retry deploys the new generation: auth is free, auth2 is bound.
	r := h.putWorker("prod", "api", workerToken, callerBody("AUTH", auth2.json(t)["uid"].(string)))
	require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
	h.deleteWorker("prod", "auth2", "token-worker-auth2-0001").problem(t, http.StatusConflict, "worker_has_callers")
	require.Equal(t, http.StatusOK, h.deleteWorker("prod", "auth", "token-worker-auth-00001").status)
}

// An offering whose memory ceiling promises more than its runtime node gives one worker is the
// operator's misconfiguration: a worker asking for more than the node's ceiling is refused with
// 502 backend_misconfigured naming both, never run under less than it asked for; within the
// node's ceiling it runs.
func TestAMemoryLimitAboveTheRuntimeNodesCeilingIsAMisconfiguration(t *testing.T) {
	t.Parallel()
	h := setup(t, func(o *options) {
		o.runtime = func(c *runtime.Config) { c.HeapLimitMB = 64 }
	})
	body := workerBody()
	body["limits"] = map[string]any{"memoryMb": 128}
	p := h.putWorker("prod", "api", workerToken, body).problem(t, http.StatusBadGateway, "backend_misconfigured")
	require.Contains(t, p["detail"], "limits.memoryMb 128 is above this runtime node's 64 MB per worker")
	require.Contains(t, p["detail"], "maxMemoryMb")
	require.Contains(t, p["detail"], "--heap-limit-mb 128")
	h.get("/v1/spaces/prod/workers/api").problem(t, http.StatusNotFound, "not_found")

	delete(body, "limits")
	r := h.putWorker("prod", "api", workerToken, body)
	require.Equal(t, http.StatusCreated, r.status, "body: %s", r.body)
}
