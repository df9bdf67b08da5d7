package server_test

import (
	"context"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"path/filepath"
	"testing"

	"github.com/cloudflare/cloudflare-go/v6/workers"
	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/backend/cloudflare"
	"github.com/takoform/terraform-provider-takoform/internal/cloudflare/cfstandin"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/workerd/workerdtest"
	"github.com/takoform/terraform-provider-takoform/internal/safedir"
	"github.com/takoform/terraform-provider-takoform/internal/vocab"
)

const (
	cfAccount   = "0123456789abcdef0123456789abcdef"
	cfSubdomain = "acme"
	cfToken     = "cf-canary-token-7e57c0ffee"
)

// setupWorkersDev starts a Host whose catalog sells a workers-dev offering (cf-worker, cf-endpoint)
// on a Cloudflare stand-in beside the selfhost one; hostToken is the token the Host's file holds.
func setupWorkersDev(t *testing.T, hostToken string, installation ...func(map[string]any)) (*harness, *cfstandin.Server) {
	t.Helper()
	s, err := cfstandin.New(cfstandin.Config{Token: cfToken, AccountID: cfAccount, AccountSubdomain: cfSubdomain, Workerd: workerdtest.Binary(t)})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	private := filepath.Join(t.TempDir(), "cf")
	require.NoError(t, safedir.Ensure(private, safedir.Current()))
	require.NoError(t, safedir.WriteFile(private, "api-token", []byte(hostToken+"\n"), safedir.Current()))
	cf := map[string]any{"name": "cf", "pack": "workers-dev", "accountSubdomain": cfSubdomain, "accountId": cfAccount,
		"apiTokenFile": filepath.Join(private, "api-token"), "apiBaseUrl": s.BaseURL()}
	for _, f := range installation {
		f(cf)
	}
	cat, err := json.Marshal(map[string]any{
		"installations": []any{map[string]any{"name": "local", "pack": "selfhost"}, cf},
		"offerings": []any{
			map[string]any{"id": "local-worker", "kind": "module-worker", "installation": "local", "soldTo": []string{"*"}},
			map[string]any{"id": "cf-worker", "kind": "module-worker", "installation": "cf", "soldTo": []string{"*"}},
			map[string]any{"id": "cf-endpoint", "kind": "worker-endpoint", "installation": "cf", "soldTo": []string{"*"}},
		},
	})
	require.NoError(t, err)
	h := setup(t, func(o *options) { o.catalogJSON = string(cat) })
	return h, s
}

func cfWorkerBody(code string) map[string]any {
	b := workerBody()
	b["modules"] = map[string]string{"index.js": code}
	b["offeringId"] = "cf-worker"
	return b
}

// fetchWorkersDev enables the script's workers.dev route straight through the API (these tests put
// no endpoint) and fetches the worker's URL through the stand-in's edge.
func fetchWorkersDev(t *testing.T, s *cfstandin.Server, script string) (int, string) {
	t.Helper()
	sdk, err := cloudflare.New(cloudflare.Options{BaseURL: s.BaseURL(), Token: vocab.NewSecret(cfToken)})
	require.NoError(t, err)
	var p workers.ScriptSubdomainNewParams
	p.AccountID.Value, p.AccountID.Present = cfAccount, true
	p.Enabled.Value, p.Enabled.Present = true, true
	if _, ok := s.Script(script); ok {
		_, err = sdk.Scripts.Subdomain.New(context.Background(), script, p)
		require.NoError(t, err)
	}
	res, err := s.EdgeClient().Get("https://" + script + "." + cfSubdomain + ".workers.dev/")
	require.NoError(t, err)
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	require.NoError(t, err)
	return res.StatusCode, string(body)
}

func TestAWorkerPutOnAWorkersDevOfferingLandsOnCloudflareRunsAndItsDeleteLeavesNothing(t *testing.T) {
	t.Parallel()
	h, s := setupWorkersDev(t, cfToken)
	const v1 = `export default { fetch() { return new Response("cf-v1") } }`
	const v2 = `export default { fetch() { return new Response("cf-v2") } }`

	r := h.putWorker("prod", "api", tokenA, cfWorkerBody(v1))
	require.Equal(t, http.StatusCreated, r.status, "body: %s", r.body)
	w := r.json(t)
	require.Equal(t, true, w["ready"], "body: %s", r.body)
	require.Equal(t, "cf-worker", w["offeringId"])
	script := w["scriptName"].(string)
	sc, ok := s.Script(script)
	require.True(t, ok, "the script is on the account")
	uid, _ := sc.Current.Binding(cloudflare.BindingWorkerUID)
	require.Equal(t, w["uid"], uid.Text)
	status, body := fetchWorkersDev(t, s, script)
	require.Equal(t, http.StatusOK, status)
	require.Equal(t, "cf-v1", body)

	r = h.putWorker("prod", "api", tokenA, cfWorkerBody(v2))
	require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
	require.EqualValues(t, 2, r.json(t)["generation"])
	_, body = fetchWorkersDev(t, s, script)
	require.Equal(t, "cf-v2", body, "the code change runs")
	got := h.do(req{method: http.MethodGet, path: "/v1/spaces/prod/workers/api", key: h.key})
	require.Equal(t, true, got.json(t)["ready"], "body: %s", got.body)

	r = h.deleteWorker("prod", "api", tokenA)
	require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
	require.Empty(t, s.ScriptNames(""), "nothing is left on the account")
	status, _ = fetchWorkersDev(t, s, script)
	require.Equal(t, http.StatusNotFound, status)
	for _, req := range s.Requests() {
		require.NotContains(t, req.Path, "force=true", "a script is never deleted with force")
	}
	require.Zero(t, h.count(`SELECT count(*) FROM deletion_attestations WHERE status = 'open'`))
}

func TestAScriptCloudflareRefusesIsDeploymentFailedWithItsMessageAndLeavesNothing(t *testing.T) {
	t.Parallel()
	h, s := setupWorkersDev(t, cfToken)
	p := h.putWorker("prod", "api", tokenA, cfWorkerBody(`export default {`)).problem(t, http.StatusUnprocessableEntity, "deployment_failed")
	require.Contains(t, p["detail"], "refused the code")
	require.Empty(t, s.ScriptNames(""))
	h.do(req{method: http.MethodGet, path: "/v1/spaces/prod/workers/api", key: h.key}).problem(t, http.StatusNotFound, "not_found")
}

func TestABadCloudflareTokenIsBackendMisconfiguredNamingTheInstallationNeverTheToken(t *testing.T) {
	t.Parallel()
	const wrong = "cf-wrong-token-canary-31337"
	h, s := setupWorkersDev(t, wrong)
	r := h.putWorker("prod", "api", tokenA, cfWorkerBody(`export default { fetch() { return new Response("x") } }`))
	p := r.problem(t, http.StatusBadGateway, "backend_misconfigured")
	require.Contains(t, p["detail"], "installation cf")
	require.NotContains(t, string(r.body), wrong)
	require.NotContains(t, h.logs.String(), wrong)
	require.True(t, s.SawCredential(wrong), "the Host did send its (wrong) token")
	require.Empty(t, s.ScriptNames(""))
}

// On workers-dev a service binding goes up as a Cloudflare service binding naming the callee's
// script, and the caller answers with the callee's reply at its workers.dev URL; the callee's
// delete is refused while the caller binds to it.
func TestAServiceBindingOnWorkersDevIsACloudflareServiceBinding(t *testing.T) {
	t.Parallel()
	h, s := setupWorkersDev(t, cfToken)
	callee := h.putWorker("prod", "auth", "token-cf-auth-000000001", cfWorkerBody(`export default { fetch() { return new Response("from auth") } }`))
	require.Equal(t, http.StatusCreated, callee.status, "body: %s", callee.body)
	body := cfWorkerBody(`export default { async fetch(req, env) { const r = await env.AUTH.fetch("https://auth/"); return new Response("via binding: " + await r.text()) } }`)
	body["serviceBindings"] = map[string]string{"AUTH": callee.json(t)["uid"].(string)}
	body["limits"] = map[string]any{"cpuMs": 50}
	caller := h.putWorker("prod", "api", "token-cf-api-0000000001", body)
	require.Equal(t, http.StatusCreated, caller.status, "body: %s", caller.body)
	script := caller.json(t)["scriptName"].(string)
	sc, ok := s.Script(script)
	require.True(t, ok)
	b, ok := sc.Current.Binding("AUTH")
	require.True(t, ok)
	require.Equal(t, "service", b.Type)
	require.Equal(t, callee.json(t)["scriptName"], b.Service)
	status, got := fetchWorkersDev(t, s, script)
	require.Equal(t, http.StatusOK, status, "body: %s", got)
	require.Equal(t, "via binding: from auth", got)
	h.deleteWorker("prod", "auth", "token-cf-auth-000000001").problem(t, http.StatusConflict, "worker_has_callers")

	// Cloudflare runs every worker with 128 MB: another memory limit is refused.
	body["limits"] = map[string]any{"memoryMb": 256}
	h.putWorker("prod", "api", "token-cf-api-0000000001", body).problem(t, http.StatusUnprocessableEntity, "invalid_request")
}

// A bundle with a WebAssembly and a data module lands on Cloudflare as the multipart parts
// Cloudflare takes for them (application/wasm and application/octet-stream, their bytes, not
// base64), and runs: the stand-in hands the parts to workerd by those content types.
func TestWebAssemblyAndDataModulesLandOnCloudflareAsTheirParts(t *testing.T) {
	t.Parallel()
	h, s := setupWorkersDev(t, cfToken)
	wasm, err := hex.DecodeString("0061736d0100000001070160027f7f017f030201000707010361646400000a09010700200020016a0b")
	require.NoError(t, err)
	b := cfWorkerBody(`import add from "./add.wasm";
import blob from "./blob.bin";
const instance = new WebAssembly.Instance(add);
export default { fetch() { return new Response("add=" + instance.exports.add(40, 2) + " blob=" + new Uint8Array(blob).length) } };`)
	b["modules"].(map[string]string)["add.wasm"] = base64.StdEncoding.EncodeToString(wasm)
	b["modules"].(map[string]string)["blob.bin"] = base64.StdEncoding.EncodeToString([]byte{0, 1, 2, 255})
	r := h.putWorker("prod", "wasm", tokenA, b)
	require.Equal(t, http.StatusCreated, r.status, "body: %s", r.body)
	script := r.json(t)["scriptName"].(string)
	status, body := fetchWorkersDev(t, s, script)
	require.Equal(t, http.StatusOK, status, body)
	require.Equal(t, "add=42 blob=4", body)
}

// A source map is kept only where the worker's log is (SPEC 3.6): on workers-dev the bundle that
// carries one is refused 422, naming the offering and its pack, and nothing reaches Cloudflare.
func TestASourceMapIsRefusedOnACloudflareOffering(t *testing.T) {
	t.Parallel()
	h, s := setupWorkersDev(t, cfToken)
	b := cfWorkerBody(`export default { fetch() { return new Response("ok") } };`)
	b["modules"].(map[string]string)["index.js.map"] = `{"version":3,"sources":["src/a.ts"],"mappings":"AAAA"}`
	before := apiCalls(s, http.MethodPut, "/scripts/")
	h.putWorker("prod", "mapped", tokenA, b).problem(t, http.StatusUnprocessableEntity, "invalid_request")
	r := h.putWorker("prod", "mapped", tokenA, b)
	require.Contains(t, string(r.body), "only a selfhost offering keeps")
	require.Equal(t, before, apiCalls(s, http.MethodPut, "/scripts/"), "nothing was uploaded")
	require.Equal(t, 0, h.count(`SELECT count(*) FROM workers`))
}
