package server_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// labelsCatalog sells two selfhost worker offerings, one with chosen labels and one without, and
// reserves the operator's own label "admin".
const labelsCatalog = `{
  "installations": [{"name": "local", "pack": "selfhost"}],
  "offerings": [
    {"id": "worker", "kind": "module-worker", "installation": "local", "soldTo": ["*"]},
    {"id": "worker-plain", "kind": "module-worker", "installation": "local", "soldTo": ["*"], "chosenLabels": false},
    {"id": "endpoint", "kind": "worker-endpoint", "installation": "local", "soldTo": ["*"]}
  ],
  "reservedLabels": ["admin"]
}`

// deriveLabel is the derivation route's answer for body (what the provider asks at plan).
func (h *harness) deriveLabel(key string, body map[string]any) reply {
	h.t.Helper()
	return h.do(req{method: http.MethodPost, path: "/v1/worker-endpoint-origin-derivations", key: key, body: body})
}

// TestRuleAChosenLabelMayNotTakeADerivedShape: "Any other chosen label may not take a shape the
// Host derives for someone ... → 422 label_reserved. So a derived address is only ever its own
// worker's" (SPEC 3.3). Another organization cannot take a worker's derived label while the
// worker stands nor after it is destroyed, at plan (the derivation route) or at PUT; the
// worker's owner gets the same address back when it applies again; the owner may always name its
// own derived label; the managed and Host-minted shapes and the operator's labels are refused too.
func TestRuleAChosenLabelMayNotTakeADerivedShape(t *testing.T) {
	t.Parallel()
	h := setup(t, func(o *options) { o.catalogJSON = labelsCatalog })
	w := h.putWorker("prod", "api", workerToken, withOffering(workerBody(), "worker"))
	require.Equal(t, http.StatusCreated, w.status, "body: %s", w.body)
	derived := w.json(t)["scriptName"].(string)
	first := h.putReservation(h.key, "res-api", tokenA, map[string]any{"space": "prod", "workerName": "api", "offeringId": "worker"})
	require.Equal(t, http.StatusCreated, first.status, "body: %s", first.body)
	require.Equal(t, derived, first.json(t)["subdomain"])
	origin := first.json(t)["canonicalOrigin"]

	_, otherKey := h.newOrg("globex")
	steal := map[string]any{"space": "web", "workerName": "front", "subdomain": derived, "offeringId": "worker"}
	takeRefused := func(when string) {
		t.Helper()
		h.deriveLabel(otherKey, steal).problem(t, http.StatusUnprocessableEntity, "label_reserved")
		h.putReservation(otherKey, "res-steal", tokenB, steal).problem(t, http.StatusUnprocessableEntity, "label_reserved")
		require.Zero(t, h.count(`SELECT count(*) FROM worker_endpoint_origin_reservations WHERE id = 'res-steal'`), when)
	}
	takeRefused("while the worker stands")

	// The worker and its reservation are destroyed: its former label stays its own.
	require.Equal(t, http.StatusOK, h.deleteReservation(h.key, "res-api", tokenA).status)
	require.Equal(t, http.StatusOK, h.deleteWorker("prod", "api", workerToken).status)
	takeRefused("after the worker was destroyed")
	again := h.putReservation(h.key, "res-api", "token-reserve-again-0001", map[string]any{"space": "prod", "workerName": "api", "offeringId": "worker"})
	require.Equal(t, http.StatusCreated, again.status, "body: %s", again.body)
	require.Equal(t, origin, again.json(t)["canonicalOrigin"], "destroy and re-apply gets the same address back")

	// The owner may name its own derived label.
	own := h.deriveLabel(h.key, map[string]any{"space": "prod", "workerName": "api", "subdomain": derived, "offeringId": "worker"})
	require.Equal(t, http.StatusOK, own.status, "body: %s", own.body)

	for _, label := range []string{
		"shop-prod-0123456789abcdef0123456789abcdef", // another (possible) worker's v2 script name
		"tsw-0123456789abcdef01234567",               // a managed default label
		"hostmint-anything",
		"admin", // the catalog's reservedLabels
	} {
		body := map[string]any{"space": "web", "workerName": "front", "subdomain": label, "offeringId": "worker"}
		h.deriveLabel(otherKey, body).problem(t, http.StatusUnprocessableEntity, "label_reserved")
	}
	// A label of no derived shape is the organization's to choose.
	ok := h.putReservation(otherKey, "res-shop", tokenB, map[string]any{"space": "web", "workerName": "front", "subdomain": "shop", "offeringId": "worker"})
	require.Equal(t, http.StatusCreated, ok.status, "body: %s", ok.body)

	// A v1 script name is reserved while a live script holds it. (No request creates a v1 name
	// now; the worker's row is given one in SQL, as a worker deployed before v2 keeps its name.)
	v1 := "front-web-0123abcd"
	body := map[string]any{"space": "web", "workerName": "other", "subdomain": v1, "offeringId": "worker"}
	require.Equal(t, http.StatusOK, h.deriveLabel(otherKey, body).status, "no live script holds it")
	again2 := h.putWorker("prod", "api", "token-worker-again-0001", withOffering(workerBody(), "worker"))
	require.Equal(t, http.StatusCreated, again2.status, "body: %s", again2.body)
	h.exec(`UPDATE workers SET script_name = $1 WHERE uid = $2`, v1, again2.json(t)["uid"])
	h.deriveLabel(otherKey, body).problem(t, http.StatusUnprocessableEntity, "label_reserved")
}

// TestRuleAChosenLabelNeedsAnOfferingThatSellsIt: "on an offering without [chosenLabels], a chosen
// label → 422 label_not_sold" (SPEC 3.3), at plan and at PUT; the worker's derived label is still
// its own there.
func TestRuleAChosenLabelNeedsAnOfferingThatSellsIt(t *testing.T) {
	t.Parallel()
	h := setup(t, func(o *options) { o.catalogJSON = labelsCatalog })
	body := map[string]any{"space": "prod", "workerName": "api", "subdomain": "shop", "offeringId": "worker-plain"}
	h.deriveLabel(h.key, body).problem(t, http.StatusUnprocessableEntity, "label_not_sold")
	h.putReservation(h.key, "res-api", tokenA, body).problem(t, http.StatusUnprocessableEntity, "label_not_sold")
	require.Zero(t, h.count(`SELECT count(*) FROM worker_endpoint_origin_reservations`))
	delete(body, "subdomain")
	require.Equal(t, http.StatusCreated, h.putReservation(h.key, "res-api", tokenA, body).status)
}

// TestRuleWorkersDevDerivesEveryLabel: "workers-dev ... answers any label but the worker's own
// derived one with 422 subdomain_not_derivable" (SPEC 3.3, 8), at plan and at PUT.
func TestRuleWorkersDevDerivesEveryLabel(t *testing.T) {
	t.Parallel()
	h, _ := setupCloudflare(t)
	body := map[string]any{"space": "prod", "workerName": "api", "subdomain": "shop", "offeringId": "cf-worker"}
	p := h.deriveLabel(h.key, body).problem(t, http.StatusUnprocessableEntity, "subdomain_not_derivable")
	require.True(t, strings.HasPrefix(p["detail"].(string), "on workers-dev"), "%v", p["detail"])
	h.putReservation(h.key, "res-api", tokenA, body).problem(t, http.StatusUnprocessableEntity, "subdomain_not_derivable")
	delete(body, "subdomain")
	d := h.deriveLabel(h.key, body)
	require.Equal(t, http.StatusOK, d.status, "body: %s", d.body)
	body["subdomain"] = d.json(t)["subdomain"]
	require.Equal(t, http.StatusCreated, h.putReservation(h.key, "res-api", tokenA, body).status, "its own derived label, named")
}

// withOffering is body with its offeringId set.
func withOffering(body map[string]any, offering string) map[string]any {
	body["offeringId"] = offering
	return body
}
