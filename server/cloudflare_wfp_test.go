package server_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/backend/cloudflare"
	"github.com/takoform/terraform-provider-takoform/internal/backend/cloudflare/dispatch"
	"github.com/takoform/terraform-provider-takoform/internal/catalog"
	"github.com/takoform/terraform-provider-takoform/internal/cloudflare/cfstandin"
	"github.com/takoform/terraform-provider-takoform/internal/vocab"
)

// burnModule answers "cool" at once, and "burned" after some hundred milliseconds of CPU time for
// ?burn (a counted loop: a Worker's clock does not move while it computes).
const burnModule = `export default { fetch(req) {
  if (!new URL(req.url).searchParams.has("burn")) return new Response("cool");
  let x = 0;
  for (let i = 0; i < 200000000; i++) { x = (x + i * 7) % 1000003; }
  return new Response("burned " + x);
} }`

func wfpBurnBody(cpuMs int) map[string]any {
	b := workerBody()
	b["modules"] = map[string]string{"index.js": burnModule}
	b["offeringId"] = "wfp-worker"
	b["limits"] = map[string]any{"cpuMs": cpuMs}
	return b
}

// eventually fetches url through the edge until want(status, body) holds (KV at the edge is
// stale for the propagation window), and returns the last answer.
func eventually(t *testing.T, s *cfstandin.Server, url string, want func(int, string) bool) (int, string) {
	t.Helper()
	var status int
	var body string
	for deadline := time.Now().Add(3 * cfPropagation); ; {
		status, body = edgeGet(t, s, url)
		if want(status, body) || time.Now().After(deadline) {
			return status, body
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func routingEntry(t *testing.T, s *cfstandin.Server, key string) map[string]any {
	t.Helper()
	raw, ok := s.KVValue(cfRoutingKV, key)
	require.True(t, ok, "routing KV holds %s", key)
	var e map[string]any
	require.NoError(t, json.Unmarshal(raw, &e))
	return e
}

func problemCodeOf(t *testing.T, body string) string {
	t.Helper()
	var p struct{ Code string }
	require.NoError(t, json.Unmarshal([]byte(body), &p), body)
	return p.Code
}

func TestAWFPWorkerOverItsCPULimitAnswersTheLimitErrorAndARaisedLimitTakesEffectInPlace(t *testing.T) {
	t.Parallel()
	h, s := setupCloudflare(t)
	w := h.putWorker("prod", "hot", tokenA, wfpBurnBody(200))
	require.Equal(t, http.StatusCreated, w.status, "body: %s", w.body)
	script := w.json(t)["scriptName"].(string)
	e := h.mustEndpoint("prod", "hot", tokenB, map[string]any{"worker": "hot", "offeringId": "wfp-endpoint"})
	host, url := e["hostname"].(string), e["url"].(string)
	require.EqualValues(t, 200, routingEntry(t, s, host)["cpuMs"], "the entry carries the worker's cpuMs")
	require.Equal(t, map[string]any{"workerUid": w.json(t)["uid"], "cpuMs": float64(200)}, routingEntry(t, s, dispatch.ScriptKey(script)))

	// 200 ms: the stand-in counts the worker process's CPU, which a first request on a loaded
	// machine (the module's compile) can take past 20 ms; the burn takes seconds.
	status, body := edgeGet(t, s, url)
	require.Equal(t, http.StatusOK, status, body)
	require.Equal(t, "cool", body, "under its limit it answers")
	status, body = edgeGet(t, s, url+"?burn")
	require.Equal(t, http.StatusServiceUnavailable, status, body)
	require.Equal(t, "worker_exceeded_limits", problemCodeOf(t, body))

	// Raised in place, the rewrite of the worker's script entry failing: the put reports the
	// failure, and its re-run (never a replay: the failure was not stored) converges.
	require.NoError(t, s.Inject(cfstandin.Fault{Kind: cfstandin.FaultServerError, Method: http.MethodPut, PathContains: "/values/" + dispatch.ScriptKey(script), Times: 20}))
	r := h.putWorker("prod", "hot", tokenA, wfpBurnBody(30000))
	require.GreaterOrEqual(t, r.status, 500, "body: %s", r.body)
	require.EqualValues(t, 200, routingEntry(t, s, dispatch.ScriptKey(script))["cpuMs"])
	s.ClearFaults()
	r = h.putWorker("prod", "hot", tokenA, wfpBurnBody(30000))
	require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
	require.EqualValues(t, 30000, routingEntry(t, s, dispatch.ScriptKey(script))["cpuMs"])
	// The routing entry is never rewritten (a rewrite could race the endpoint's delete and write
	// a deleted route back): the dispatch worker reads the limit from the script entry.
	entry := routingEntry(t, s, host)
	require.EqualValues(t, 200, entry["cpuMs"], "the route keeps what it was created with")
	require.Equal(t, e["uid"], entry["endpointUid"])
	status, body = eventually(t, s, url+"?burn", func(status int, _ string) bool { return status == http.StatusOK })
	require.Equal(t, http.StatusOK, status, body)
	require.True(t, strings.HasPrefix(body, "burned "), body)
}

// installDispatchWorker uploads the product's dispatch worker to the stand-in's account as the
// wfp installation's dispatchWorkerName (what takoserver cloudflare install-dispatch uploads).
func installDispatchWorker(t *testing.T, s *cfstandin.Server) {
	t.Helper()
	sdk, err := cloudflare.New(cloudflare.Options{BaseURL: s.BaseURL(), Token: vocab.NewSecret(cfToken)})
	require.NoError(t, err)
	inst := catalog.Installation{RoutingKVNamespaceID: cfRoutingKV, DispatchNamespace: cfNamespace}
	require.NoError(t, cloudflare.Account{ID: cfAccount}.Upload(context.Background(), sdk, "takoform-dispatch", cloudflare.DispatchUpload(inst, dispatch.MinCacheTTL)))
}

const callerModule = `export default { async fetch(req, env) {
  const r = await env.AUTH.fetch(new Request("https://auth.internal" + new URL(req.url).pathname + new URL(req.url).search));
  return new Response("front:" + r.status + ":" + await r.text());
} }`

func TestAWFPCallerAnswersWithItsCalleesReplyThroughItsBinding(t *testing.T) {
	t.Parallel()
	h, s := setupCloudflare(t)
	callee := wfpWorkerBody("callee-v1")
	callee["limits"] = map[string]any{"cpuMs": 20}
	c := h.putWorker("prod", "auth", tokenA, callee)
	require.Equal(t, http.StatusCreated, c.status, "body: %s", c.body)
	calleeUID, calleeScript := c.json(t)["uid"].(string), c.json(t)["scriptName"].(string)

	caller := workerBody()
	caller["modules"] = map[string]string{"index.js": callerModule}
	caller["offeringId"] = "wfp-worker"
	caller["serviceBindings"] = map[string]string{"AUTH": calleeUID}

	// No dispatch worker with the Binding entrypoint yet: refused, not uploaded to fail later.
	p := h.putWorker("prod", "front", tokenB, caller).problem(t, http.StatusBadGateway, "backend_misconfigured")
	require.Contains(t, p["detail"], "install-dispatch")
	installDispatchWorker(t, s)

	r := h.putWorker("prod", "front", tokenB, caller)
	require.Equal(t, http.StatusCreated, r.status, "body: %s", r.body)
	callerScript := r.json(t)["scriptName"].(string)
	sc, ok := s.NamespaceScript(cfNamespace, callerScript)
	require.True(t, ok)
	var bound cfstandin.Binding
	for _, b := range sc.Current.Bindings {
		if b.Name == "AUTH" {
			bound = b
		}
	}
	require.Equal(t, "takoform-dispatch", bound.Service, "a binding to the account's dispatch worker, never to the sibling")
	require.Equal(t, dispatch.BindingEntrypoint, bound.Entrypoint)
	require.JSONEq(t, `{"calleeScript":"`+calleeScript+`","calleeUid":"`+calleeUID+`"}`, string(bound.Props))

	e := h.mustEndpoint("prod", "front", tokenA, map[string]any{"worker": "front", "offeringId": "wfp-endpoint"})
	url := e["url"].(string)
	status, body := eventually(t, s, url, func(_ int, body string) bool { return body == "front:200:callee-v1" })
	require.Equal(t, http.StatusOK, status)
	require.Equal(t, "front:200:callee-v1", body)

	// The callee's limit holds through the binding too.
	burning := wfpBurnBody(20)
	r2 := h.putWorker("prod", "auth", tokenA, burning)
	require.Equal(t, http.StatusOK, r2.status, "body: %s", r2.body)
	uploads := sc.Uploads
	status, body = eventually(t, s, url+"?burn", func(_ int, body string) bool { return strings.Contains(body, "worker_exceeded_limits") })
	require.Equal(t, http.StatusOK, status)
	require.True(t, strings.HasPrefix(body, "front:503:"), body)
	require.Contains(t, body, "worker_exceeded_limits")

	// The callee's code update reached the caller with no upload of the caller.
	status, body = eventually(t, s, url, func(_ int, body string) bool { return body == "front:200:cool" })
	require.Equal(t, "front:200:cool", body)
	now, _ := s.NamespaceScript(cfNamespace, callerScript)
	require.Equal(t, uploads, now.Uploads, "the caller was not uploaded again")

	// Out of order: the callee refuses deletion while the caller binds to it.
	h.deleteWorker("prod", "auth", tokenA).problem(t, http.StatusConflict, "worker_has_callers")
	_, present := s.NamespaceScript(cfNamespace, calleeScript)
	require.True(t, present)
}
