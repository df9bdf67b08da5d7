package server_test

import (
	"net/http"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// The custody stories of issue 7, each a named test that failed before and holds now. The
// invariant they serve (SPEC 3.3): while any endpoint row names a canonical origin, or any backend
// may still route it, no other reservation of any organization can hold that origin.

// custodyHolds checks the invariant directly in SQL: no origin an endpoint that may stand names is
// held by a reservation other than the one that endpoint was created on.
func (h *harness) custodyHolds() {
	h.t.Helper()
	n := h.count(`SELECT count(*) FROM worker_endpoints e
		JOIN worker_endpoint_origin_reservations r ON r.canonical_origin = e.canonical_origin
		WHERE e.status <> 'deleted'
		  AND (r.status IN ('prepared', 'bound', 'activated') OR (r.status = 'expired' AND r.endpoint_uid IS NOT NULL))
		  AND NOT (r.organization_id = e.organization_id AND r.id = e.origin_reservation_id)`)
	require.Zero(h.t, n, "an origin an endpoint stands on is held by another reservation")
}

// TestCustodyAnEndpointCreatedOnAReservationFencesItsRelease: "A reservation bound to a worker whose
// endpoint was created on it (not yet activated) can be released with DELETE, and another
// organization then reserves the same origin while the endpoint still stands."
func TestCustodyAnEndpointCreatedOnAReservationFencesItsRelease(t *testing.T) {
	t.Parallel()
	h := setup(t)
	res := h.putReservation(h.key, "res-api", tokenA, map[string]any{"space": "prod", "workerName": "api", "subdomain": "shop"}).json(t)
	h.mustWorker("prod", "api", workerToken)
	e := h.mustEndpoint("prod", "api", endpointToken, map[string]any{"worker": "api", "originReservationId": "res-api"})
	got := h.getReservation(h.key, "res-api").json(t)
	require.Equal(t, e["uid"], got["endpoint"].(map[string]any)["uid"], "the endpoint is recorded when it is created, not when it is activated")

	p := h.deleteReservation(h.key, "res-api", tokenA).problem(t, http.StatusConflict, "release_fenced")
	require.Equal(t, []any{"endpoint_present", "deployment_live"}, p["unmetFences"])
	_, otherKey := h.newOrg("globex")
	h.putReservation(otherKey, "res-steal", tokenB, map[string]any{"space": "prod", "workerName": "api", "subdomain": "shop"}).
		problem(t, http.StatusConflict, "origin_taken")
	require.Equal(t, res["canonicalOrigin"], h.getReservation(h.key, "res-api").json(t)["canonicalOrigin"])
	h.custodyHolds()
}

// TestCustodyOneReservationNeverCarriesTwoEndpoints: "A second endpoint naming the same reservation
// is accepted (201, 201): two endpoints, one origin, and deleting either takes the route down for
// both." Two creates race for it; one wins, and deleting the loser's nothing touches the winner.
func TestCustodyOneReservationNeverCarriesTwoEndpoints(t *testing.T) {
	t.Parallel()
	h := setup(t)
	require.Equal(t, http.StatusCreated, h.putReservation(h.key, "res-api", tokenA, apiBody("prod", "api")).status)
	h.mustWorker("prod", "api", workerToken)
	start := make(chan struct{})
	replies := make([]reply, 2)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for i, name := range []string{"one", "two"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			replies[i], errs[i] = h.try(req{method: http.MethodPut, path: "/v1/spaces/prod/worker-endpoints/" + name, key: h.key,
				token: "token-endpoint-race-" + name, body: map[string]any{"worker": "api", "originReservationId": "res-api"}})
		}()
	}
	close(start)
	wg.Wait()
	require.NoError(t, errs[0])
	require.NoError(t, errs[1])
	statuses := []int{replies[0].status, replies[1].status}
	require.ElementsMatch(t, []int{http.StatusCreated, http.StatusConflict}, statuses, "%s / %s", replies[0].body, replies[1].body)
	require.Equal(t, 1, h.count("SELECT count(*) FROM worker_endpoints WHERE status <> 'deleted'"))
	h.custodyHolds()
}

// TestCustodyExpiryKeepsAWitnessedOrigin: "A reservation with a 60-second TTL, bound and carrying
// an endpoint, expires and its origin goes to another organization."
func TestCustodyExpiryKeepsAWitnessedOrigin(t *testing.T) {
	t.Parallel()
	h := setup(t)
	require.Equal(t, http.StatusCreated, h.putReservation(h.key, "res-api", tokenA,
		map[string]any{"space": "prod", "workerName": "api", "subdomain": "shop", "ttlSeconds": 60}).status)
	h.mustWorker("prod", "api", workerToken)
	h.mustEndpoint("prod", "api", endpointToken, map[string]any{"worker": "api", "originReservationId": "res-api"})
	h.advance("2 days")
	require.Equal(t, "bound", h.getReservation(h.key, "res-api").json(t)["status"], "a published row does not age")
	_, otherKey := h.newOrg("globex")
	h.putReservation(otherKey, "res-steal", tokenB, map[string]any{"space": "prod", "workerName": "api", "subdomain": "shop"}).
		problem(t, http.StatusConflict, "origin_taken")
	h.custodyHolds()

	// Even a row whose endpoint went away but may still answer keeps the origin after its TTL.
	h.exec(`UPDATE worker_endpoints SET status = 'deleted'`)
	h.exec(`INSERT INTO deletion_attestations (uid, organization_id, resource_kind, status) SELECT uid, organization_id, 'worker-endpoint', 'open' FROM worker_endpoints`)
	h.advance("2 days")
	require.Equal(t, "expired", h.getReservation(h.key, "res-api").json(t)["status"])
	h.putReservation(otherKey, "res-steal", tokenB, map[string]any{"space": "prod", "workerName": "api", "subdomain": "shop"}).
		problem(t, http.StatusConflict, "origin_taken")
}

// TestCustodyAnEndpointCreateHeldAtItsRouteAlreadyHoldsTheWitness: the witness is written in the
// endpoint create's first transaction, so while the create is held at its route (before any
// activation) the origin is already fenced. The same with the Host process killed at that point is
// server/cmd/takoserver's TestAHostKilledBetweenEndpointCreateAndActivationLeavesTheWitness.
func TestCustodyAnEndpointCreateHeldAtItsRouteAlreadyHoldsTheWitness(t *testing.T) {
	t.Parallel()
	hb, wrap := holding()
	h := setup(t, wrap)
	require.Equal(t, http.StatusCreated, h.putReservation(h.key, "res-api", tokenA, apiBody("prod", "api")).status)
	w := h.mustWorker("prod", "api", workerToken)
	release := hb.holdNext(h.status("SELECT hostname FROM (SELECT split_part(canonical_origin, '://', 2) AS hp FROM worker_endpoint_origin_reservations) o, LATERAL (SELECT split_part(o.hp, ':', 1) AS hostname) x"))
	var once sync.Once
	t.Cleanup(func() { once.Do(func() { close(release) }) })
	done := make(chan reply, 1)
	go func() {
		r, _ := h.try(req{method: http.MethodPut, path: "/v1/spaces/prod/worker-endpoints/api", key: h.key, token: endpointToken,
			body: map[string]any{"worker": "api", "originReservationId": "res-api"}})
		done <- r
	}()
	<-hb.entered // the endpoint's first transaction committed; its route is being applied
	got := h.getReservation(h.key, "res-api").json(t)
	require.NotNil(t, got["endpoint"], "the witness is in place before the route is")
	require.Equal(t, w["uid"], got["boundWorker"].(map[string]any)["uid"])
	h.deleteReservation(h.key, "res-api", tokenA).problem(t, http.StatusConflict, "release_fenced")
	once.Do(func() { close(release) })
	require.Equal(t, http.StatusCreated, (<-done).status)
}

// TestCustodyAMintedRowIsReleasedOnceItsWorkerIsGone: "a minted row is released under the fences
// once its worker is deleted", and re-applying mints the same address.
func TestCustodyAMintedRowIsReleasedOnceItsWorkerIsGone(t *testing.T) {
	t.Parallel()
	h := setup(t)
	h.mustWorker("prod", "api", workerToken)
	e := h.mustEndpoint("prod", "api", endpointToken, map[string]any{"worker": "api"})
	require.Equal(t, http.StatusOK, h.deleteEndpoint("prod", "api", endpointToken).status)
	require.Equal(t, http.StatusOK, h.deleteWorker("prod", "api", workerToken).status)
	require.Equal(t, "released", h.status("SELECT status FROM worker_endpoint_origin_reservations WHERE id = $1", e["originReservationId"]))
	h.mustWorker("prod", "api", "token-worker-0000000002")
	again := h.mustEndpoint("prod", "api", "token-endpoint-00000002", map[string]any{"worker": "api"})
	require.Equal(t, e["url"], again["url"], "the same Host-minted origin")
}

// TestCustodyTheDerivationSaysWhetherTheOriginIsFree: the derivation route (read scope) answers
// available: false for an origin another organization holds, without naming it, and true for
// the holder's own reservation.
func TestCustodyTheDerivationSaysWhetherTheOriginIsFree(t *testing.T) {
	t.Parallel()
	h := setup(t)
	require.Equal(t, http.StatusCreated, h.putReservation(h.key, "res-api", tokenA, map[string]any{"space": "prod", "workerName": "api", "subdomain": "shop"}).status)
	other, _ := h.newOrg("globex")
	readOnly := h.keyWith(other.Name, "resources:read").Key
	derive := func(key string, body map[string]any) map[string]any {
		r := h.do(req{method: http.MethodPost, path: "/v1/worker-endpoint-origin-derivations", key: key, body: body})
		require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
		return r.json(t)
	}
	d := derive(readOnly, map[string]any{"space": "prod", "workerName": "web", "subdomain": "shop"})
	require.Equal(t, false, d["available"])
	require.NotContains(t, string(h.do(req{method: http.MethodPost, path: "/v1/worker-endpoint-origin-derivations", key: readOnly,
		body: map[string]any{"space": "prod", "workerName": "web", "subdomain": "shop"}}).body), h.org.ID, "it says nothing about whose")
	require.Equal(t, true, derive(readOnly, map[string]any{"space": "prod", "workerName": "web", "subdomain": "other"})["available"])
	require.Equal(t, true, derive(h.key, map[string]any{"space": "prod", "workerName": "api", "subdomain": "shop", "originReservationId": "res-api"})["available"])
	require.Equal(t, false, derive(h.key, map[string]any{"space": "prod", "workerName": "api", "subdomain": "shop", "originReservationId": "res-new"})["available"])
	require.Equal(t, 1, h.rowCount("true"), "the derivation writes nothing")
}
