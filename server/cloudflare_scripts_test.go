package server_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cloudflare/cloudflare-go/v6/kv"
	"github.com/cloudflare/cloudflare-go/v6/shared"
	"github.com/cloudflare/cloudflare-go/v6/workers"
	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/backend"
	"github.com/takoform/terraform-provider-takoform/internal/backend/cloudflare"
	"github.com/takoform/terraform-provider-takoform/internal/cloudflare/cfstandin"
	"github.com/takoform/terraform-provider-takoform/internal/leakscan"
	"github.com/takoform/terraform-provider-takoform/internal/pgcluster"
	"github.com/takoform/terraform-provider-takoform/internal/ratebudget"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/workerd/workerdtest"
	"github.com/takoform/terraform-provider-takoform/internal/runtimeinput"
	"github.com/takoform/terraform-provider-takoform/internal/safedir"
	"github.com/takoform/terraform-provider-takoform/internal/vocab"
)

// cfScripts is a Host whose catalog sells a workers-dev offering (cf-worker, cf-endpoint) and a
// wfp-managed one (wfp-worker, wfp-endpoint) on one Cloudflare stand-in, beside the selfhost one.
type cfScripts struct {
	*harness
	standin *cfstandin.Server
	catalog string
	// skew moves the stand-in's clock (pass moves the database's with it).
	skew atomic.Int64
}

// pass moves the stand-in's clock and the database's by d: rate blocks end without a sleep.
func (c *cfScripts) pass(d time.Duration) {
	c.skew.Add(int64(d))
	c.advance(fmt.Sprintf("%d milliseconds", d.Milliseconds()))
}

type cfScriptsOptions struct {
	ceiling int
	hooks   runtimeinput.Hooks
	wrap    func(backend.Mutator) backend.Mutator
	budget  ratebudget.Budget
}

func setupCFScripts(t *testing.T, o cfScriptsOptions) *cfScripts {
	t.Helper()
	c := &cfScripts{}
	s, err := cfstandin.New(cfstandin.Config{Now: func() time.Time { return time.Now().Add(time.Duration(c.skew.Load())) }, Token: cfToken, AccountID: cfAccount, AccountSubdomain: cfSubdomain, Workerd: workerdtest.Binary(t),
		DispatchNamespaces: []string{cfNamespace}, KVNamespaces: []string{cfRoutingKV}, BaseDomain: cfBaseDomain,
		RoutingKVNamespace: cfRoutingKV, RoutingDispatchNamespace: cfNamespace})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	private := filepath.Join(t.TempDir(), "cf")
	require.NoError(t, safedir.Ensure(private, safedir.Current()))
	require.NoError(t, safedir.WriteFile(private, "api-token", []byte(cfToken+"\n"), safedir.Current()))
	token := filepath.Join(private, "api-token")
	cf := map[string]any{"name": "cf", "pack": "workers-dev", "accountSubdomain": cfSubdomain, "accountId": cfAccount,
		"apiTokenFile": token, "apiBaseUrl": s.BaseURL()}
	if o.ceiling > 0 {
		cf["scriptCeiling"] = o.ceiling
	}
	cat, err := json.Marshal(map[string]any{
		"installations": []any{
			map[string]any{"name": "local", "pack": "selfhost"},
			cf,
			map[string]any{"name": "wfp", "pack": "wfp-managed", "accountId": cfAccount, "apiTokenFile": token, "apiBaseUrl": s.BaseURL(),
				"baseDomain": cfBaseDomain, "dispatchNamespace": cfNamespace, "dispatchWorkerName": "takoform-dispatch", "routingKvNamespaceId": cfRoutingKV},
		},
		"offerings": []any{
			map[string]any{"id": "local-worker", "kind": "module-worker", "installation": "local", "soldTo": []string{"*"}},
			map[string]any{"id": "cf-worker", "kind": "module-worker", "installation": "cf", "soldTo": []string{"*"}},
			map[string]any{"id": "cf-endpoint", "kind": "worker-endpoint", "installation": "cf", "soldTo": []string{"*"}},
			map[string]any{"id": "wfp-worker", "kind": "module-worker", "installation": "wfp", "soldTo": []string{"*"}},
			map[string]any{"id": "wfp-endpoint", "kind": "worker-endpoint", "installation": "wfp", "soldTo": []string{"*"}},
		},
	})
	require.NoError(t, err)
	h := setup(t, func(opt *options) {
		opt.catalogJSON, opt.hooks, opt.wrap, opt.cfBudget = string(cat), o.hooks, o.wrap, o.budget
	})
	c.harness, c.standin, c.catalog = h, s, string(cat)
	return c
}

// secretWorkerOn is the body of a worker on offering that needs API_KEY from reference.
func secretWorkerOn(offering, reference string) map[string]any {
	b := secretWorkerBody(reference)
	b["offeringId"] = offering
	return b
}

// reserveAndPrepare reserves the origin of space/worker on the endpoint offering (label "" asks
// the Host to derive it) and prepares operation op, whose one binding API_KEY holds value.
func (c *cfScripts) reserveAndPrepare(op, id, offering, label, space, worker, value string) prepared {
	c.t.Helper()
	body := map[string]any{"space": space, "workerName": worker, "offeringId": offering}
	if label != "" {
		body["subdomain"] = label
	}
	r := c.putReservation(c.key, id, "token-res-"+id+"-000000000", body)
	require.Equal(c.t, http.StatusCreated, r.status, "body: %s", r.body)
	p := c.prepare(op, "token-prepare-"+op+"-0000000", id, space, worker, map[string]string{"API_KEY": value})
	require.Equal(c.t, http.StatusCreated, p.reply.status, "body: %s", p.reply.body)
	return p
}

// script returns the stand-in's script of a worker projection (ns "" for workers-dev).
func (c *cfScripts) script(ns string, w map[string]any) cfstandin.Script {
	c.t.Helper()
	sc, ok := c.standin.NamespaceScript(ns, w["scriptName"].(string))
	require.True(c.t, ok, "the script %s is on the stand-in", w["scriptName"])
	return sc
}

// fetchWorkersDev fetches the worker's workers.dev URL through the stand-in's edge, its route
// enabled directly through the API (these tests put no endpoint).
func (c *cfScripts) fetchWorkersDev(script string) string {
	c.t.Helper()
	status, body := fetchWorkersDev(c.t, c.standin, script)
	require.Equal(c.t, http.StatusOK, status, "body: %s", body)
	return body
}

// fetchWFP routes label.<baseDomain> to the namespace script by writing its routing KV entry
// directly (the endpoint's part) and fetches it through the stand-in's edge and dispatch worker.
func (c *cfScripts) fetchWFP(label, script string) string {
	c.t.Helper()
	sdk, err := cloudflare.New(cloudflare.Options{BaseURL: c.standin.BaseURL(), Token: vocab.NewSecret(cfToken)})
	require.NoError(c.t, err)
	host := label + "." + cfBaseDomain
	entry, err := json.Marshal(cfstandin.RouteEntry{ScriptName: script, EndpointUID: uuid.NewString(), CPUMs: 50})
	require.NoError(c.t, err)
	var p kv.NamespaceValueUpdateParams
	p.AccountID.Value, p.AccountID.Present = cfAccount, true
	p.Value.Value, p.Value.Present = shared.UnionString(string(entry)), true
	_, err = sdk.KVValues.Update(context.Background(), cfRoutingKV, host, p)
	require.NoError(c.t, err)
	res, err := c.standin.EdgeClient().Get("https://" + host + "/")
	require.NoError(c.t, err)
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	require.NoError(c.t, err)
	require.Equal(c.t, http.StatusOK, res.StatusCode, "body: %s", body)
	return string(body)
}

// scriptUploads counts the uploads (PUT of the script itself) the stand-in saw for script.
func (c *cfScripts) scriptUploads(script string) int {
	n := 0
	for _, r := range c.standin.Requests() {
		if r.Method == http.MethodPut && strings.HasSuffix(strings.SplitN(r.Path, "?", 2)[0], "/scripts/"+script) {
			n++
		}
	}
	return n
}

// settledValueFree checks the preparation settled on the value-free readback: the dispatch CAS
// recorded SHA-256 of {workerUid, delivery, secretNames}, and the script holds exactly that.
func (c *cfScripts) settledValueFree(op string, w map[string]any, sc cfstandin.Script) {
	c.t.Helper()
	require.Equal(c.t, "settled", c.preparationStatus(op))
	var prepID string
	var recorded []byte
	require.NoError(c.t, c.db.QueryRow(context.Background(),
		`SELECT preparation_id, delivery_digest FROM runtime_input_preparations WHERE operation_id = $1`, op).Scan(&prepID, &recorded))
	require.Equal(c.t, backend.DeliveryDigest(w["uid"].(string), prepID, []string{"API_KEY"}), recorded)
	delivery, ok := sc.Current.Binding(cloudflare.BindingDelivery)
	require.True(c.t, ok)
	require.Equal(c.t, prepID, delivery.Text, "TAKOFORM_DELIVERY is the preparation id")
	require.Equal(c.t, []string{"API_KEY"}, secretNames(sc), "exactly the delivery's secrets")
}

func secretNames(sc cfstandin.Script) []string {
	var out []string
	for _, b := range sc.Current.Bindings {
		if b.Type == "secret_text" {
			out = append(out, b.Name)
		}
	}
	return out
}

func TestARuntimeInputConsumedOnWorkersDevReachesTheWorkerInOneUploadAndSettlesOnTheValueFreeReadback(t *testing.T) {
	t.Parallel()
	c := setupCFScripts(t, cfScriptsOptions{})
	p := c.reserveAndPrepare("op-1", "res-api", "cf-worker", "", "prod", "api", secretCanary)

	r := c.putWorker("prod", "api", tokenA, secretWorkerOn("cf-worker", p.reference))
	require.Equal(t, http.StatusCreated, r.status, "body: %s", r.body)
	w := r.json(t)
	require.Equal(t, true, w["ready"], "body: %s", r.body)
	script := w["scriptName"].(string)
	sc := c.script("", w)
	c.settledValueFree("op-1", w, sc)
	require.Equal(t, 2, c.scriptUploads(script), "the worker's upload, then one dispatch upload")
	require.Equal(t, secretShown(secretCanary), c.fetchWorkersDev(script))

	// A code change keeps the delivered secret by inherit, without resending it.
	body := secretWorkerOn("cf-worker", p.reference)
	body["modules"] = map[string]string{"index.js": strings.Replace(secretModule, `"len="`, `"v2 len="`, 1)}
	r = c.putWorker("prod", "api", tokenA, body)
	require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
	require.Equal(t, "v2 "+secretShown(secretCanary), c.fetchWorkersDev(script))
	sc = c.script("", w)
	delivery, _ := sc.Current.Binding(cloudflare.BindingDelivery)
	require.Equal(t, p.reply.json(t)["preparationId"], delivery.Text, "the kept secret is still that delivery's")

	// A worker PUT without a reference and without requiredSensitiveVars removes the values.
	r = c.putWorker("prod", "api", tokenA, cfWorkerBody(secretModule))
	require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
	sc = c.script("", w)
	require.Empty(t, secretNames(sc))
	_, ok := sc.Current.Binding(cloudflare.BindingDelivery)
	require.False(t, ok, "no delivery is held any more")
	require.Equal(t, secretShown(""), c.fetchWorkersDev(script))

	c.noCanary(t)
}

// The dispatch upload re-sends the script's current version from its readback: a worker's
// limits.cpuMs is in that readback and stays on the version that carries the delivery.
func TestADeliveryOnWorkersDevKeepsTheWorkersCPULimit(t *testing.T) {
	t.Parallel()
	c := setupCFScripts(t, cfScriptsOptions{})
	p := c.reserveAndPrepare("op-1", "res-api", "cf-worker", "", "prod", "api", secretCanary)
	body := secretWorkerOn("cf-worker", p.reference)
	body["limits"] = map[string]any{"cpuMs": 50}

	r := c.putWorker("prod", "api", tokenA, body)
	require.Equal(t, http.StatusCreated, r.status, "body: %s", r.body)
	w := r.json(t)
	sc := c.script("", w)
	c.settledValueFree("op-1", w, sc)
	require.Equal(t, 2, c.scriptUploads(w["scriptName"].(string)), "the worker's upload, then one dispatch upload")
	require.Equal(t, int64(50), sc.Current.Limits.CPUMs, "the version holding the delivery keeps limits.cpu_ms")

	sdk, err := cloudflare.New(cloudflare.Options{BaseURL: c.standin.BaseURL(), Token: vocab.NewSecret(cfToken)})
	require.NoError(t, err)
	settings, err := cloudflare.Account{ID: cfAccount}.Settings(context.Background(), sdk, w["scriptName"].(string))
	require.NoError(t, err)
	require.Equal(t, int64(50), settings.CPUMs, "the settings readback shows it")
	require.Equal(t, secretShown(secretCanary), c.fetchWorkersDev(w["scriptName"].(string)))
}

func TestARuntimeInputConsumedOnWFPManagedReachesTheWorkerThroughTheDispatchNamespace(t *testing.T) {
	t.Parallel()
	c := setupCFScripts(t, cfScriptsOptions{})
	p := c.reserveAndPrepare("op-1", "res-shop", "wfp-worker", "shop", "prod", "shop", secretCanary)

	r := c.putWorker("prod", "shop", tokenA, secretWorkerOn("wfp-worker", p.reference))
	require.Equal(t, http.StatusCreated, r.status, "body: %s", r.body)
	w := r.json(t)
	require.Equal(t, true, w["ready"], "body: %s", r.body)
	script := w["scriptName"].(string)
	require.Empty(t, c.standin.ScriptNames(""), "nothing lands among the account's own scripts")
	sc := c.script(cfNamespace, w)
	uid, _ := sc.Current.Binding(cloudflare.BindingWorkerUID)
	require.Equal(t, w["uid"], uid.Text)
	c.settledValueFree("op-1", w, sc)
	require.Equal(t, 2, c.scriptUploads(script))
	require.Equal(t, secretShown(secretCanary), c.fetchWFP("shop", script))

	// The worker's delete reads its UID back and removes the namespace script.
	r = c.deleteWorker("prod", "shop", tokenA)
	require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
	require.Empty(t, c.standin.ScriptNames(cfNamespace))
	c.noCanary(t)
}

func TestALostAnswerOnTheDispatchUploadDeliversOnceAndNeverTwice(t *testing.T) {
	t.Parallel()
	var c *cfScripts
	var script string
	c = setupCFScripts(t, cfScriptsOptions{hooks: runtimeinput.Hooks{AfterAcquire: func() {
		// The dispatch upload lands, and its answer is lost.
		require.NoError(t, c.standin.Inject(cfstandin.Fault{Kind: cfstandin.FaultLostAnswer, Method: http.MethodPut, PathContains: "/workers/scripts/" + script}))
	}}})
	p := c.reserveAndPrepare("op-1", "res-api", "cf-worker", "", "prod", "api", secretCanary)
	body := secretWorkerOn("cf-worker", p.reference)
	script = c.scriptNameOf("prod", "api")

	r := c.putWorker("prod", "api", tokenA, body)
	require.Equal(t, http.StatusCreated, r.status, "body: %s", r.body)
	w := r.json(t)
	lost := 0
	for _, req := range c.standin.Requests() {
		if req.Fault == cfstandin.FaultLostAnswer {
			lost++
		}
	}
	require.Equal(t, 1, lost, "the dispatch upload's answer was lost")
	require.Equal(t, 2, c.scriptUploads(script), "the readback saw it landed: it was never sent again")
	c.settledValueFree("op-1", w, c.script("", w))
	require.Equal(t, secretShown(secretCanary), c.fetchWorkersDev(script))
}

// scriptNameOf is the v2 script name the Host derives for space/name of the harness's org.
func (c *cfScripts) scriptNameOf(space, name string) string {
	return backend.ScriptName(backend.WorkerRef{TenantRef: c.org.ID, Space: space, Name: name})
}

// rateBlocker blocks the stand-in's API (Cloudflare's 5-minute block, shortened) right after a
// worker's upload, and lets the pack meet one 429 so that it records the block.
type rateBlocker struct {
	backend.Mutator
	standin *cfstandin.Server
	block   time.Duration
	armed   bool
}

func (b *rateBlocker) Unwrap() backend.Mutator { return b.Mutator }

func (b *rateBlocker) Apply(ctx context.Context, d backend.Desired) (backend.Observation, error) {
	obs, err := b.Mutator.Apply(ctx, d)
	if err == nil && b.armed {
		b.armed = false
		b.standin.Block(b.block)
		short, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
		_, _ = b.Mutator.Observe(short, d.Kind, d.NativeName) // meets the 429
		cancel()
	}
	return obs, err
}

func TestA429BlockBeforeTheDispatchClaimsNothingAndAnswersARetryable503(t *testing.T) {
	t.Parallel()
	const block = time.Minute // longer than any request waits
	var c *cfScripts
	blocker := &rateBlocker{block: block}
	c = setupCFScripts(t, cfScriptsOptions{wrap: func(m backend.Mutator) backend.Mutator {
		blocker.Mutator, blocker.standin = m, c.standin
		return blocker
	}})
	// The worker stands without secrets; then it asks for a runtime input, and Cloudflare blocks
	// the installation right after the code change landed.
	r := c.putWorker("prod", "api", tokenA, cfWorkerBody(`export default { fetch() { return new Response("v1") } }`))
	require.Equal(t, http.StatusCreated, r.status, "body: %s", r.body)
	p := c.reserveAndPrepare("op-1", "res-api", "cf-worker", "", "prod", "api", secretCanary)
	blocker.armed = true
	r = c.putWorker("prod", "api", tokenA, secretWorkerOn("cf-worker", p.reference))
	pr := r.problem(t, http.StatusServiceUnavailable, "backend_unreachable")
	require.Contains(t, pr["detail"], "nothing was claimed")
	require.NotEmpty(t, r.header.Get("Retry-After"))
	require.Equal(t, "prepared", c.preparationStatus("op-1"), "the runtime input was not claimed")
	require.Zero(t, c.count(`SELECT count(*) FROM runtime_input_preparations WHERE claim_operation_id IS NOT NULL OR worker_uid IS NOT NULL`))
	require.Equal(t, 1, c.count(`SELECT count(*) FROM cloudflare_rate_budgets WHERE installation = 'cf' AND blocked_until > db_now()`), "the 429's Retry-After is recorded")
	sc, ok := c.standin.Script(c.scriptNameOf("prod", "api"))
	require.True(t, ok)
	require.Empty(t, secretNames(sc), "no secret reached the script")

	// Once the block has passed, the same request delivers; but not while the account is not
	// where the catalog says (a replica that meets it first refuses before it claims anything).
	c.pass(block + time.Second)
	other := c.replica(func(o *options) { o.catalogJSON = c.catalog })
	c.standin.SetAccountSubdomain("moved")
	r, err := c.tryAt(other, req{method: http.MethodPut, path: "/v1/spaces/prod/workers/api", key: c.key, token: tokenA, body: secretWorkerOn("cf-worker", p.reference)})
	require.NoError(t, err)
	r.problem(t, http.StatusConflict, "placement_drift")
	require.Equal(t, "prepared", c.preparationStatus("op-1"), "nothing was claimed")
	c.standin.SetAccountSubdomain(cfSubdomain)
	r = c.putWorker("prod", "api", tokenA, secretWorkerOn("cf-worker", p.reference))
	require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
	w := r.json(t)
	c.settledValueFree("op-1", w, c.script("", w))
}

func TestACodeChangeLeavesTheWorkerExactlyTheSecretsItRequires(t *testing.T) {
	t.Parallel()
	c := setupCFScripts(t, cfScriptsOptions{})
	p := c.reserveAndPrepare("op-1", "res-api", "cf-worker", "", "prod", "api", secretCanary)
	r := c.putWorker("prod", "api", tokenA, secretWorkerOn("cf-worker", p.reference))
	require.Equal(t, http.StatusCreated, r.status, "body: %s", r.body)
	w := r.json(t)
	script := w["scriptName"].(string)

	// Someone adds a secret to the script behind the Host's back.
	sdk, err := cloudflare.New(cloudflare.Options{BaseURL: c.standin.BaseURL(), Token: vocab.NewSecret(cfToken)})
	require.NoError(t, err)
	var sp workers.ScriptSecretUpdateParams
	sp.AccountID.Value, sp.AccountID.Present = cfAccount, true
	var rogue workers.ScriptSecretUpdateParamsBodyWorkersBindingKindSecretText
	rogue.Name.Value, rogue.Name.Present = "ROGUE", true
	rogue.Text.Value, rogue.Text.Present = "rogue-value", true
	rogue.Type.Value, rogue.Type.Present = workers.ScriptSecretUpdateParamsBodyWorkersBindingKindSecretTextTypeSecretText, true
	sp.Body = rogue
	_, err = sdk.Scripts.Secrets.Update(context.Background(), script, sp)
	require.NoError(t, err)
	require.Equal(t, []string{"API_KEY", "ROGUE"}, secretNames(c.script("", w)))

	body := secretWorkerOn("cf-worker", p.reference)
	body["modules"] = map[string]string{"index.js": strings.Replace(secretModule, `"len="`, `"v2 len="`, 1)}
	r = c.putWorker("prod", "api", tokenA, body)
	require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
	require.Equal(t, []string{"API_KEY"}, secretNames(c.script("", w)), "the extra secret is gone before the deployment reports active")
	require.Equal(t, "v2 "+secretShown(secretCanary), c.fetchWorkersDev(script))
}

// noCanary searches the Host's responses, logs and database for the secret and the API token.
func (c *cfScripts) noCanary(t *testing.T) {
	t.Helper()
	bin, err := pgcluster.BinDir()
	require.NoError(t, err)
	dump, err := exec.Command(filepath.Join(bin, "pg_dump"), "--data-only", "--inserts", c.dbURL).CombinedOutput()
	require.NoError(t, err, string(dump))
	require.Contains(t, string(dump), "runtime_input_preparations")
	for where, text := range map[string]string{"HTTP responses": c.responses.String(), "logs": c.logs.String(), "pg_dump": string(dump)} {
		for _, canary := range []string{secretCanary, cfToken} {
			chain, found := leakscan.FindString(text, canary)
			require.False(t, found, "%s contain a canary (encoded as %q)", where, chain)
		}
	}
}

func TestTheScriptCeilingHoldsAcrossOrganizationsAndConcurrentCreatesOnTwoReplicas(t *testing.T) {
	t.Parallel()
	const ceiling = 2
	c := setupCFScripts(t, cfScriptsOptions{ceiling: ceiling})
	other := c.replica(func(o *options) { o.catalogJSON = c.catalog })
	_, keyB := c.newOrg("org-b")

	const racers = 5
	var wg sync.WaitGroup
	replies := make([]reply, racers)
	errs := make([]error, racers)
	for i := range racers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			base, key := c.url, c.key
			if i%2 == 1 {
				base, key = other, keyB
			}
			name := "w" + string(rune('a'+i))
			rep, err := c.tryAt(base, req{method: http.MethodPut, path: "/v1/spaces/prod/workers/" + name, key: key,
				token: "token-ceiling-" + name + "-000000000", body: cfWorkerBody(`export default { fetch() { return new Response("x") } }`)})
			replies[i], errs[i] = rep, err
		}()
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
	created := 0
	for _, rep := range replies {
		switch rep.status {
		case http.StatusCreated:
			created++
		case http.StatusTooManyRequests:
			require.True(t, bytes.Contains(rep.body, []byte(`"quota_exceeded"`)), "body: %s", rep.body)
			require.NotContains(t, string(rep.body), "org-b", "the refusal names nobody else")
		default:
			t.Fatalf("unexpected answer %d: %s", rep.status, rep.body)
		}
	}
	require.Equal(t, ceiling, created, "exactly the ceiling passes")
	require.Len(t, c.standin.ScriptNames(""), ceiling, "the refused creates left nothing on the account")

	// Deleting one makes room again.
	for i, rep := range replies {
		if rep.status == http.StatusCreated && i%2 == 0 {
			require.Equal(t, http.StatusOK, c.deleteWorker("prod", "w"+string(rune('a'+i)), "token-ceiling-w"+string(rune('a'+i))+"-000000000").status)
			r := c.putWorker("prod", "again", tokenA, cfWorkerBody(`export default { fetch() { return new Response("x") } }`))
			require.Equal(t, http.StatusCreated, r.status, "body: %s", r.body)
			return
		}
	}
}

func TestA429OnAWorkerUploadIsRetriedWithinTheRequestThenAnswersARetryable503(t *testing.T) {
	t.Parallel()
	c := setupCFScripts(t, cfScriptsOptions{})
	script := c.scriptNameOf("prod", "api")
	code := cfWorkerBody(`export default { fetch() { return new Response("x") } }`)

	// A short storm is absorbed: the upload is tried again once Retry-After has passed.
	require.NoError(t, c.standin.Inject(cfstandin.Fault{Kind: cfstandin.FaultRateLimited, Method: http.MethodPut, PathContains: "/scripts/" + script, RetryAfter: time.Second, Times: 2}))
	r := c.putWorker("prod", "api", tokenA, code)
	require.Equal(t, http.StatusCreated, r.status, "body: %s", r.body)
	require.Equal(t, 3, c.scriptUploads(script), "two uploads met the 429, the third landed")
	require.Equal(t, 1, c.count(`SELECT count(*) FROM cloudflare_rate_budgets WHERE installation = 'cf' AND blocked_until > '-infinity'`), "the 429 was recorded")

	// A block longer than the request may wait surfaces as a retryable 503 with Retry-After.
	require.NoError(t, c.standin.Inject(cfstandin.Fault{Kind: cfstandin.FaultRateLimited, Method: http.MethodPut, PathContains: "/scripts/", RetryAfter: time.Minute}))
	r = c.putWorker("prod", "other", "token-other-0000000000000000", code)
	r.problem(t, http.StatusServiceUnavailable, "backend_unreachable")
	require.Equal(t, "60", r.header.Get("Retry-After"))
	_, ok := c.standin.Script(c.scriptNameOf("prod", "other"))
	require.False(t, ok, "nothing was uploaded")
}

func TestALostAcknowledgementOfACloudflareDeliverySettlesByTheValueFreeReadbackAndIsNeverSentAgain(t *testing.T) {
	t.Parallel()
	var lose atomic.Bool
	lose.Store(true)
	c := setupCFScripts(t, cfScriptsOptions{hooks: runtimeinput.Hooks{AfterDelivery: func() error {
		if lose.Swap(false) {
			return errors.New("the Host lost the delivery's acknowledgement")
		}
		return nil
	}}})
	// The worker stands first: a create that fails is taken down whole, its UID with it.
	lose.Store(false)
	r := c.putWorker("prod", "api", tokenA, cfWorkerBody(`export default { fetch() { return new Response("v1") } }`))
	require.Equal(t, http.StatusCreated, r.status, "body: %s", r.body)
	lose.Store(true)
	p := c.reserveAndPrepare("op-1", "res-api", "cf-worker", "", "prod", "api", secretCanary)
	body := secretWorkerOn("cf-worker", p.reference)
	script := c.scriptNameOf("prod", "api")

	r = c.putWorker("prod", "api", tokenA, body)
	require.GreaterOrEqual(t, r.status, 500, "body: %s", r.body)
	require.Equal(t, "settled", c.preparationStatus("op-1"), "the readback of what Cloudflare holds settled it")

	r = c.putWorker("prod", "api", tokenA, body)
	require.Contains(t, []int{http.StatusCreated, http.StatusOK}, r.status, "body: %s", r.body)
	w := r.json(t)
	require.Equal(t, true, w["ready"], "body: %s", r.body)
	c.settledValueFree("op-1", w, c.script("", w))
	require.Equal(t, 3, c.scriptUploads(script), "the first code, the code change, one dispatch: the values were sent once")
	require.Equal(t, secretShown(secretCanary), c.fetchWorkersDev(script))
}

// A Host stopped after Cloudflare applied the dispatch upload: recovery settles the lease by the
// value-free readback the dispatch recorded; one stopped before it: recovery fails it and never
// sends anything.
func TestRecoveryOfAStoppedCloudflareDeliverySettlesByTheValueFreeReadbackOrFailsWithoutSending(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		hooks   runtimeinput.Hooks
		status  string
		uploads int
	}{
		{"after the upload", runtimeinput.Hooks{AfterDelivery: func() error { panic(crash{}) }}, "settled", 2},
		{"before the upload", runtimeinput.Hooks{AfterDispatchCommit: func() error { panic(crash{}) }}, "failed", 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := setupCFScripts(t, cfScriptsOptions{hooks: tc.hooks})
			p := c.reserveAndPrepare("op-1", "res-api", "cf-worker", "", "prod", "api", secretCanary)
			c.putWorker("prod", "api", tokenA, secretWorkerOn("cf-worker", p.reference)).problem(t, http.StatusInternalServerError, "internal")
			require.Equal(t, "dispatched", c.preparationStatus("op-1"))

			c.advance("2 minutes") // the stopped Host's lease runs out
			c.host.Sweep(context.Background())
			require.Equal(t, tc.status, c.preparationStatus("op-1"))
			require.Equal(t, tc.uploads, c.scriptUploads(c.scriptNameOf("prod", "api")), "recovery never sends the values")
		})
	}
}
