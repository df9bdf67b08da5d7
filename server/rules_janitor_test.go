package server_test

import (
	"context"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestRuleTheJanitorReleasesAnExpiredMintedRowOfADeletedWorker: "When the minted row's bound
// worker is deleted (its deletion attestation closed), the row is released under the four fences,
// by the worker delete's tail or the janitor." The tail cannot release it while the old endpoint's
// deletion is unconfirmed; the row then ages past its TTL (expired, its witness retained, so still
// holding the origin). The janitor leaves it while the fence is open, and releases it once the
// absence is confirmed: then another organization may take the origin.
func TestRuleTheJanitorReleasesAnExpiredMintedRowOfADeletedWorker(t *testing.T) {
	t.Parallel()
	h := setup(t)
	w := h.mustWorker("prod", "api", workerToken)
	e := h.mustEndpoint("prod", "api", endpointToken, map[string]any{"worker": "api"})
	id := e["originReservationId"].(string)
	require.Equal(t, http.StatusOK, h.deleteEndpoint("prod", "api", endpointToken).status)
	// The old endpoint's deletion has not been confirmed: the worker delete's tail leaves the row.
	// (Written in SQL: a real unconfirmed delete leaves the endpoint row deleting, which fences the
	// worker's delete itself; the janitor's rule is about an absent endpoint's open attestation.)
	h.exec("UPDATE deletion_attestations SET status = 'open', closed_at = NULL WHERE uid = $1", e["uid"])
	require.Equal(t, http.StatusOK, h.deleteWorker("prod", "api", workerToken).status)
	require.Equal(t, "bound", h.status("SELECT status FROM worker_endpoint_origin_reservations WHERE id = $1", id))

	h.advance("25 hours")
	got := h.getReservation(h.key, id).json(t)
	require.Equal(t, "expired", got["status"])
	require.NotNil(t, got["endpoint"], "expired, it keeps its witness and so its origin")
	// The worker's own address: another organization may never choose it (SPEC 3.3), and the
	// worker's organization cannot reserve it again while the expired row holds it.
	_, otherKey := h.newOrg("globex")
	steal := map[string]any{"space": "prod", "workerName": "api", "subdomain": w["scriptName"]}
	h.putReservation(otherKey, "res-steal", tokenB, steal).problem(t, http.StatusUnprocessableEntity, "label_reserved")
	again := map[string]any{"space": "prod", "workerName": "api"}
	require.Equal(t, http.StatusConflict, h.putReservation(h.key, "res-again", tokenB, again).status, "the expired row holds the origin")

	// The janitor runs while the fence is open: nothing is released.
	h.host.Sweep(context.Background())
	require.Equal(t, "expired", h.getReservation(h.key, id).json(t)["status"])

	// The absence is confirmed: the janitor releases the row, and the origin is free for its own
	// worker's next reservation (still never another organization's).
	h.exec("UPDATE deletion_attestations SET status = 'closed', closed_at = now() WHERE uid = $1", e["uid"])
	h.host.Sweep(context.Background())
	require.Equal(t, "released", h.status("SELECT status FROM worker_endpoint_origin_reservations WHERE id = $1", id))
	h.putReservation(otherKey, "res-steal", tokenB, steal).problem(t, http.StatusUnprocessableEntity, "label_reserved")
	r := h.putReservation(h.key, "res-again", "token-res-again-000001", again)
	require.Equal(t, http.StatusCreated, r.status, "body: %s", r.body)
	require.Equal(t, got["canonicalOrigin"], r.json(t)["canonicalOrigin"], "the same address")
}

// TestRulePreparationsNeedALiveReservation: "the Host takes the canonical origin from the (live,
// same-org, same space/worker) reservation". A preparation naming a released reservation, or one
// whose TTL passed, is refused and stores nothing: no sealed values for an origin nobody holds.
func TestRulePreparationsNeedALiveReservation(t *testing.T) {
	t.Parallel()
	h := setup(t)
	api := h.putReservation(h.key, "res-api", tokenA, apiBody("prod", "api"))
	require.Equal(t, http.StatusCreated, api.status)
	expiring := apiBody("prod", "web")
	expiring["ttlSeconds"] = 60
	require.Equal(t, http.StatusCreated, h.putReservation(h.key, "res-web", tokenB, expiring).status)
	// Both are live: a preparation on each would be taken (shown on res-api, then deleted).
	ok := h.prepare("op-live", "token-prepare-0000live", "res-api", "prod", "api", map[string]string{"API_KEY": secretCanary})
	require.Equal(t, http.StatusCreated, ok.reply.status, "body: %s", ok.reply.body)
	require.Equal(t, http.StatusOK, h.do(req{method: http.MethodDelete, path: prepPath(h.org.ID, "op-live"), key: h.key, token: "token-prepare-0000live"}).status)

	require.Equal(t, http.StatusOK, h.deleteReservation(h.key, "res-api", tokenA).status)
	h.getReservation(h.key, "res-api").problem(t, http.StatusNotFound, "not_found") // released
	released := h.prepareOn(h.key, h.org.ID, "op-released", "token-prepare-released", "res-api", api.json(t)["canonicalOrigin"].(string), "prod", "api",
		map[string]string{"API_KEY": secretCanary})
	require.Equal(t, http.StatusNotFound, released.reply.status, "a released reservation is no reservation: body %s", released.reply.body)

	h.advance("2 minutes")
	require.Equal(t, "expired", h.getReservation(h.key, "res-web").json(t)["status"])
	expired := h.prepare("op-expired", "token-prepare-0expired", "res-web", "prod", "web", map[string]string{"API_KEY": secretCanary})
	require.Equal(t, http.StatusConflict, expired.reply.status, "body: %s", expired.reply.body)
	require.Contains(t, string(expired.reply.body), "expired")

	require.Zero(t, h.count(`SELECT count(*) FROM runtime_input_preparations WHERE operation_id <> 'op-live'`), "a refused preparation stores nothing")
	require.NotContains(t, string(released.reply.body)+string(expired.reply.body), secretCanary)
}

// TestRuleTheJanitorStoresALapsedReservationExpired: "prepared --TTL--> expired". A reservation
// whose TTL passed reads expired at once (lazy expiry), and stays stored prepared, counting toward
// the organization's reservation ceiling in the quota counters, until something writes it: the
// janitor's sweep stores the expiry, and the counter lets go of it. A live reservation beside it
// is left alone.
func TestRuleTheJanitorStoresALapsedReservationExpired(t *testing.T) {
	t.Parallel()
	h := setup(t)
	require.Equal(t, http.StatusCreated, h.putReservation(h.key, "res-lapse", tokenA,
		map[string]any{"space": "prod", "workerName": "lapse", "ttlSeconds": 60}).status)
	require.Equal(t, http.StatusCreated, h.putReservation(h.key, "res-live", tokenB,
		map[string]any{"space": "prod", "workerName": "live", "ttlSeconds": 86400}).status)
	held := func() string {
		return h.status(`SELECT sum(held)::text FROM organization_usage WHERE organization_id = $1 AND resource = 'reservations'`, h.org.ID)
	}
	require.Equal(t, "2", held())

	h.advance("2 minutes")
	require.Equal(t, "expired", h.getReservation(h.key, "res-lapse").json(t)["status"])
	require.Equal(t, "prepared", h.status("SELECT status FROM worker_endpoint_origin_reservations WHERE id = $1", "res-lapse"))
	require.Equal(t, "2", held())

	h.host.Sweep(context.Background())
	require.Equal(t, "expired", h.status("SELECT status FROM worker_endpoint_origin_reservations WHERE id = $1", "res-lapse"))
	require.Equal(t, "prepared", h.status("SELECT status FROM worker_endpoint_origin_reservations WHERE id = $1", "res-live"))
	require.Equal(t, "1", held())
}
