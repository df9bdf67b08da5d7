package server_test

// One named test per rule of SPEC 3.3 and 3.4 that the other files do not already name, and the
// failure stories of the design notes' amendments, each against real PostgreSQL.

import (
	"context"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"
)

// twoWorkerOfferings sells two module-worker offerings on one selfhost installation.
const twoWorkerOfferings = `{
  "installations": [{"name": "local", "pack": "selfhost"}],
  "offerings": [
    {"id": "worker-a", "kind": "module-worker", "installation": "local", "soldTo": ["*"]},
    {"id": "worker-b", "kind": "module-worker", "installation": "local", "soldTo": ["*"]},
    {"id": "endpoint", "kind": "worker-endpoint", "installation": "local", "soldTo": ["*"]}
  ]
}`

func (h *harness) mustWorker(space, name, token string) map[string]any {
	h.t.Helper()
	r := h.putWorker(space, name, token, workerBody())
	require.Contains(h.t, []int{http.StatusCreated, http.StatusOK}, r.status, "body: %s", r.body)
	return r.json(h.t)
}

func (h *harness) mustEndpoint(space, name, token string, body map[string]any) map[string]any {
	h.t.Helper()
	r := h.putEndpoint(space, name, token, body)
	require.Equal(h.t, http.StatusCreated, r.status, "body: %s", r.body)
	return r.json(h.t)
}

func (h *harness) exec(sql string, args ...any) {
	h.t.Helper()
	_, err := h.db.Exec(context.Background(), sql, args...)
	require.NoError(h.t, err)
}

func TestRuleV1RowsStayReadableAndAreNeverWritten(t *testing.T) {
	t.Parallel()
	h := setup(t)
	h.exec(`INSERT INTO worker_endpoint_origin_reservations (organization_id, id, uid, format, space, worker_name, subdomain,
		canonical_origin, ttl_seconds, status, expires_at, offering_id, offering_digest, pack, installation)
		VALUES ($1, 'res-old', gen_random_uuid(), 'takoserver.worker-endpoint-origin-reservation.v1', 'prod', 'legacy', 'legacy',
		'http://legacy.workers.localhost:8787', 86400, 'prepared', now() + interval '1 day', 'o', 'd', 'selfhost', 'selfhost')`, h.org.ID)
	got := h.getReservation(h.key, "res-old").json(t)
	require.Equal(t, "takoserver.worker-endpoint-origin-reservation.v1", got["format"])
	h.putReservation(h.key, "res-old", tokenA, apiBody("prod", "legacy")).problem(t, http.StatusConflict, "reservation_conflict")
	h.deleteReservation(h.key, "res-old", tokenA).problem(t, http.StatusNotFound, "not_found")
	require.Equal(t, "takoserver.worker-endpoint-origin-reservation.v1", h.getReservation(h.key, "res-old").json(t)["format"])
}

func TestRuleBindRequiresTheWorkerReadyAsDerivedNow(t *testing.T) {
	t.Parallel()
	h := setup(t)
	require.Equal(t, http.StatusCreated, h.putReservation(h.key, "res-api", tokenA, apiBody("prod", "api")).status)
	h.mustWorker("prod", "api", workerToken)
	// The deployment failed after the worker was created: the stored condition is not consulted.
	h.exec("UPDATE deployments SET status = 'failed'")
	h.putEndpoint("prod", "api", endpointToken, map[string]any{"worker": "api", "originReservationId": "res-api"}).
		problem(t, http.StatusConflict, "worker_not_ready")
	require.Equal(t, "prepared", h.getReservation(h.key, "res-api").json(t)["status"], "a refused bind changes nothing")
}

func TestRuleBindRequiresTheReservationsSpaceAndWorker(t *testing.T) {
	t.Parallel()
	h := setup(t)
	require.Equal(t, http.StatusCreated, h.putReservation(h.key, "res-web", tokenA, apiBody("prod", "web")).status)
	h.mustWorker("prod", "api", workerToken)
	h.putEndpoint("prod", "api", endpointToken, map[string]any{"worker": "api", "originReservationId": "res-web"}).
		problem(t, http.StatusConflict, "reservation_mismatch")
}

// TestRuleReplacementKeepsTheReservation: "A reservation whose bound worker is provably gone may be
// bound to a new worker UID of the same space and name" — the origin survives the replacement.
func TestRuleReplacementKeepsTheReservation(t *testing.T) {
	t.Parallel()
	h := setup(t)
	res := h.putReservation(h.key, "res-api", tokenA, apiBody("prod", "api")).json(t)
	h.mustWorker("prod", "api", workerToken)
	h.mustEndpoint("prod", "api", endpointToken, map[string]any{"worker": "api", "originReservationId": "res-api"})
	require.Equal(t, http.StatusOK, h.deleteEndpoint("prod", "api", endpointToken).status)
	require.Equal(t, http.StatusOK, h.deleteWorker("prod", "api", workerToken).status)
	// A new incarnation of the same worker name has a new UID, and takes the reservation over.
	w := h.mustWorker("prod", "api", "token-worker-0000000002")
	e := h.mustEndpoint("prod", "api", "token-endpoint-00000002", map[string]any{"worker": "api", "originReservationId": "res-api"})
	require.Equal(t, res["canonicalOrigin"].(string)+"/", e["url"])
	got := h.getReservation(h.key, "res-api").json(t)
	require.Equal(t, w["uid"], got["boundWorker"].(map[string]any)["uid"])
	require.Equal(t, e["uid"], got["endpoint"].(map[string]any)["uid"])
}

// TestRuleAReservationWhoseOldWorkerMayStillRunAnswersWitnessOpen: "While the old row is absent but
// a fence is still open (attestation, deployment, lease), both answer 409 code witness_open with
// unmetFences, retryable; never a reallocation."
func TestRuleAReservationWhoseOldWorkerMayStillRunAnswersWitnessOpen(t *testing.T) {
	t.Parallel()
	h := setup(t)
	require.Equal(t, http.StatusCreated, h.putReservation(h.key, "res-api", tokenA, apiBody("prod", "api")).status)
	old := h.mustWorker("prod", "api", workerToken)
	first := h.mustEndpoint("prod", "api", endpointToken, map[string]any{"worker": "api", "originReservationId": "res-api"})
	require.Equal(t, http.StatusOK, h.deleteEndpoint("prod", "api", endpointToken).status)
	require.Equal(t, http.StatusOK, h.deleteWorker("prod", "api", workerToken).status)
	// The old worker's deletion has not been confirmed.
	h.exec("UPDATE deletion_attestations SET status = 'open', closed_at = NULL WHERE uid = $1", old["uid"])
	h.mustWorker("prod", "api", "token-worker-0000000002")
	r := h.putEndpoint("prod", "api", "token-endpoint-00000002", map[string]any{"worker": "api", "originReservationId": "res-api"})
	p := r.problem(t, http.StatusConflict, "witness_open")
	require.Equal(t, []any{"attestation_open"}, p["unmetFences"])
	require.Equal(t, "1", r.header.Get("Retry-After"))
	got := h.getReservation(h.key, "res-api").json(t)
	require.Equal(t, old["uid"], got["boundWorker"].(map[string]any)["uid"], "nothing moved")
	require.Equal(t, first["uid"], got["endpoint"].(map[string]any)["uid"])

	// Once the old worker is provably gone, the same request succeeds.
	h.exec("UPDATE deletion_attestations SET status = 'closed', closed_at = now() WHERE uid = $1", old["uid"])
	require.Equal(t, http.StatusCreated, h.putEndpoint("prod", "api", "token-endpoint-00000002", map[string]any{"worker": "api", "originReservationId": "res-api"}).status)
}

// TestRuleOneReservationCarriesOneEndpoint: "a second endpoint naming a reservation whose witness is
// another endpoint that is still present is refused (409 reservation_bound_elsewhere, final)".
func TestRuleOneReservationCarriesOneEndpoint(t *testing.T) {
	t.Parallel()
	h := setup(t)
	require.Equal(t, http.StatusCreated, h.putReservation(h.key, "res-api", tokenA, apiBody("prod", "api")).status)
	h.mustWorker("prod", "api", workerToken)
	first := h.mustEndpoint("prod", "api", endpointToken, map[string]any{"worker": "api", "originReservationId": "res-api"})
	h.putEndpoint("prod", "api-2", "token-endpoint-00000002", map[string]any{"worker": "api", "originReservationId": "res-api"}).
		problem(t, http.StatusConflict, "reservation_bound_elsewhere")
	got := h.getReservation(h.key, "res-api").json(t)
	require.Equal(t, first["uid"], got["endpoint"].(map[string]any)["uid"])
	require.Equal(t, 1, h.count("SELECT count(*) FROM worker_endpoints WHERE status <> 'deleted'"))
}

func TestRuleAWorkerRevisionThatMovedDoesNotRefuseTheRetry(t *testing.T) {
	t.Parallel()
	h := setup(t)
	require.Equal(t, http.StatusCreated, h.putReservation(h.key, "res-api", tokenA, apiBody("prod", "api")).status)
	w := h.mustWorker("prod", "api", workerToken)
	h.mustEndpoint("prod", "api", endpointToken, map[string]any{"worker": "api", "originReservationId": "res-api"})
	bound := h.getReservation(h.key, "res-api").json(t)["boundWorker"].(map[string]any)
	require.Equal(t, w["uid"], bound["uid"])
	require.Equal(t, http.StatusOK, h.deleteEndpoint("prod", "api", endpointToken).status)

	// The worker re-renders: its revision moves.
	body := workerBody()
	body["compatibilityDate"] = "2025-06-01"
	moved := h.putWorker("prod", "api", workerToken, body).json(t)
	require.Greater(t, moved["revision"].(float64), bound["revision"].(float64))

	// Declaring the endpoint again advances the binding under CAS instead of refusing it.
	h.mustEndpoint("prod", "api", "token-endpoint-00000002", map[string]any{"worker": "api", "originReservationId": "res-api"})
	rebound := h.getReservation(h.key, "res-api").json(t)["boundWorker"].(map[string]any)
	require.Equal(t, w["uid"], rebound["uid"])
	require.Equal(t, moved["revision"], rebound["revision"])
}

func TestRuleActivationRequiresTheReservationsOriginAndWorker(t *testing.T) {
	t.Parallel()
	h := setup(t)
	require.Equal(t, http.StatusCreated, h.putReservation(h.key, "res-api", tokenA, apiBody("prod", "api")).status)
	require.Equal(t, http.StatusCreated, h.putReservation(h.key, "res-web", tokenB, apiBody("prod", "web")).status)
	h.mustWorker("prod", "api", workerToken)
	h.mustWorker("prod", "web", "token-worker-web-000001")
	api := h.mustEndpoint("prod", "api", endpointToken, map[string]any{"worker": "api", "originReservationId": "res-api"})
	h.mustEndpoint("prod", "web", "token-endpoint-web-0001", map[string]any{"worker": "web", "originReservationId": "res-web"})

	// An endpoint of another worker, at another origin, cannot activate res-web.
	h.putActivation("res-web", activateToken, api["uid"].(string)).problem(t, http.StatusConflict, "activation_mismatch")
	require.Equal(t, "bound", h.getReservation(h.key, "res-web").json(t)["status"])

	// A prepared reservation (never bound) cannot be activated either.
	require.Equal(t, http.StatusCreated, h.putReservation(h.key, "res-other", "token-cccccccccccccccc", apiBody("prod", "other")).status)
	h.putActivation("res-other", "token-activate-00000002", api["uid"].(string)).problem(t, http.StatusConflict, "activation_mismatch")

	// The right endpoint activates, and a replay with the same endpoint is idempotent.
	first := h.putActivation("res-api", activateToken, api["uid"].(string))
	require.Equal(t, http.StatusCreated, first.status, "body: %s", first.body)
	again := h.putActivation("res-api", activateToken, api["uid"].(string))
	require.Equal(t, first.body, again.body)
	require.Equal(t, "true", again.header.Get("Takoform-Replayed"))
}

func TestRulePlacementDriftIsRefused(t *testing.T) {
	t.Parallel()
	h := setup(t, func(o *options) { o.catalogJSON = twoWorkerOfferings })
	// The reservation is placed on worker-a; the worker runs on worker-b.
	require.Equal(t, http.StatusCreated, h.putReservation(h.key, "res-api", tokenA, map[string]any{"space": "prod", "workerName": "api", "offeringId": "worker-a"}).status)
	body := workerBody()
	body["offeringId"] = "worker-b"
	require.Equal(t, http.StatusCreated, h.putWorker("prod", "api", workerToken, body).status)
	h.putEndpoint("prod", "api", endpointToken, map[string]any{"worker": "api", "originReservationId": "res-api"}).
		problem(t, http.StatusConflict, "placement_drift")

	// A worker cannot move to another offering in place either.
	body["offeringId"] = "worker-a"
	h.putWorker("prod", "api", workerToken, body).problem(t, http.StatusConflict, "placement_drift")
}

func TestRuleTheMintReadsPlacementOffTheWorkersOwnDeployment(t *testing.T) {
	t.Parallel()
	// Two worker offerings make a catalog lookup ambiguous; the mint never asks the catalog.
	h := setup(t, func(o *options) { o.catalogJSON = twoWorkerOfferings })
	body := workerBody()
	body["offeringId"] = "worker-b"
	require.Equal(t, http.StatusCreated, h.putWorker("prod", "api", workerToken, body).status)
	e := h.mustEndpoint("prod", "api", endpointToken, map[string]any{"worker": "api"})
	offering := h.status("SELECT offering_id FROM worker_endpoint_origin_reservations WHERE id = $1", e["originReservationId"])
	require.Equal(t, "worker-b", offering)
}

func TestRuleHostMintedRowsAreReadableOnlyByTheirOrganization(t *testing.T) {
	t.Parallel()
	h := setup(t)
	h.mustWorker("prod", "api", workerToken)
	e := h.mustEndpoint("prod", "api", endpointToken, map[string]any{"worker": "api"})
	id := e["originReservationId"].(string)
	got := h.getReservation(h.key, id).json(t)
	require.Equal(t, true, got["hostMinted"])
	require.Nil(t, got["ownershipToken"], "no caller owns a minted row")
	_, otherKey := h.newOrg("globex")
	h.getReservation(otherKey, id).problem(t, http.StatusNotFound, "not_found")
	h.putActivation(id, activateToken, e["uid"].(string)).problem(t, http.StatusForbidden, "hostmint_namespace")
}

func TestRuleDestroyThenReapplyPublishesAtTheIdenticalOrigin(t *testing.T) {
	t.Parallel()
	h := setup(t)
	h.mustWorker("prod", "api", workerToken)
	first := h.mustEndpoint("prod", "api", endpointToken, map[string]any{"worker": "api"})
	require.Equal(t, http.StatusOK, h.deleteEndpoint("prod", "api", endpointToken).status)
	require.Equal(t, http.StatusOK, h.deleteWorker("prod", "api", workerToken).status)

	// A new incarnation: new worker UID, so a new minted id for the same derived address.
	h.mustWorker("prod", "api", "token-worker-0000000002")
	second := h.mustEndpoint("prod", "api", "token-endpoint-00000002", map[string]any{"worker": "api"})
	require.Equal(t, first["url"], second["url"])
	require.NotEqual(t, first["originReservationId"], second["originReservationId"])
	// The superseded row was released under the four fences, not left holding the address.
	status := h.status("SELECT status FROM worker_endpoint_origin_reservations WHERE id = $1", first["originReservationId"])
	require.Equal(t, "released", status)
}

func TestRuleASupersededRowWhoseEndpointMayStillAnswerStopsTheMint(t *testing.T) {
	t.Parallel()
	h := setup(t)
	h.mustWorker("prod", "api", workerToken)
	first := h.mustEndpoint("prod", "api", endpointToken, map[string]any{"worker": "api"})
	require.Equal(t, http.StatusOK, h.deleteEndpoint("prod", "api", endpointToken).status)
	// The old endpoint's deletion has not been confirmed.
	h.exec("UPDATE deletion_attestations SET status = 'open', closed_at = NULL WHERE uid = $1", first["uid"])
	require.Equal(t, http.StatusOK, h.deleteWorker("prod", "api", workerToken).status)
	status := h.status("SELECT status FROM worker_endpoint_origin_reservations WHERE id = $1", first["originReservationId"])
	require.Equal(t, "bound", status, "the worker delete's tail cannot release a row whose old endpoint may answer")

	h.mustWorker("prod", "api", "token-worker-0000000002")
	p := h.putEndpoint("prod", "api", "token-endpoint-00000002", map[string]any{"worker": "api"}).problem(t, http.StatusConflict, "witness_open")
	require.Equal(t, []any{"attestation_open"}, p["unmetFences"])
	status = h.status("SELECT status FROM worker_endpoint_origin_reservations WHERE id = $1", first["originReservationId"])
	require.Equal(t, "bound", status, "the old row keeps the address while the old endpoint may answer")
}

func TestRuleACallersLiveReservationStopsTheMint(t *testing.T) {
	t.Parallel()
	h := setup(t)
	w := h.mustWorker("prod", "api", workerToken)
	// No caller can hold the exact address the Host would mint for another worker: a derived
	// label is only ever its own worker's (SPEC 3.3, label_reserved).
	h.putReservation(h.key, "res-squat", tokenA, map[string]any{"space": "prod", "workerName": "other", "subdomain": w["scriptName"]}).
		problem(t, http.StatusUnprocessableEntity, "label_reserved")

	// A caller's live reservation for the worker itself stops the mint: use that reservation.
	require.Equal(t, http.StatusCreated, h.putReservation(h.key, "res-api", tokenB, map[string]any{"space": "prod", "workerName": "api", "subdomain": "mine"}).status)
	h.putEndpoint("prod", "api", endpointToken, map[string]any{"worker": "api"}).problem(t, http.StatusConflict, "reservation_conflict")
}

func TestRuleADelayedEndpointCreatePastTheTTLStillGetsItsEndpoint(t *testing.T) {
	t.Parallel()
	hb, wrap := holding()
	h := setup(t, wrap)
	w := h.mustWorker("prod", "api", workerToken)
	// The backend refuses the route once: the create stops after the mint bound the row.
	hb.failNext(hostOfScript(h, w["scriptName"].(string)))
	h.putEndpoint("prod", "api", endpointToken, map[string]any{"worker": "api"}).problem(t, http.StatusBadGateway, "backend_failed")

	// A day later the minted row has aged out without publishing.
	h.advance("25 hours")

	// The next apply retries with the same token: the mint sweeps, revives and publishes.
	e := h.putEndpoint("prod", "api", endpointToken, map[string]any{"worker": "api"})
	require.Equal(t, http.StatusCreated, e.status, "body: %s", e.body)
	require.Equal(t, true, e.json(t)["ready"])
	got := h.getReservation(h.key, e.json(t)["originReservationId"].(string)).json(t)
	require.Equal(t, "activated", got["status"])
}

// hostOfScript is the hostname the selfhost backend derives for a Host-minted endpoint of the
// worker whose script is scriptName.
func hostOfScript(h *harness, scriptName string) string {
	return scriptName + ".workers.localhost"
}

func TestRuleAnExpiredMintedRowThatPublishedIsRepairedNotRevived(t *testing.T) {
	t.Parallel()
	h := setup(t)
	h.mustWorker("prod", "api", workerToken)
	first := h.mustEndpoint("prod", "api", endpointToken, map[string]any{"worker": "api"})
	require.Equal(t, http.StatusOK, h.deleteEndpoint("prod", "api", endpointToken).status)
	h.exec("UPDATE worker_endpoint_origin_reservations SET expires_at = now() - interval '1 hour' WHERE host_minted")
	got := h.getReservation(h.key, first["originReservationId"].(string)).json(t)
	require.Equal(t, "expired", got["status"])
	require.NotNil(t, got["endpoint"], "it still holds its witness after expiry")

	// The witness is provably gone: the in-place clear repairs the row, and it publishes again.
	second := h.mustEndpoint("prod", "api", "token-endpoint-00000002", map[string]any{"worker": "api"})
	require.Equal(t, first["url"], second["url"])
	got = h.getReservation(h.key, first["originReservationId"].(string)).json(t)
	require.Equal(t, "activated", got["status"])
	require.Equal(t, second["uid"], got["endpoint"].(map[string]any)["uid"])
}

func TestRuleACreateRefusedAfterDispatchDoesNotWedgeTheWitnessClear(t *testing.T) {
	t.Parallel()
	h := setup(t)
	h.mustWorker("prod", "api", workerToken)
	e := h.mustEndpoint("prod", "api", endpointToken, map[string]any{"worker": "api"})
	id := e["originReservationId"].(string)
	// The ledger shape of an endpoint that never committed, left activated on its row: its row
	// abandoned, its apply effect dispatched and never settled, under an operation the Host
	// recorded as refused.
	h.exec(`UPDATE worker_endpoints SET status = 'deleted' WHERE uid = $1`, e["uid"])
	h.exec(`UPDATE operations SET status = 'refused', code = 'activation_mismatch' WHERE id = (SELECT operation_id FROM worker_endpoints WHERE uid = $1)`, e["uid"])
	h.exec(`UPDATE deployments SET status = 'pending' WHERE resource_uid = $1`, e["uid"])
	h.exec(`UPDATE backend_effects SET status = 'dispatched' WHERE deployment_id IN (SELECT id FROM deployments WHERE resource_uid = $1)`, e["uid"])
	h.exec(`UPDATE backend_effects SET operation_id = (SELECT operation_id FROM worker_endpoints WHERE uid = $1)
		WHERE deployment_id IN (SELECT id FROM deployments WHERE resource_uid = $1)`, e["uid"])
	h.exec(`DELETE FROM ownership_bindings WHERE kind = 'worker-endpoint'`)
	require.Equal(t, "activated", h.getReservation(h.key, id).json(t)["status"])

	// The janitor takes the route that never committed down (its create was refused), and a new
	// declaration of the endpoint clears that witness in place and publishes.
	h.host.Sweep(context.Background())
	again := h.putEndpoint("prod", "api-2", "token-endpoint-00000002", map[string]any{"worker": "api"})
	require.Equal(t, http.StatusCreated, again.status, "body: %s", again.body)
	got := h.getReservation(h.key, id).json(t)
	require.Equal(t, "activated", got["status"])
	require.Equal(t, again.json(t)["uid"], got["endpoint"].(map[string]any)["uid"])
}

func TestRuleReleaseReportsEachUnmetFence(t *testing.T) {
	t.Parallel()
	h := setup(t)
	require.Equal(t, http.StatusCreated, h.putReservation(h.key, "res-api", tokenA, apiBody("prod", "api")).status)
	h.mustWorker("prod", "api", workerToken)
	e := h.mustEndpoint("prod", "api", endpointToken, map[string]any{"worker": "api", "originReservationId": "res-api"})
	// Bound with the endpoint as witness (activation then deactivation).
	require.Equal(t, http.StatusCreated, h.putActivation("res-api", activateToken, e["uid"].(string)).status)
	require.Equal(t, http.StatusOK, h.deleteActivation("res-api", activateToken).status)

	p := h.deleteReservation(h.key, "res-api", tokenA).problem(t, http.StatusConflict, "release_fenced")
	require.ElementsMatch(t, []any{"endpoint_present", "deployment_live"}, p["unmetFences"])

	// The endpoint row is gone but its deletion is not confirmed and its deployment still stands.
	h.exec(`UPDATE worker_endpoints SET status = 'deleted' WHERE uid = $1`, e["uid"])
	h.exec(`INSERT INTO deletion_attestations (uid, organization_id, resource_kind, status) VALUES ($1, $2, 'worker-endpoint', 'open')`, e["uid"], h.org.ID)
	p = h.deleteReservation(h.key, "res-api", tokenA).problem(t, http.StatusConflict, "release_fenced")
	require.ElementsMatch(t, []any{"attestation_open", "deployment_live"}, p["unmetFences"])

	h.exec(`UPDATE deletion_attestations SET status = 'closed', closed_at = now()`)
	p = h.deleteReservation(h.key, "res-api", tokenA).problem(t, http.StatusConflict, "release_fenced")
	require.Equal(t, []any{"deployment_live"}, p["unmetFences"])

	h.exec(`UPDATE deployments SET status = 'deleted' WHERE resource_uid = $1`, e["uid"])
	released := h.deleteReservation(h.key, "res-api", tokenA)
	require.Equal(t, http.StatusOK, released.status, "body: %s", released.body)
	// Idempotent once terminal.
	again := h.deleteReservation(h.key, "res-api", tokenA)
	require.Equal(t, released.body, again.body)
}

func TestRuleDerivationWritesNothingAndMatchesTheMutationPath(t *testing.T) {
	t.Parallel()
	h := setup(t)
	d := h.do(req{method: http.MethodPost, path: "/v1/worker-endpoint-origin-derivations", key: h.key, body: apiBody("prod", "api")})
	require.Equal(t, http.StatusOK, d.status, "body: %s", d.body)
	derived := d.json(t)
	require.Zero(t, h.rowCount("true"))
	created := h.putReservation(h.key, "res-api", tokenA, apiBody("prod", "api")).json(t)
	require.Equal(t, created["canonicalOrigin"], derived["canonicalOrigin"])
	require.Equal(t, created["subdomain"], derived["hostMintedSubdomain"])
}

func TestRuleWFPManagedDefaultLabelIsTheDerivedProviderResourceName(t *testing.T) {
	t.Parallel()
	h := setup(t, func(o *options) {
		o.catalogJSON = `{
		  "installations": [{"name": "wfp", "pack": "wfp-managed", "baseDomain": "edge.example.com"}],
		  "offerings": [{"id": "wfp-worker", "kind": "module-worker", "installation": "wfp", "soldTo": ["*"]}]
		}`
	})
	d := h.do(req{method: http.MethodPost, path: "/v1/worker-endpoint-origin-derivations", key: h.key, body: apiBody("prod", "api")}).json(t)
	require.Nil(t, d["hostMintedSubdomain"], "a backend that sells its base domain mints no script-named label")
	require.Regexp(t, `^tsw-[0-9a-f]{24}$`, d["subdomain"])
	require.Equal(t, "https://"+d["subdomain"].(string)+".edge.example.com", d["canonicalOrigin"])
	// An installation without accountId and apiTokenFile derives names only: a mutation says so,
	// naming the installation, instead of pretending.
	p := h.putWorker("prod", "api", workerToken, workerBody()).problem(t, http.StatusBadGateway, "backend_misconfigured")
	require.Contains(t, p["detail"], "installation wfp")
}
