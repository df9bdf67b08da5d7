package server_test

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/testdb"
)

const helloModule = `export default { async fetch() { return new Response("hello") } }`

func workerBody() map[string]any {
	return map[string]any{
		"modules":               map[string]string{"index.js": helloModule},
		"mainModule":            "index.js",
		"compatibilityDate":     "2025-01-01",
		"requiredSensitiveVars": []string{},
	}
}

func (h *harness) putWorker(space, name, token string, body any) reply {
	h.t.Helper()
	return h.do(req{method: http.MethodPut, path: "/v1/spaces/" + space + "/workers/" + name, key: h.key, token: token, body: body})
}

// tryPutWorker is putWorker for another goroutine: a transport error comes back as status 0.
func (h *harness) tryPutWorker(space, name, token string, body any) reply {
	r, err := h.try(req{method: http.MethodPut, path: "/v1/spaces/" + space + "/workers/" + name, key: h.key, token: token, body: body})
	if err != nil {
		return reply{body: []byte(err.Error())}
	}
	return r
}

func (h *harness) deleteWorker(space, name, token string) reply {
	h.t.Helper()
	return h.do(req{method: http.MethodDelete, path: "/v1/spaces/" + space + "/workers/" + name, key: h.key, token: token})
}

func (h *harness) putEndpoint(space, name, token string, body any) reply {
	h.t.Helper()
	return h.do(req{method: http.MethodPut, path: "/v1/spaces/" + space + "/worker-endpoints/" + name, key: h.key, token: token, body: body})
}

func (h *harness) deleteEndpoint(space, name, token string) reply {
	h.t.Helper()
	return h.do(req{method: http.MethodDelete, path: "/v1/spaces/" + space + "/worker-endpoints/" + name, key: h.key, token: token})
}

func (h *harness) putActivation(id, token, endpointUID string) reply {
	h.t.Helper()
	return h.do(req{method: http.MethodPut, path: resPath + id + "/activation", key: h.key, token: token, body: map[string]any{"endpointUid": endpointUID}})
}

func (h *harness) deleteActivation(id, token string) reply {
	h.t.Helper()
	return h.do(req{method: http.MethodDelete, path: resPath + id + "/activation", key: h.key, token: token})
}

func (h *harness) get(path string) reply {
	h.t.Helper()
	return h.do(req{method: http.MethodGet, path: path, key: h.key})
}

const (
	workerToken   = "token-worker-0000000001"
	endpointToken = "token-endpoint-00000001"
	activateToken = "token-activate-00000001"
)

func TestWorkerLifecycleDerivesReadinessFromDeployments(t *testing.T) {
	t.Parallel()
	h := setup(t)
	created := h.putWorker("prod", "api", workerToken, workerBody())
	require.Equal(t, http.StatusCreated, created.status, "body: %s", created.body)
	w := created.json(t)
	require.Equal(t, true, w["ready"])
	require.EqualValues(t, 1, w["generation"])
	require.Regexp(t, `^api-prod-[0-9a-f]{32}$`, w["scriptName"])
	require.NotEmpty(t, created.header.Get("Takoform-Operation-Id"))

	// Readiness is derived from the deployment rows, not a stored flag.
	_, err := h.db.Exec(context.Background(), "UPDATE deployments SET status = 'failed'")
	require.NoError(t, err)
	require.Equal(t, false, h.get("/v1/spaces/prod/workers/api").json(t)["ready"])
	_, err = h.db.Exec(context.Background(), "UPDATE deployments SET status = 'active'")
	require.NoError(t, err)

	// A changed spec is a new generation.
	body := workerBody()
	body["modules"] = map[string]string{"index.js": helloModule + "\n// v2"}
	updated := h.putWorker("prod", "api", workerToken, body)
	require.Equal(t, http.StatusOK, updated.status, "body: %s", updated.body)
	require.EqualValues(t, 2, updated.json(t)["generation"])
	require.Equal(t, true, updated.json(t)["ready"])

	op := h.get("/v1/operations/" + updated.header.Get("Takoform-Operation-Id")).json(t)
	require.Equal(t, "committed", op["status"])
	effects := op["effects"].([]any)
	require.Len(t, effects, 1)
	require.Equal(t, "succeeded", effects[0].(map[string]any)["status"])

	deleted := h.deleteWorker("prod", "api", workerToken)
	require.Equal(t, http.StatusOK, deleted.status, "body: %s", deleted.body)
	att := h.get("/v1/deletion-attestations/" + w["uid"].(string)).json(t)
	require.Equal(t, "closed", att["status"])
	h.get("/v1/spaces/prod/workers/api").problem(t, http.StatusNotFound, "not_found")
}

func TestHostMintedEndpointPublishesAndLetsGoInPlace(t *testing.T) {
	t.Parallel()
	h := setup(t)
	require.Equal(t, http.StatusCreated, h.putWorker("prod", "api", workerToken, workerBody()).status)
	ep := h.putEndpoint("prod", "api", endpointToken, map[string]any{"worker": "api"})
	require.Equal(t, http.StatusCreated, ep.status, "body: %s", ep.body)
	e := ep.json(t)
	require.Equal(t, true, e["hostMinted"])
	require.Equal(t, true, e["ready"])
	require.Regexp(t, `^hostmint-[0-9a-f]{40}$`, e["originReservationId"])
	require.Regexp(t, `^http://api-prod-[0-9a-f]{32}\.workers\.localhost:`+h.edgePort()+`/$`, e["url"])

	minted := h.getReservation(h.key, e["originReservationId"].(string)).json(t)
	require.Equal(t, "activated", minted["status"])
	require.Equal(t, true, minted["hostMinted"])
	require.Equal(t, e["uid"], minted["endpoint"].(map[string]any)["uid"])

	// endpoint delete: deactivate -> delete -> close attestation; the row stays bound as witness.
	require.Equal(t, http.StatusOK, h.deleteEndpoint("prod", "api", endpointToken).status)
	minted = h.getReservation(h.key, e["originReservationId"].(string)).json(t)
	require.Equal(t, "bound", minted["status"])
	require.Equal(t, e["uid"], minted["endpoint"].(map[string]any)["uid"])

	// Declared again on the same worker: the witness is provably gone and is cleared in place.
	again := h.putEndpoint("prod", "api", "token-endpoint-00000002", map[string]any{"worker": "api"})
	require.Equal(t, http.StatusCreated, again.status, "body: %s", again.body)
	require.Equal(t, e["url"], again.json(t)["url"])
	require.Equal(t, e["originReservationId"], again.json(t)["originReservationId"])

	// Out of order: the worker cannot go while its endpoint stands.
	h.deleteWorker("prod", "api", workerToken).problem(t, http.StatusConflict, "worker_has_endpoints")
	require.Equal(t, http.StatusOK, h.deleteEndpoint("prod", "api", "token-endpoint-00000002").status)
	require.Equal(t, http.StatusOK, h.deleteWorker("prod", "api", workerToken).status)
}

// TestAWorkerReadsByItsUIDWithinItsOrganizationOnly: GET /v1/workers/{uid} answers the present
// worker as its read by name does, without an ownership token; another organization's key, a
// malformed UID and a deleted worker find nothing.
func TestAWorkerReadsByItsUIDWithinItsOrganizationOnly(t *testing.T) {
	t.Parallel()
	h := setup(t)
	w := h.putWorker("prod", "api", workerToken, workerBody())
	require.Equal(t, http.StatusCreated, w.status, "body: %s", w.body)
	uid := w.json(t)["uid"].(string)
	got := h.get("/v1/workers/" + uid).json(t)
	require.Equal(t, uid, got["uid"])
	require.Equal(t, "prod", got["space"])
	require.Equal(t, "api", got["name"])
	require.Nil(t, got["ownershipToken"], "the UID names the worker, not its owner's key")
	_, otherKey := h.newOrg("globex")
	h.do(req{method: http.MethodGet, path: "/v1/workers/" + uid, key: otherKey}).problem(t, http.StatusNotFound, "not_found")
	h.do(req{method: http.MethodGet, path: "/v1/workers/not-a-uid", key: h.key}).problem(t, http.StatusNotFound, "not_found")
	require.Equal(t, http.StatusOK, h.deleteWorker("prod", "api", workerToken).status)
	h.do(req{method: http.MethodGet, path: "/v1/workers/" + uid, key: h.key}).problem(t, http.StatusNotFound, "not_found")
}

func TestSuppliedReservationSafeDestroyOrder(t *testing.T) {
	t.Parallel()
	h := setup(t)
	res := h.putReservation(h.key, "res-api", tokenA, apiBody("prod", "api"))
	require.Equal(t, http.StatusCreated, res.status)
	require.Equal(t, http.StatusCreated, h.putWorker("prod", "api", workerToken, workerBody()).status)
	ep := h.putEndpoint("prod", "api", endpointToken, map[string]any{"worker": "api", "originReservationId": "res-api"})
	require.Equal(t, http.StatusCreated, ep.status, "body: %s", ep.body)
	e := ep.json(t)
	require.Equal(t, false, e["hostMinted"])
	require.Equal(t, res.json(t)["canonicalOrigin"].(string)+"/", e["url"])
	require.Equal(t, "bound", h.getReservation(h.key, "res-api").json(t)["status"])

	activationPath := resPath + "res-api/activation"
	h.do(req{method: http.MethodGet, path: activationPath, key: h.key}).problem(t, http.StatusNotFound, "not_found")
	act := h.putActivation("res-api", activateToken, e["uid"].(string))
	require.Equal(t, http.StatusCreated, act.status, "body: %s", act.body)
	require.Equal(t, "activated", act.json(t)["status"])
	// Describe returns the token (seed 000): the activation's own, not the reservation's.
	got := h.get(activationPath).json(t)
	require.Equal(t, activateToken, got["ownershipToken"])
	require.Equal(t, e["uid"], got["endpoint"].(map[string]any)["uid"])
	_, otherKey := h.newOrg("globex")
	h.do(req{method: http.MethodGet, path: activationPath, key: otherKey}).problem(t, http.StatusNotFound, "not_found")

	// Out of order deletes are refused with typed 409s.
	p := h.deleteReservation(h.key, "res-api", tokenA).problem(t, http.StatusConflict, "release_fenced")
	require.Contains(t, p["unmetFences"], "activation")
	require.Contains(t, p["unmetFences"], "endpoint_present")
	h.deleteEndpoint("prod", "api", endpointToken).problem(t, http.StatusConflict, "endpoint_activated")

	// The safe order succeeds.
	require.Equal(t, http.StatusOK, h.deleteActivation("res-api", activateToken).status)
	require.Equal(t, "bound", h.getReservation(h.key, "res-api").json(t)["status"])
	h.do(req{method: http.MethodGet, path: activationPath, key: h.key}).problem(t, http.StatusNotFound, "not_found")
	require.Equal(t, http.StatusOK, h.deleteEndpoint("prod", "api", endpointToken).status)
	released := h.deleteReservation(h.key, "res-api", tokenA)
	require.Equal(t, http.StatusOK, released.status, "body: %s", released.body)
	require.Equal(t, "released", released.json(t)["status"])
	require.Equal(t, http.StatusOK, h.deleteWorker("prod", "api", workerToken).status)
}

// A GET of an owned object (reservation, runtime input, worker, endpoint) reads the object and
// its owning token in one database round trip, besides the key's: a refresh of a large
// configuration pays it once per resource.
func TestAGetReadsItsObjectAndOwningTokenInOneRoundTrip(t *testing.T) {
	t.Parallel()
	trips := &testdb.RoundTrips{}
	h := setup(t, func(o *options) { o.roundTrips = trips })
	p := h.reservedAndPrepared()
	require.Equal(t, http.StatusCreated, h.putWorker("prod", "api", workerToken, secretWorkerBody(p.reference)).status)
	ep := h.putEndpoint("prod", "api", endpointToken, map[string]any{"worker": "api", "originReservationId": "res-api"})
	require.Equal(t, http.StatusCreated, ep.status, "body: %s", ep.body)

	for path, token := range map[string]string{
		"/v1/worker-endpoint-origin-reservations/res-api":    tokenA,
		prepPath(h.org.ID, "op-1"):                           "token-prepare-00000001",
		"/v1/worker-runtime-input-references/" + p.reference: "token-prepare-00000001",
		"/v1/spaces/prod/workers/api":                        workerToken,
		"/v1/spaces/prod/worker-endpoints/api":               endpointToken,
	} {
		trips.Take()
		got := h.get(path)
		require.Equal(t, http.StatusOK, got.status, "%s: %s", path, got.body)
		require.Equal(t, token, got.json(t)["ownershipToken"], path)
		require.EqualValues(t, 2, trips.Take(), "%s: the key's round trip and the read's", path)
	}
	trips.Take()
	h.get("/v1/spaces/prod/workers/absent").problem(t, http.StatusNotFound, "not_found")
	require.EqualValues(t, 2, trips.Take())
}

func TestWorkerAndEndpointBadInputChangesNothing(t *testing.T) {
	t.Parallel()
	h := setup(t)
	with := func(k string, v any) map[string]any {
		b := workerBody()
		b[k] = v
		return b
	}
	cases := []struct {
		name   string
		path   string
		body   any
		status int
		code   string
	}{
		{"unknown field", "/v1/spaces/prod/workers/api", with("image", "x"), 400, "bad_request"},
		{"invalid space", "/v1/spaces/Prod/workers/api", workerBody(), 422, "invalid_request"},
		{"invalid name", "/v1/spaces/prod/workers/_api", workerBody(), 422, "invalid_request"},
		{"no modules", "/v1/spaces/prod/workers/api", with("modules", map[string]string{}), 422, "invalid_request"},
		{"main module missing", "/v1/spaces/prod/workers/api", with("mainModule", "other.js"), 422, "invalid_request"},
		{"module escapes", "/v1/spaces/prod/workers/api", with("modules", map[string]string{"../x.js": "", "index.js": ""}), 422, "invalid_request"},
		{"bad date", "/v1/spaces/prod/workers/api", with("compatibilityDate", "yesterday"), 422, "invalid_request"},
		{"bad binding name", "/v1/spaces/prod/workers/api", with("requiredSensitiveVars", []string{"1X"}), 422, "invalid_request"},
		{"sensitive vars without reference", "/v1/spaces/prod/workers/api", with("requiredSensitiveVars", []string{"API_KEY"}), 422, "invalid_request"},
		{"body too large", "/v1/spaces/prod/workers/api", with("modules", map[string]string{"index.js": strings.Repeat("x", 11<<20)}), 413, "body_too_large"},
		{"endpoint unknown field", "/v1/spaces/prod/worker-endpoints/api", map[string]any{"worker": "api", "url": "x"}, 400, "bad_request"},
		{"endpoint invalid worker", "/v1/spaces/prod/worker-endpoints/api", map[string]any{"worker": "API"}, 422, "invalid_request"},
		{"endpoint hostmint reservation", "/v1/spaces/prod/worker-endpoints/api", map[string]any{"worker": "api", "originReservationId": "hostmint-189331124caba810f34f3df5b2c5894b52b1bb96"}, 403, "hostmint_namespace"},
		{"endpoint without worker", "/v1/spaces/prod/worker-endpoints/api", map[string]any{"worker": "ghost"}, 404, "not_found"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h.do(req{method: http.MethodPut, path: c.path, key: h.key, token: workerToken, body: c.body}).problem(t, c.status, c.code)
		})
	}
	var workers, endpoints, bindings, effects int
	require.NoError(t, h.db.QueryRow(context.Background(), `SELECT (SELECT count(*) FROM workers), (SELECT count(*) FROM worker_endpoints),
		(SELECT count(*) FROM ownership_bindings), (SELECT count(*) FROM backend_effects)`).Scan(&workers, &endpoints, &bindings, &effects))
	require.Zero(t, workers+endpoints+bindings+effects)
}

func TestEndpointNeedsAReadyWorkerAndNeverChangesInPlace(t *testing.T) {
	t.Parallel()
	h := setup(t)
	h.putEndpoint("prod", "api", endpointToken, map[string]any{"worker": "api"}).problem(t, http.StatusNotFound, "not_found")
	h.mustWorker("prod", "api", workerToken)
	h.mustWorker("prod", "web", "token-worker-web-000001")
	e := h.mustEndpoint("prod", "api", endpointToken, map[string]any{"worker": "api"})
	h.putEndpoint("prod", "api", endpointToken, map[string]any{"worker": "web"}).problem(t, http.StatusConflict, "immutable")
	got := h.get("/v1/spaces/prod/worker-endpoints/api").json(t)
	require.Equal(t, e["uid"], got["uid"])
	require.Equal(t, endpointToken, got["ownershipToken"])
	require.Equal(t, "api", got["worker"].(map[string]any)["name"])
}

// A compatibility date that has not come yet is refused before anything is written: no runtime
// knows its behaviour.
func TestWorkerWithAFutureCompatibilityDateIsRefused(t *testing.T) {
	t.Parallel()
	h := setup(t)
	b := workerBody()
	b["compatibilityDate"] = "2999-01-01"
	p := h.putWorker("prod", "future", workerToken, b).problem(t, http.StatusUnprocessableEntity, "invalid_request")
	require.Contains(t, p["detail"], "in the future")
	require.Zero(t, h.count(`SELECT count(*) FROM workers`))
}

// A worker's module file paths (issue 32 item 4) are kept as given and shown on reads; a change of
// paths alone moves the revision and deploys nothing; paths that do not match the modules are
// refused and change nothing.
func TestModuleFilePathsAreKeptAndMoveTheRevisionAlone(t *testing.T) {
	t.Parallel()
	h := setup(t)
	body := workerBody()
	body["moduleFiles"] = map[string]string{"index.js": "./src/index.js"}
	created := h.putWorker("prod", "files", workerToken, body)
	require.Equal(t, http.StatusCreated, created.status, "body: %s", created.body)
	w := created.json(t)
	require.Equal(t, map[string]any{"index.js": "./src/index.js"}, w["moduleFiles"])

	body["moduleFiles"] = map[string]string{"index.js": "./moved/index.js"}
	moved := h.putWorker("prod", "files", workerToken, body)
	require.Equal(t, http.StatusOK, moved.status, "body: %s", moved.body)
	m := moved.json(t)
	require.Equal(t, map[string]any{"index.js": "./moved/index.js"}, m["moduleFiles"])
	require.Equal(t, w["generation"], m["generation"], "the same code: no new generation")
	require.Greater(t, m["revision"].(float64), w["revision"].(float64), "the revision moves")
	op := h.get("/v1/operations/" + moved.header.Get("Takoform-Operation-Id")).json(t)
	require.Empty(t, op["effects"], "nothing deployed")

	for name, files := range map[string]map[string]string{
		"another module":   {"index.js": "./a.js", "other.js": "./b.js"},
		"a module missing": {"other.js": "./b.js"},
		"empty path":       {"index.js": ""},
		"control":          {"index.js": "./a\n.js"},
		"long":             {"index.js": strings.Repeat("a", 1025)},
	} {
		bad := workerBody()
		bad["moduleFiles"] = files
		h.putWorker("prod", "files", workerToken, bad).problem(t, http.StatusUnprocessableEntity, "invalid_request")
		require.Equal(t, m["moduleFiles"], h.get("/v1/spaces/prod/workers/files").json(t)["moduleFiles"], name)
	}

	// Without paths (inline modules) they are cleared; the read shows none.
	delete(body, "moduleFiles")
	inline := h.putWorker("prod", "files", workerToken, body)
	require.Equal(t, http.StatusOK, inline.status, "body: %s", inline.body)
	require.Equal(t, map[string]any{}, inline.json(t)["moduleFiles"])
}
