package server_test

import (
	"context"
	"net/http"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/backend"
)

// callLog sees every backend call the Host makes on workers, in order, and can lose the answers of
// the next ones: an apply that lands but answers unreachable, a read-back that cannot be made, a
// delete that never reaches the backend.
type callLog struct {
	backend.Mutator
	mu    sync.Mutex
	calls []string
	// loseApply, loseObserve, loseDelete: how many of the next such calls on a worker fail as
	// unreachable (an apply after it reached the backend, the others before).
	loseApply, loseObserve, loseDelete int
}

func (c *callLog) Unwrap() backend.Mutator { return c.Mutator }

// note records call and reports whether its answer is lost.
func (c *callLog) note(call string, lose *int) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.calls = append(c.calls, call)
	if *lose > 0 {
		*lose--
		return true
	}
	return false
}

func (c *callLog) Apply(ctx context.Context, d backend.Desired) (backend.Observation, error) {
	if d.Kind != backend.NativeWorker {
		return c.Mutator.Apply(ctx, d)
	}
	obs, err := c.Mutator.Apply(ctx, d)
	if c.note("apply", &c.loseApply) {
		return backend.Observation{}, backend.ErrUnreachable
	}
	return obs, err
}

func (c *callLog) Observe(ctx context.Context, kind, native string) (backend.Observation, error) {
	if kind != backend.NativeWorker {
		return c.Mutator.Observe(ctx, kind, native)
	}
	if c.note("observe", &c.loseObserve) {
		return backend.Observation{}, backend.ErrUnreachable
	}
	return c.Mutator.Observe(ctx, kind, native)
}

func (c *callLog) Delete(ctx context.Context, d backend.Desired) error {
	if d.Kind != backend.NativeWorker {
		return c.Mutator.Delete(ctx, d)
	}
	if c.note("delete", &c.loseDelete) {
		return backend.ErrUnreachable
	}
	return c.Mutator.Delete(ctx, d)
}

// arm sets which answers are lost next and forgets the calls seen so far.
func (c *callLog) arm(apply, observe, del int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.calls, c.loseApply, c.loseObserve, c.loseDelete = nil, apply, observe, del
}

func (c *callLog) seen() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.calls...)
}

// The phases of a put run in order, and a failed perform never reaches record: a create whose
// apply landed but could not be confirmed (the call and its read-back both unanswered) is taken
// down again (compensate) before the refusal, and the refusal's transaction records the apply as
// failed, the compensating delete and the create abandoned; the commit never runs, so nothing of
// the worker stands and the key is free for the retry.
func TestAPutWhosePerformFailsIsCompensatedAndRefusedWithoutRecord(t *testing.T) {
	t.Parallel()
	c := &callLog{}
	h := setup(t, func(o *options) {
		o.wrap = func(m backend.Mutator) backend.Mutator { c.Mutator = m; return c }
	})
	c.arm(1, 1, 0)
	h.putWorker("prod", "api", workerToken, workerBody()).problem(t, http.StatusServiceUnavailable, "backend_unreachable")
	require.Equal(t, []string{"apply", "observe", "delete", "observe"}, c.seen(),
		"perform (the apply, its read-back lost), then compensate (a delete, read back), before the refusal")

	op := h.status(`SELECT id::text FROM operations WHERE kind = 'worker' AND external_key = 'prod/api'`)
	require.Equal(t, "refused", h.status(`SELECT status FROM operations WHERE id = $1`, op))
	require.Equal(t, 2, h.count(`SELECT count(*) FROM backend_effects WHERE operation_id = $1`, op))
	require.Equal(t, "failed", h.status(`SELECT status FROM backend_effects WHERE operation_id = $1 AND action = 'apply'`, op),
		"the refusal recorded the apply, never left dispatched")
	require.Equal(t, "succeeded", h.status(`SELECT status FROM backend_effects WHERE operation_id = $1 AND action = 'delete'`, op),
		"the refusal recorded the compensation")
	require.Equal(t, "deleted", h.status(`SELECT d.status FROM deployments d JOIN backend_effects x ON x.deployment_id = d.id WHERE x.operation_id = $1 AND x.action = 'apply'`, op))
	require.Equal(t, "deleted", h.status(`SELECT status FROM workers WHERE name = 'api'`), "the create was abandoned")
	st, err := h.runtimeClient().GetScript(context.Background(), h.status(`SELECT script_name FROM workers WHERE name = 'api'`))
	require.NoError(t, err)
	require.False(t, st.Present, "the compensation took the script down")
	h.get("/v1/spaces/prod/workers/api").problem(t, http.StatusNotFound, "not_found")

	c.arm(0, 0, 0)
	require.Equal(t, http.StatusCreated, h.putWorker("prod", "api", workerToken, workerBody()).status, "the retry creates it")
}

// A delete whose perform is not confirmed never reaches record either: the refusal records the
// delete as failed, the deployment stays deleting and the deletion attestation open (it closes
// only in the commit, after absence was read back), and the retry finishes all three.
func TestADeleteWhosePerformFailsIsRefusedWithoutRecord(t *testing.T) {
	t.Parallel()
	c := &callLog{}
	h := setup(t, func(o *options) {
		o.wrap = func(m backend.Mutator) backend.Mutator { c.Mutator = m; return c }
	})
	w := h.mustWorker("prod", "api", workerToken)
	uid := w["uid"].(string)

	c.arm(0, 0, 1)
	h.deleteWorker("prod", "api", workerToken).problem(t, http.StatusServiceUnavailable, "backend_unreachable")
	require.Equal(t, []string{"delete", "observe"}, c.seen(), "a delete is read back, never assumed done")
	op := h.status(`SELECT id::text FROM operations WHERE kind = 'worker' AND external_key = 'prod/api' AND method = 'DELETE'`)
	require.Equal(t, "refused", h.status(`SELECT status FROM operations WHERE id = $1`, op))
	require.Equal(t, "failed", h.status(`SELECT status FROM backend_effects WHERE operation_id = $1`, op))
	require.Equal(t, "deleting", h.status(`SELECT status FROM deployments WHERE resource_uid = $1`, uid))
	require.Equal(t, "open", h.attestation(uid))
	require.Equal(t, "deleting", h.status(`SELECT status FROM workers WHERE uid = $1`, uid))

	c.arm(0, 0, 0)
	require.Equal(t, http.StatusOK, h.deleteWorker("prod", "api", workerToken).status)
	require.Equal(t, "deleted", h.status(`SELECT status FROM deployments WHERE resource_uid = $1`, uid))
	require.Equal(t, "closed", h.attestation(uid))
	require.Equal(t, "deleted", h.status(`SELECT status FROM workers WHERE uid = $1`, uid))
}

// A create whose apply was confirmed and recorded, but whose runtime input is then refused, will
// not commit: undo takes the script down again, and the refusal records the compensation and the
// create abandoned, so the worker never existed.
func TestACreateRefusedAfterItsPerformIsUndone(t *testing.T) {
	t.Parallel()
	c := &callLog{}
	h := setup(t, func(o *options) {
		o.wrap = func(m backend.Mutator) backend.Mutator { c.Mutator = m; return c }
	})
	p := h.reservedAndPrepared()
	h.exec("UPDATE runtime_input_preparations SET expires_at = now() - interval '1 second'")
	c.arm(0, 0, 0)
	h.putWorker("prod", "api", workerToken, secretWorkerBody(p.reference)).problem(t, http.StatusConflict, "lease_unavailable")
	require.Equal(t, []string{"apply", "delete", "observe"}, c.seen(), "perform, then the undo's delete, read back")

	op := h.status(`SELECT id::text FROM operations WHERE kind = 'worker' AND external_key = 'prod/api'`)
	require.Equal(t, "refused", h.status(`SELECT status FROM operations WHERE id = $1`, op))
	require.Equal(t, "succeeded", h.status(`SELECT status FROM backend_effects WHERE operation_id = $1 AND action = 'apply'`, op),
		"the apply was recorded before the runtime input was asked for")
	require.Equal(t, "succeeded", h.status(`SELECT status FROM backend_effects WHERE operation_id = $1 AND action = 'delete'`, op))
	require.Equal(t, "deleted", h.status(`SELECT d.status FROM deployments d JOIN backend_effects x ON x.deployment_id = d.id WHERE x.operation_id = $1 AND x.action = 'apply'`, op))
	require.Equal(t, "deleted", h.status(`SELECT status FROM workers WHERE name = 'api'`), "the create was abandoned")
	st, err := h.runtimeClient().GetScript(context.Background(), h.status(`SELECT script_name FROM workers WHERE name = 'api'`))
	require.NoError(t, err)
	require.False(t, st.Present, "the undo took the script down")
}

// A create whose commit transaction refuses after its script landed and was recorded (here a
// trigger fails the worker's move to live) never exists: the commit's refusal undoes it, so the
// script is taken down and the row abandoned, instead of a script running for a worker that stays
// "creating". The retry creates it.
func TestACreateWhoseCommitRefusesIsUndone(t *testing.T) {
	t.Parallel()
	c := &callLog{}
	h := setup(t, func(o *options) {
		o.wrap = func(m backend.Mutator) backend.Mutator { c.Mutator = m; return c }
	})
	h.exec(`CREATE FUNCTION refuse_live() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN RAISE EXCEPTION 'test: the commit refuses'; END $$`)
	h.exec(`CREATE TRIGGER refuse_live BEFORE UPDATE ON workers FOR EACH ROW
WHEN (OLD.status = 'creating' AND NEW.status = 'live') EXECUTE FUNCTION refuse_live()`)
	c.arm(0, 0, 0)
	r := h.putWorker("prod", "api", workerToken, workerBody())
	require.GreaterOrEqual(t, r.status, 500, "body: %s", r.body)
	require.Equal(t, []string{"apply", "observe", "delete", "observe"}, c.seen(),
		"perform, the wait for it to serve, then the undo's delete, read back")

	op := h.status(`SELECT id::text FROM operations WHERE kind = 'worker' AND external_key = 'prod/api'`)
	require.Equal(t, "refused", h.status(`SELECT status FROM operations WHERE id = $1`, op))
	require.Equal(t, "succeeded", h.status(`SELECT status FROM backend_effects WHERE operation_id = $1 AND action = 'delete'`, op),
		"the refusal recorded the undo")
	require.Equal(t, "deleted", h.status(`SELECT status FROM workers WHERE name = 'api'`), "the create was abandoned")
	st, err := h.runtimeClient().GetScript(context.Background(), h.status(`SELECT script_name FROM workers WHERE name = 'api'`))
	require.NoError(t, err)
	require.False(t, st.Present, "the undo took the script down")

	h.exec(`DROP TRIGGER refuse_live ON workers`)
	require.Equal(t, http.StatusCreated, h.putWorker("prod", "api", workerToken, workerBody()).status, "the retry creates it")
}
