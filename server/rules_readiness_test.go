package server_test

// Rules of SPEC 3.3 about readiness and placement that had only their happy path tested: an
// endpoint needs its worker Ready (not merely present), and an activation needs its endpoint Ready
// and on the reservation's placement.

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/backend"
)

// TestRuleAnEndpointNeedsAReadyWorkerNotOnlyAPresentOne: a worker whose update reached the
// runtime while its answer was lost is present (GET answers it) but not Ready (its current
// generation's deployment is not active): an endpoint on it is refused with worker_not_ready and
// nothing of the endpoint is written. Once the worker is applied again and Ready, the same
// endpoint request succeeds.
func TestRuleAnEndpointNeedsAReadyWorkerNotOnlyAPresentOne(t *testing.T) {
	t.Parallel()
	o := &outage{}
	h := setup(t, func(opts *options) {
		opts.wrap = func(m backend.Mutator) backend.Mutator { o.Mutator = m; return o }
	})
	require.Equal(t, http.StatusCreated, h.putReservation(h.key, "res-api", tokenA, apiBody("prod", "api")).status)
	h.mustWorker("prod", "api", workerToken)
	update := workerBody()
	update["compatibilityDate"] = "2025-06-01"
	o.down.Store(true)
	w := h.putWorker("prod", "api", workerToken, update)
	require.Equal(t, http.StatusServiceUnavailable, w.status, "body: %s", w.body)
	o.down.Store(false)

	got := h.get("/v1/spaces/prod/workers/api")
	require.Equal(t, http.StatusOK, got.status, "the worker is present: body %s", got.body)
	require.Equal(t, false, got.json(t)["ready"], "and not Ready: %s", got.body)

	p := h.putEndpoint("prod", "api", endpointToken, map[string]any{"worker": "api", "originReservationId": "res-api"}).
		problem(t, http.StatusConflict, "worker_not_ready")
	require.Contains(t, p["detail"], "not Ready")
	require.Zero(t, h.count(`SELECT count(*) FROM worker_endpoints`), "a refused endpoint writes nothing")
	require.Equal(t, "prepared", h.getReservation(h.key, "res-api").json(t)["status"], "and binds nothing")

	// Applied again, the worker is Ready and the endpoint is created.
	require.Contains(t, []int{http.StatusOK, http.StatusCreated}, h.putWorker("prod", "api", workerToken, update).status)
	h.mustEndpoint("prod", "api", endpointToken, map[string]any{"worker": "api", "originReservationId": "res-api"})
}

// TestRuleActivationRefusesAnEndpointThatIsNotReady: "Activation requires ... the endpoint Ready
// at its current generation." An endpoint whose route's deployment failed stands on the
// reservation (its witness) but is not Ready: the activation is refused and the reservation stays
// bound; once the deployment is active again the same activation succeeds.
func TestRuleActivationRefusesAnEndpointThatIsNotReady(t *testing.T) {
	t.Parallel()
	h := setup(t)
	require.Equal(t, http.StatusCreated, h.putReservation(h.key, "res-api", tokenA, apiBody("prod", "api")).status)
	h.mustWorker("prod", "api", workerToken)
	e := h.mustEndpoint("prod", "api", endpointToken, map[string]any{"worker": "api", "originReservationId": "res-api"})
	// The backend refused the endpoint's route (the state a refused route deployment leaves;
	// written in SQL, since a refused create leaves no endpoint and this one must stand).
	h.exec(`UPDATE deployments SET status = 'failed' WHERE resource_uid = $1`, e["uid"])
	got := h.get("/v1/spaces/prod/worker-endpoints/api").json(t)
	require.Equal(t, false, got["ready"])

	p := h.putActivation("res-api", activateToken, e["uid"].(string)).problem(t, http.StatusConflict, "activation_mismatch")
	require.Contains(t, p["detail"], "not Ready")
	require.Equal(t, "bound", h.getReservation(h.key, "res-api").json(t)["status"], "a refused activation changes nothing")

	h.exec(`UPDATE deployments SET status = 'active' WHERE resource_uid = $1`, e["uid"])
	a := h.putActivation("res-api", activateToken, e["uid"].(string))
	require.Equal(t, http.StatusCreated, a.status, "body: %s", a.body)
	require.Equal(t, "activated", a.json(t)["status"])
}

// TestRuleActivationRefusesAnotherPlacement: "Activation requires ... the same placement." The
// reservation's stored placement is another installation than the endpoint's (every other
// requirement met): the activation is refused with placement_drift and nothing changes.
func TestRuleActivationRefusesAnotherPlacement(t *testing.T) {
	t.Parallel()
	h := setup(t)
	require.Equal(t, http.StatusCreated, h.putReservation(h.key, "res-api", tokenA, apiBody("prod", "api")).status)
	h.mustWorker("prod", "api", workerToken)
	e := h.mustEndpoint("prod", "api", endpointToken, map[string]any{"worker": "api", "originReservationId": "res-api"})
	require.Equal(t, true, e["ready"])
	// (Written in SQL: an endpoint create refuses a reservation of another placement, so no
	// request binds one; the activation's own check is tested alone.)
	h.exec(`UPDATE worker_endpoint_origin_reservations SET installation = 'another-installation' WHERE id = 'res-api'`)

	p := h.putActivation("res-api", activateToken, e["uid"].(string)).problem(t, http.StatusConflict, "placement_drift")
	require.Contains(t, p["detail"], "another-installation")
	require.Equal(t, "bound", h.getReservation(h.key, "res-api").json(t)["status"], "a refused activation changes nothing")
}
