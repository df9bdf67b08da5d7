package server_test

import (
	"context"
	"net/http"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/backend"
	"github.com/takoform/terraform-provider-takoform/internal/backend/packs"
	"github.com/takoform/terraform-provider-takoform/internal/catalog"
)

// crashedApply leaves the database as a Host that stopped right after dispatching an apply of a
// new generation of worker prod/api leaves it: the operation running, its lease on the key, the
// effect dispatched, the deployment pending. landed says whether the backend got the desired state
// before the stop; expired whether the lease has run out (the Host is gone).
func crashedApply(t *testing.T, h *harness, landed, expired bool) (op, deployment uuid.UUID) {
	t.Helper()
	w := h.mustWorker("prod", "api", workerToken)
	op, deployment = uuid.New(), uuid.New()
	h.exec(`INSERT INTO operations (id, organization_id, kind, external_key, method, status) VALUES ($1, $2, 'worker', 'prod/api', 'PUT', 'running')`, op, h.org.ID)
	lease := "db_now() + interval '1 minute'"
	if expired {
		lease = "db_now() - interval '1 second'"
	}
	h.exec(`INSERT INTO ownership_intents (organization_id, kind, external_key, operation_id, holder, lease_expires_at) VALUES ($1, 'worker', 'prod/api', $2, 'a stopped Host', `+lease+`)`, h.org.ID, op)
	h.exec(`UPDATE workers SET generation = 2 WHERE uid = $1`, w["uid"])
	h.exec(`INSERT INTO deployments (id, organization_id, resource_kind, resource_uid, generation, native_name, offering_id, offering_digest, pack, installation, status)
		SELECT $1, organization_id, 'worker', uid, 2, script_name, offering_id, offering_digest, pack, installation, 'pending' FROM workers WHERE uid = $2`, deployment, w["uid"])
	var seq int64
	require.NoError(t, h.db.QueryRow(context.Background(), "SELECT seq FROM deployments WHERE id = $1", deployment).Scan(&seq))
	h.exec(`INSERT INTO backend_effects (id, operation_id, deployment_id, action, status) VALUES ($1, $2, $3, 'apply', 'dispatched')`, uuid.New(), op, deployment)
	if landed {
		mut, err := packs.Registry().Mutator(catalog.DefaultWithRuntime(h.runtime.Info.AdminURL, h.runtime.Info.TokenFile, h.runtime.Info.EdgeAddr).Installations["selfhost"])
		require.NoError(t, err)
		obs, err := mut.Apply(context.Background(), backend.Desired{
			Kind: backend.NativeWorker, NativeName: w["scriptName"].(string), DeploymentID: deployment, EffectID: uuid.New(),
			ResourceUID: uuid.MustParse(w["uid"].(string)), Sequence: seq,
			Bundle: &backend.Bundle{Modules: map[string]string{"index.js": helloModule}, MainModule: "index.js", CompatibilityDate: "2025-01-01"},
		})
		require.NoError(t, err)
		require.True(t, obs.Admitted)
	}
	require.Equal(t, false, h.get("/v1/spaces/prod/workers/api").json(t)["ready"], "generation 2 has no active deployment yet")
	return op, deployment
}

func (h *harness) status(sql string, args ...any) string {
	h.t.Helper()
	var s string
	require.NoError(h.t, h.db.QueryRow(context.Background(), sql, args...).Scan(&s))
	return s
}

func TestRecoveryRecordsAnApplyThatLandedAsActive(t *testing.T) {
	t.Parallel()
	h := setup(t)
	op, deployment := crashedApply(t, h, true, true)
	h.host.Sweep(context.Background())
	require.Equal(t, "active", h.status("SELECT status FROM deployments WHERE id = $1", deployment))
	require.Equal(t, "succeeded", h.status("SELECT status FROM backend_effects WHERE deployment_id = $1", deployment))
	require.Equal(t, "refused", h.status("SELECT status FROM operations WHERE id = $1", op))
	require.Equal(t, "abandoned", h.status("SELECT code FROM operations WHERE id = $1", op))
	require.Zero(t, h.count("SELECT count(*) FROM ownership_intents"), "the lease is released")
	require.Equal(t, true, h.get("/v1/spaces/prod/workers/api").json(t)["ready"])
	require.Equal(t, "deleted", h.status(`SELECT status FROM deployments WHERE generation = 1`), "the older generation was replaced")
}

func TestRecoveryRecordsAnApplyThatDidNotLandAsFailed(t *testing.T) {
	t.Parallel()
	h := setup(t)
	op, deployment := crashedApply(t, h, false, true)
	h.host.Sweep(context.Background())
	require.Equal(t, "failed", h.status("SELECT status FROM deployments WHERE id = $1", deployment))
	require.Equal(t, "failed", h.status("SELECT status FROM backend_effects WHERE deployment_id = $1", deployment))
	require.Equal(t, "refused", h.status("SELECT status FROM operations WHERE id = $1", op))
}

// TestRecoverySkipsAnOperationWhoseLeaseIsLive: a request whose Host still renews its lease is not
// abandoned, and another request on its key waits for it (intent_in_progress).
func TestRecoverySkipsAnOperationWhoseLeaseIsLive(t *testing.T) {
	t.Parallel()
	h := setup(t, func(o *options) { o.busyWait = 50 * 1e6 })
	op, _ := crashedApply(t, h, true, false)
	h.host.Sweep(context.Background())
	require.Equal(t, "running", h.status("SELECT status FROM operations WHERE id = $1", op))
	body := workerBody()
	body["compatibilityDate"] = "2025-02-02"
	h.putWorker("prod", "api", workerToken, body).problem(t, http.StatusConflict, "intent_in_progress")
}

func TestTheOwnersRetryRecoversTheStoppedRequestFirst(t *testing.T) {
	t.Parallel()
	h := setup(t)
	op, deployment := crashedApply(t, h, true, true)
	// The owner's next request on the worker settles the stopped one before it starts.
	body := workerBody()
	body["compatibilityDate"] = "2025-02-02"
	r := h.putWorker("prod", "api", workerToken, body)
	require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
	require.Equal(t, "refused", h.status("SELECT status FROM operations WHERE id = $1", op))
	require.Equal(t, "deleted", h.status("SELECT status FROM deployments WHERE id = $1", deployment), "superseded by the retry's own generation")
	require.Equal(t, true, r.json(t)["ready"])
}

func (h *harness) count(sql string, args ...any) int {
	h.t.Helper()
	var n int
	require.NoError(h.t, h.db.QueryRow(context.Background(), sql, args...).Scan(&n))
	return n
}
