package server_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cloudflare/cloudflare-go/v6/kv"
	"github.com/cloudflare/cloudflare-go/v6/shared"
	"github.com/cloudflare/cloudflare-go/v6/workers"
	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/backend/cloudflare"
	"github.com/takoform/terraform-provider-takoform/internal/cloudflare/cfstandin"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/workerd/workerdtest"
	"github.com/takoform/terraform-provider-takoform/internal/safedir"
	"github.com/takoform/terraform-provider-takoform/internal/vocab"
)

const (
	cfBaseDomain = "apps.example.com"
	cfNamespace  = "tenants"
	// cfSaaSZone is the operator's Cloudflare for SaaS zone, and cfSaaSTarget where users point
	// their custom domains (SPEC 3.7).
	cfSaaSZone   = "0123456789abcdef0123456789abcdef"
	cfSaaSTarget = "customers.apps.example.com"
	cfRoutingKV  = "0f2ac74b498b48028cb68387c421e279"
	// cfPropagation is the test installations' routePropagationSeconds, and the stand-in's KV
	// staleness: the edge keeps routing a deleted entry for as long as the Host waits.
	cfPropagation = 2 * time.Second
)

// setupCloudflare starts a Host whose catalog sells a workers-dev offering (cf-worker,
// cf-endpoint) and a wfp-managed one (wfp-worker, wfp-endpoint) on one Cloudflare stand-in, both
// with a 2 s route propagation window, and the stand-in's KV edge view stale for as long.
func setupCloudflare(t *testing.T, opts ...func(*cfstandin.Config)) (*harness, *cfstandin.Server) {
	t.Helper()
	return setupCloudflareHost(t, nil, opts...)
}

// setupCloudflareHost is setupCloudflare whose Host's options host adjusts too (nil: none).
func setupCloudflareHost(t *testing.T, host func(*options), opts ...func(*cfstandin.Config)) (*harness, *cfstandin.Server) {
	t.Helper()
	cfg := cfstandin.Config{Token: cfToken, AccountID: cfAccount, AccountSubdomain: cfSubdomain, Workerd: workerdtest.Binary(t),
		DispatchNamespaces: []string{cfNamespace}, KVNamespaces: []string{cfRoutingKV}, BaseDomain: cfBaseDomain,
		RoutingKVNamespace: cfRoutingKV, RoutingDispatchNamespace: cfNamespace, KVStale: cfPropagation, SaaSZoneID: cfSaaSZone}
	for _, o := range opts {
		o(&cfg)
	}
	s, err := cfstandin.New(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	private := filepath.Join(t.TempDir(), "cf")
	require.NoError(t, safedir.Ensure(private, safedir.Current()))
	require.NoError(t, safedir.WriteFile(private, "api-token", []byte(cfToken+"\n"), safedir.Current()))
	tokenFile := filepath.Join(private, "api-token")
	seconds := int(cfPropagation / time.Second)
	cat, err := json.Marshal(map[string]any{
		"installations": []any{
			map[string]any{"name": "local", "pack": "selfhost"},
			map[string]any{"name": "cf", "pack": "workers-dev", "accountSubdomain": cfSubdomain, "accountId": cfAccount,
				"apiTokenFile": tokenFile, "apiBaseUrl": s.BaseURL(), "routePropagationSeconds": seconds},
			map[string]any{"name": "wfp", "pack": "wfp-managed", "baseDomain": cfBaseDomain, "dispatchNamespace": cfNamespace,
				"dispatchWorkerName": "takoform-dispatch", "routingKvNamespaceId": cfRoutingKV, "accountId": cfAccount,
				"apiTokenFile": tokenFile, "apiBaseUrl": s.BaseURL(), "routePropagationSeconds": seconds,
				"saasZoneId": cfSaaSZone, "saasCnameTarget": cfSaaSTarget},
		},
		"offerings": []any{
			map[string]any{"id": "local-worker", "kind": "module-worker", "installation": "local", "soldTo": []string{"*"}},
			map[string]any{"id": "cf-worker", "kind": "module-worker", "installation": "cf", "soldTo": []string{"*"}},
			map[string]any{"id": "cf-endpoint", "kind": "worker-endpoint", "installation": "cf", "soldTo": []string{"*"}},
			map[string]any{"id": "wfp-worker", "kind": "module-worker", "installation": "wfp", "soldTo": []string{"*"}, "customDomains": map[string]any{}},
			map[string]any{"id": "wfp-endpoint", "kind": "worker-endpoint", "installation": "wfp", "soldTo": []string{"*"}},
		},
	})
	require.NoError(t, err)
	h := setup(t, func(o *options) {
		o.catalogJSON = string(cat)
		o.cloudflareEdge = s.EdgeClient()
		if host != nil {
			host(o)
		}
	})
	return h, s
}

func wfpWorkerBody(marker string) map[string]any {
	b := workerBody()
	b["modules"] = map[string]string{"index.js": `export default { fetch() { return new Response("` + marker + `") } }`}
	b["offeringId"] = "wfp-worker"
	return b
}

// edgeGet fetches url through the stand-in's edge.
func edgeGet(t *testing.T, s *cfstandin.Server, url string) (int, string) {
	t.Helper()
	res, err := s.EdgeClient().Get(url)
	require.NoError(t, err)
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	require.NoError(t, err)
	return res.StatusCode, string(body)
}

// apiCalls counts the stand-in's API requests of method whose path contains part.
func apiCalls(s *cfstandin.Server, method, part string) int {
	n := 0
	for _, r := range s.Requests() {
		if r.Method == method && strings.Contains(r.Path, part) {
			n++
		}
	}
	return n
}

// attestationView is GET /v1/deletion-attestations/{uid}'s status.
func (h *harness) attestationView(uid string) string {
	h.t.Helper()
	r := h.get("/v1/deletion-attestations/" + uid)
	require.Equal(h.t, http.StatusOK, r.status, "body: %s", r.body)
	return r.json(h.t)["status"].(string)
}

func TestAWorkersDevEndpointEnablesTheScriptsRouteAndItsDeletionClosesOnlyAfterPropagation(t *testing.T) {
	t.Parallel()
	h, s := setupCloudflare(t)
	r := h.putWorker("prod", "api", tokenA, cfWorkerBody(`export default { fetch() { return new Response("cf-routed") } }`))
	require.Equal(t, http.StatusCreated, r.status, "body: %s", r.body)
	script := r.json(t)["scriptName"].(string)

	e := h.mustEndpoint("prod", "api", tokenB, map[string]any{"worker": "api", "offeringId": "cf-endpoint"})
	require.Equal(t, true, e["ready"], "the route read back enabled: %v", e)
	url := e["url"].(string)
	require.Equal(t, "https://"+script+"."+cfSubdomain+".workers.dev/", url)
	sc, _ := s.Script(script)
	require.Equal(t, cfstandin.Subdomain{Enabled: true, PreviewsEnabled: false}, sc.Subdomain)
	status, body := edgeGet(t, s, url)
	require.Equal(t, http.StatusOK, status)
	require.Equal(t, "cf-routed", body)
	// The account's workers.dev subdomain is checked before the route is enabled.
	var order []string
	for _, q := range s.Requests() {
		if strings.HasSuffix(q.Path, "/workers/subdomain") || strings.HasSuffix(q.Path, script+"/subdomain") && q.Method == http.MethodPost {
			order = append(order, q.Method+" "+q.Path[strings.LastIndex(q.Path, "/workers/"):])
		}
	}
	require.Equal(t, []string{"GET /workers/subdomain", "GET /workers/subdomain", "POST /workers/scripts/" + script + "/subdomain"}, order,
		"once when the pack starts, once before the endpoint create")

	uid := e["uid"].(string)
	require.Equal(t, http.StatusOK, h.deleteEndpoint("prod", "api", tokenB).status)
	sc, _ = s.Script(script)
	require.Equal(t, cfstandin.Subdomain{}, sc.Subdomain, "both flags read back false")
	status, _ = edgeGet(t, s, url)
	require.Equal(t, http.StatusNotFound, status)
	// The readback cannot prove the edge stopped routing: the attestation stays open and the
	// route's deployment live for the propagation window, then both clear with no further call.
	require.Equal(t, "open", h.attestationView(uid))
	require.Equal(t, 1, h.count(`SELECT count(*) FROM deployments WHERE resource_uid = $1 AND status = 'deleted' AND routed_until > now()`, uid))
	pollUntil(t, 10*time.Second, func() bool { return h.attestationView(uid) == "closed" }, "the attestation closes")
	h.host.Sweep(context.Background())
	require.Equal(t, "closed", h.attestation(uid), "the janitor writes the status down")

	// The worker goes too: nothing is left on the account.
	require.Equal(t, http.StatusOK, h.deleteWorker("prod", "api", tokenA).status)
	require.Empty(t, s.ScriptNames(""))
}

func TestAWorkersDevEndpointCreateOnAnAccountWhoseSubdomainMovedIsPlacementDrift(t *testing.T) {
	t.Parallel()
	h, s := setupCloudflare(t)
	r := h.putWorker("prod", "api", tokenA, cfWorkerBody(`export default { fetch() { return new Response("x") } }`))
	require.Equal(t, http.StatusCreated, r.status, "body: %s", r.body)
	script := r.json(t)["scriptName"].(string)
	s.SetAccountSubdomain("elsewhere")
	h.putEndpoint("prod", "api", tokenB, map[string]any{"worker": "api", "offeringId": "cf-endpoint"}).problem(t, http.StatusConflict, "placement_drift")
	sc, _ := s.Script(script)
	require.False(t, sc.Subdomain.Enabled, "no route was enabled")
	require.Zero(t, apiCalls(s, http.MethodPost, "/subdomain"))
}

func TestALostAnswerOnRouteEnablementOrDeletionIsResolvedByReadbackWithNoDuplicate(t *testing.T) {
	t.Parallel()
	h, s := setupCloudflare(t)
	r := h.putWorker("prod", "api", tokenA, cfWorkerBody(`export default { fetch() { return new Response("lost") } }`))
	require.Equal(t, http.StatusCreated, r.status, "body: %s", r.body)
	script := r.json(t)["scriptName"].(string)

	require.NoError(t, s.Inject(cfstandin.Fault{Kind: cfstandin.FaultLostAnswer, Method: http.MethodPost, PathContains: "/subdomain"}))
	e := h.mustEndpoint("prod", "api", tokenB, map[string]any{"worker": "api", "offeringId": "cf-endpoint"})
	require.Equal(t, true, e["ready"], "the readback found the route the lost answer enabled: %v", e)
	require.Equal(t, 1, apiCalls(s, http.MethodPost, "/subdomain"), "the route was enabled once, never posted again")
	status, _ := edgeGet(t, s, e["url"].(string))
	require.Equal(t, http.StatusOK, status)

	require.NoError(t, s.Inject(cfstandin.Fault{Kind: cfstandin.FaultLostAnswer, Method: http.MethodDelete, PathContains: "/subdomain"}))
	require.Equal(t, http.StatusOK, h.deleteEndpoint("prod", "api", tokenB).status)
	require.Equal(t, 1, apiCalls(s, http.MethodDelete, "/subdomain"))
	sc, _ := s.Script(script)
	require.False(t, sc.Subdomain.Enabled)
	require.Zero(t, h.count(`SELECT count(*) FROM deployments WHERE resource_uid = $1 AND status <> 'deleted'`, e["uid"]), "no orphan route")
}

func TestAWFPEndpointWritesTheRoutingEntryAndIsReadyOnceTheDispatchWorkerAnswers(t *testing.T) {
	t.Parallel()
	h, s := setupCloudflare(t)
	r := h.putWorker("prod", "shop", tokenA, wfpWorkerBody("wfp-shop"))
	require.Equal(t, http.StatusCreated, r.status, "body: %s", r.body)
	script := r.json(t)["scriptName"].(string)

	e := h.mustEndpoint("prod", "shop", tokenB, map[string]any{"worker": "shop", "offeringId": "wfp-endpoint"})
	host := e["hostname"].(string)
	require.True(t, strings.HasPrefix(host, "tsw-") && strings.HasSuffix(host, "."+cfBaseDomain), host)
	raw, ok := s.KVValue(cfRoutingKV, host)
	require.True(t, ok)
	var entry struct {
		ScriptName, EndpointUID, DeploymentID string
	}
	require.NoError(t, json.Unmarshal(raw, &entry))
	require.Equal(t, script, entry.ScriptName)
	require.Equal(t, e["uid"], entry.EndpointUID)
	require.NotEmpty(t, entry.DeploymentID)
	require.Equal(t, true, e["ready"], "the dispatch worker answered the probe within the wait: %v", e)
	status, body := edgeGet(t, s, e["url"].(string))
	require.Equal(t, http.StatusOK, status)
	require.Equal(t, "wfp-shop", body)
}

func TestAWFPEndpointIsNotReadyWhileTheDispatchWorkerDoesNotSeeItsEntry(t *testing.T) {
	t.Parallel()
	const stale = 8 * time.Second // the edge sees the new entry long after the Host's wait
	h, s := setupCloudflare(t, func(c *cfstandin.Config) { c.KVStale = stale })
	r := h.putWorker("prod", "shop", tokenA, wfpWorkerBody("wfp-late"))
	require.Equal(t, http.StatusCreated, r.status, "body: %s", r.body)
	written := time.Now()
	e := h.mustEndpoint("prod", "shop", tokenB, map[string]any{"worker": "shop", "offeringId": "wfp-endpoint"})
	require.Less(t, time.Since(written), stale, "the create did not wait for the edge")
	// The create waited for the probe without reading the entry again on each try: one read
	// before its write, one after (and none of the wait's), and the Host's own readbacks.
	reads := apiCalls(s, http.MethodGet, "/values/"+e["hostname"].(string))
	t.Logf("KV reads of the entry during the create: %d", reads)
	require.LessOrEqual(t, reads, 4, "KV reads of the entry during one create")
	_, ok := s.KVValue(cfRoutingKV, e["hostname"].(string))
	require.True(t, ok, "the entry is written")
	require.Equal(t, false, e["ready"], "no Ready from the KV write alone: %v", e)
	cond := e["conditions"].([]any)[0].(map[string]any)
	require.Equal(t, "RoutePropagating", cond["reason"])
	status, _ := edgeGet(t, s, e["url"].(string))
	require.Equal(t, http.StatusNotFound, status, "the edge does not route it yet")

	time.Sleep(time.Until(written.Add(stale)))
	pollUntil(t, 10*time.Second, func() bool {
		return h.get("/v1/spaces/prod/worker-endpoints/shop").json(t)["ready"] == true
	}, "Ready once the dispatch worker answers the probe")
}

func TestAnotherOrganizationCannotTakeAWFPOriginUntilTheRoutePropagationWindowEnds(t *testing.T) {
	t.Parallel()
	h, s := setupCloudflare(t)
	r := h.putWorker("prod", "shop", tokenA, wfpWorkerBody("org-a-shop"))
	require.Equal(t, http.StatusCreated, r.status, "body: %s", r.body)
	const resTok, endTok, actTok = "token-res-a-000000001", "token-end-a-000000001", "token-act-a-000000001"
	resBody := map[string]any{"space": "prod", "workerName": "shop", "subdomain": "shop", "offeringId": "wfp-worker"}
	rr := h.putReservation(h.key, "res-shop", resTok, resBody)
	require.Equal(t, http.StatusCreated, rr.status, "body: %s", rr.body)
	e := h.mustEndpoint("prod", "shop", endTok, map[string]any{"worker": "shop", "offeringId": "wfp-endpoint", "originReservationId": "res-shop"})
	url := "https://shop." + cfBaseDomain + "/"
	require.Equal(t, url, e["url"])
	require.Eventually(t, func() bool { _, b := edgeGet(t, s, url); return b == "org-a-shop" }, 10*time.Second, 100*time.Millisecond)
	require.Equal(t, http.StatusCreated, h.putActivation("res-shop", actTok, e["uid"].(string)).status)

	// The safe destroy order, up to the release.
	require.Equal(t, http.StatusOK, h.deleteActivation("res-shop", actTok).status)
	require.Equal(t, http.StatusOK, h.deleteEndpoint("prod", "shop", endTok).status)
	deleted := time.Now()
	_, gone := s.KVValue(cfRoutingKV, "shop."+cfBaseDomain)
	require.False(t, gone, "the routing entry reads back deleted")

	_, keyB := h.newOrg("bravo")
	type probe struct {
		edge    string
		release reply
		taken   reply
	}
	look := func() probe {
		_, body := edgeGet(t, s, url)
		return probe{edge: body, release: h.deleteReservation(h.key, "res-shop", resTok),
			taken: h.putReservation(keyB, "res-b", "token-res-b-000000001", map[string]any{"space": "web", "workerName": "front", "subdomain": "shop", "offeringId": "wfp-worker"})}
	}
	// Within the window the edge still routes the old entry (stale KV): the origin stays held.
	p := look()
	require.Less(t, time.Since(deleted), cfPropagation, "the window is still open while we look")
	require.Equal(t, "org-a-shop", p.edge, "the stand-in's edge still serves the deleted entry")
	fenced := p.release.problem(t, http.StatusConflict, "release_fenced")
	require.ElementsMatch(t, []any{"attestation_open", "deployment_live"}, fenced["unmetFences"])
	p.taken.problem(t, http.StatusConflict, "origin_taken")
	require.Equal(t, "open", h.attestationView(e["uid"].(string)))

	// Once it has passed, the release goes through and the other organization takes the origin.
	time.Sleep(time.Until(deleted.Add(cfPropagation + 200*time.Millisecond)))
	p = look()
	require.NotEqual(t, "org-a-shop", p.edge, "the edge no longer routes it")
	require.Equal(t, http.StatusOK, p.release.status, "body: %s", p.release.body)
	require.Equal(t, http.StatusCreated, p.taken.status, "body: %s", p.taken.body)
	require.Equal(t, "closed", h.attestationView(e["uid"].(string)))
}

func TestALostAnswerOnARoutingKVPutOrDeleteLeavesNoOrphanAndNoDuplicate(t *testing.T) {
	t.Parallel()
	h, s := setupCloudflare(t)
	r := h.putWorker("prod", "shop", tokenA, wfpWorkerBody("kv-lost"))
	require.Equal(t, http.StatusCreated, r.status, "body: %s", r.body)

	// The worker's own script entry (its limit) is one key already.
	require.Equal(t, 1, s.KVKeys(cfRoutingKV))
	puts := apiCalls(s, http.MethodPut, "/storage/kv/")

	require.NoError(t, s.Inject(cfstandin.Fault{Kind: cfstandin.FaultLostAnswer, Method: http.MethodPut, PathContains: "/storage/kv/"}))
	e := h.mustEndpoint("prod", "shop", tokenB, map[string]any{"worker": "shop", "offeringId": "wfp-endpoint"})
	host := e["hostname"].(string)
	require.Equal(t, puts+1, apiCalls(s, http.MethodPut, "/storage/kv/"), "the entry was written once; the readback found it")
	require.Equal(t, 2, s.KVKeys(cfRoutingKV))

	require.NoError(t, s.Inject(cfstandin.Fault{Kind: cfstandin.FaultLostAnswer, Method: http.MethodDelete, PathContains: "/storage/kv/"}))
	require.Equal(t, http.StatusOK, h.deleteEndpoint("prod", "shop", tokenB).status)
	require.Equal(t, 1, apiCalls(s, http.MethodDelete, "/storage/kv/"))
	_, ok := s.KVValue(cfRoutingKV, host)
	require.False(t, ok, "no orphan entry")
	require.Equal(t, 1, s.KVKeys(cfRoutingKV), "only the worker's script entry is left")
}

// A late delete of an endpoint never removes a routing entry that names another endpoint.
func TestAWFPRouteDeleteLeavesAnEntryOfAnotherEndpoint(t *testing.T) {
	t.Parallel()
	h, s := setupCloudflare(t)
	r := h.putWorker("prod", "shop", tokenA, wfpWorkerBody("kv-cas"))
	require.Equal(t, http.StatusCreated, r.status, "body: %s", r.body)
	e := h.mustEndpoint("prod", "shop", tokenB, map[string]any{"worker": "shop", "offeringId": "wfp-endpoint"})
	host := e["hostname"].(string)
	// Another endpoint's entry now stands there (a successor written out of band).
	successor, err := json.Marshal(map[string]string{"scriptName": "other", "endpointUid": uuid.NewString()})
	require.NoError(t, err)
	sdk, err := cloudflare.New(cloudflare.Options{BaseURL: s.BaseURL(), Token: vocab.NewSecret(cfToken)})
	require.NoError(t, err)
	put := kvUpdate(string(successor))
	_, err = sdk.KVValues.Update(context.Background(), cfRoutingKV, host, put)
	require.NoError(t, err)

	require.Equal(t, http.StatusOK, h.deleteEndpoint("prod", "shop", tokenB).status)
	raw, ok := s.KVValue(cfRoutingKV, host)
	require.True(t, ok, "the successor's entry stays")
	require.JSONEq(t, string(successor), string(raw))
}

func kvUpdate(value string) kv.NamespaceValueUpdateParams {
	var p kv.NamespaceValueUpdateParams
	p.AccountID.Value, p.AccountID.Present = cfAccount, true
	p.Value.Value, p.Value.Present = shared.UnionString(value), true
	return p
}

// TestARecoveredRouteDeleteStartsItsPropagationWindowAtItsReadback: recovery of a route delete
// that landed on Cloudflare records the propagation window from its own readback. The stopped
// Host's state is written here in SQL, for speed and precision; a real Host killed at that point
// is takoserver's TestAHostKilledAfterARouteDeleteLandedLosesNoPropagationWindow.
func TestARecoveredRouteDeleteStartsItsPropagationWindowAtItsReadback(t *testing.T) {
	t.Parallel()
	h, s := setupCloudflare(t)
	r := h.putWorker("prod", "api", tokenA, cfWorkerBody(`export default { fetch() { return new Response("x") } }`))
	require.Equal(t, http.StatusCreated, r.status, "body: %s", r.body)
	script := r.json(t)["scriptName"].(string)
	e := h.mustEndpoint("prod", "api", tokenB, map[string]any{"worker": "api", "offeringId": "cf-endpoint"})
	uid := e["uid"].(string)

	// A Host stopped in the middle of the endpoint's DELETE, after Cloudflare took the route down
	// and before it recorded the readback: its operation running under an expired lease, the
	// endpoint deleting, its attestation open, the route's delete dispatched.
	op := uuid.New()
	h.exec(`INSERT INTO operations (id, organization_id, kind, external_key, method, status) VALUES ($1, $2, 'worker-endpoint', 'prod/api', 'DELETE', 'running')`, op, h.org.ID)
	h.exec(`INSERT INTO ownership_intents (organization_id, kind, external_key, operation_id, holder, lease_expires_at) VALUES ($1, 'worker-endpoint', 'prod/api', $2, 'a stopped Host', db_now() - interval '1 second')`, h.org.ID, op)
	h.exec(`UPDATE worker_endpoints SET status = 'deleting', operation_id = $2 WHERE uid = $1`, uid, op)
	h.exec(`INSERT INTO deletion_attestations (uid, organization_id, resource_kind, status, operation_id) VALUES ($1, $2, 'worker-endpoint', 'open', $3)`, uid, h.org.ID, op)
	h.exec(`UPDATE deployments SET status = 'deleting' WHERE resource_uid = $1`, uid)
	h.exec(`INSERT INTO backend_effects (id, operation_id, deployment_id, action, status) SELECT gen_random_uuid(), $2, id, 'delete', 'dispatched' FROM deployments WHERE resource_uid = $1`, uid, op)
	sdk, err := cloudflare.New(cloudflare.Options{BaseURL: s.BaseURL(), Token: vocab.NewSecret(cfToken)})
	require.NoError(t, err)
	var p workers.ScriptSubdomainDeleteParams
	p.AccountID.Value, p.AccountID.Present = cfAccount, true
	_, err = sdk.Scripts.Subdomain.Delete(context.Background(), script, p)
	require.NoError(t, err)

	// The owner's retry recovers the stopped request (its readback finds the route gone) and
	// finishes the delete: the window runs from that readback, persisted, not from nothing.
	require.Equal(t, http.StatusOK, h.deleteEndpoint("prod", "api", tokenB).status)
	require.Equal(t, "refused", h.status("SELECT status FROM operations WHERE id = $1", op))
	require.Equal(t, 1, h.count(`SELECT count(*) FROM deployments WHERE resource_uid = $1 AND status = 'deleted' AND routed_until > now()`, uid))
	require.Equal(t, "open", h.attestationView(uid), "the attestation waits for the window")
	pollUntil(t, 10*time.Second, func() bool { return h.attestationView(uid) == "closed" }, "the attestation closes")
}
