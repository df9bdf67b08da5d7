package cloudflare_test

import (
	"context"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cloudflare/cloudflare-go/v6/workers"
	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/backend"
	"github.com/takoform/terraform-provider-takoform/internal/backend/cloudflare"
	"github.com/takoform/terraform-provider-takoform/internal/backend/packs"
	"github.com/takoform/terraform-provider-takoform/internal/catalog"
	"github.com/takoform/terraform-provider-takoform/internal/cloudflare/cfstandin"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/workerd/workerdtest"
	"github.com/takoform/terraform-provider-takoform/internal/safedir"
	"github.com/takoform/terraform-provider-takoform/internal/vocab"
	"github.com/takoform/terraform-provider-takoform/internal/workerconf"
)

const (
	cfAccount   = "0123456789abcdef0123456789abcdef"
	cfSubdomain = "acme"
	cfToken     = "cf-test-token-4242424242"
)

type cfFixture struct {
	standin *cfstandin.Server
	mut     backend.Mutator
	sdk     *cloudflare.Services
}

func setupWorkersDev(t *testing.T) cfFixture {
	t.Helper()
	s, err := cfstandin.New(cfstandin.Config{Token: cfToken, AccountID: cfAccount, AccountSubdomain: cfSubdomain, Workerd: workerdtest.Binary(t)})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	private := filepath.Join(t.TempDir(), "private")
	require.NoError(t, safedir.Ensure(private, safedir.Current()))
	require.NoError(t, safedir.WriteFile(private, "cf-token", []byte(cfToken+"\n"), safedir.Current()))
	tokenFile := filepath.Join(private, "cf-token")
	inst := catalog.Installation{Name: "cf", Pack: catalog.PackWorkersDev, AccountSubdomain: cfSubdomain,
		AccountID: cfAccount, APITokenFile: tokenFile, APIBaseURL: s.BaseURL()}
	mut, err := packs.Registry().Mutator(inst)
	require.NoError(t, err)
	sdk, err := cloudflare.New(cloudflare.Options{BaseURL: s.BaseURL(), Token: vocab.NewSecret(cfToken)})
	require.NoError(t, err)
	return cfFixture{standin: s, mut: mut, sdk: sdk}
}

// envWorker answers with its marker and the value of API_KEY, if it has one.
func envWorker(marker string) string {
	return `export default { fetch(req, env) { return new Response("` + marker + `:" + (env.API_KEY ?? "-")); } };`
}

func workerDesired(uid uuid.UUID, name, marker string, secrets ...string) backend.Desired {
	return backend.Desired{Kind: backend.NativeWorker, NativeName: name, DeploymentID: uuid.New(), EffectID: uuid.New(), ResourceUID: uid,
		Bundle:      &backend.Bundle{Modules: map[string]string{"index.js": envWorker(marker)}, MainModule: "index.js", CompatibilityDate: "2025-01-01"},
		SecretNames: secrets}
}

// serve enables the script's workers.dev route (the endpoint's job, not built yet) and fetches it.
func (f cfFixture) serve(t *testing.T, name string) string {
	t.Helper()
	var p workers.ScriptSubdomainNewParams
	p.AccountID.Value, p.AccountID.Present = cfAccount, true
	p.Enabled.Value, p.Enabled.Present = true, true
	_, err := f.sdk.Scripts.Subdomain.New(context.Background(), name, p)
	require.NoError(t, err)
	res, err := f.standin.EdgeClient().Get("https://" + name + "." + cfSubdomain + ".workers.dev/")
	require.NoError(t, err)
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, res.StatusCode, string(body))
	return string(body)
}

// deliver puts a secret on the script as a runtime-input delivery would.
func (f cfFixture) deliver(t *testing.T, name, secret, value string) {
	t.Helper()
	var p workers.ScriptSecretUpdateParams
	p.AccountID.Value, p.AccountID.Present = cfAccount, true
	var b workers.ScriptSecretUpdateParamsBodyWorkersBindingKindSecretText
	b.Name.Value, b.Name.Present = secret, true
	b.Text.Value, b.Text.Present = value, true
	b.Type.Value, b.Type.Present = workers.ScriptSecretUpdateParamsBodyWorkersBindingKindSecretTextTypeSecretText, true
	p.Body = b
	_, err := f.sdk.Scripts.Secrets.Update(context.Background(), name, p)
	require.NoError(t, err)
}

func TestWorkersDevUploadCarriesTheWorkerUIDAndReadsBackItsDeployment(t *testing.T) {
	t.Parallel()
	f := setupWorkersDev(t)
	ctx := context.Background()
	uid := uuid.New()
	d := workerDesired(uid, "api-prod-0123", "v1")
	obs, err := f.mut.Apply(ctx, d)
	require.NoError(t, err)
	require.Equal(t, backend.Observation{Present: true, DeploymentID: d.DeploymentID, WorkerUID: uid.String(), Admitted: true, Ready: true}, obs)
	sc, ok := f.standin.Script("api-prod-0123")
	require.True(t, ok)
	b, _ := sc.Current.Binding(cloudflare.BindingWorkerUID)
	require.Equal(t, uid.String(), b.Text)
	require.Equal(t, "index.js", sc.Current.MainModule)
	require.Equal(t, "2025-01-01", sc.Current.CompatibilityDate)
	require.Equal(t, "v1:-", f.serve(t, "api-prod-0123"))
}

func TestACodeChangeKeepsDeliveredSecretsByInheritAndDropsOnesNoLongerRequired(t *testing.T) {
	t.Parallel()
	f := setupWorkersDev(t)
	ctx := context.Background()
	uid := uuid.New()
	_, err := f.mut.Apply(ctx, workerDesired(uid, "keep-0123", "v1", "API_KEY"))
	require.NoError(t, err)
	f.deliver(t, "keep-0123", "API_KEY", "s3cr3t-value")
	f.deliver(t, "keep-0123", "STALE", "old-value")
	require.Equal(t, "v1:s3cr3t-value", f.serve(t, "keep-0123"))

	before := len(f.standin.Requests())
	_, err = f.mut.Apply(ctx, workerDesired(uid, "keep-0123", "v2", "API_KEY"))
	require.NoError(t, err)
	require.Equal(t, "v2:s3cr3t-value", f.serve(t, "keep-0123"), "the new code runs with the delivered secret, not resent")
	sc, _ := f.standin.Script("keep-0123")
	_, stale := sc.Current.Binding("STALE")
	require.False(t, stale, "a secret the worker does not require is not inherited")
	for _, r := range f.standin.Requests()[before:] {
		require.NotContains(t, r.Path, "/secrets", "no secret was written by the code change")
	}

	_, err = f.mut.Apply(ctx, workerDesired(uid, "keep-0123", "v3"))
	require.NoError(t, err)
	require.Equal(t, "v3:-", f.serve(t, "keep-0123"), "a worker that requires no secrets keeps none")
}

func TestAScriptHeldByAnotherWorkerUIDIsNeitherOverwrittenNorDeleted(t *testing.T) {
	t.Parallel()
	f := setupWorkersDev(t)
	ctx := context.Background()
	holder := workerDesired(uuid.New(), "held-0123", "holder")
	_, err := f.mut.Apply(ctx, holder)
	require.NoError(t, err)

	_, err = f.mut.Apply(ctx, workerDesired(uuid.New(), "held-0123", "intruder"))
	require.ErrorIs(t, err, backend.ErrScriptHeld)
	require.NoError(t, f.mut.Delete(ctx, workerDesired(uuid.New(), "held-0123", "late")), "a delete of another UID's script leaves it alone")
	sc, ok := f.standin.Script("held-0123")
	require.True(t, ok)
	require.Equal(t, 1, sc.Uploads)
	obs, err := f.mut.Observe(ctx, backend.NativeWorker, "held-0123")
	require.NoError(t, err)
	require.Equal(t, holder.DeploymentID, obs.DeploymentID)

	require.NoError(t, f.mut.Delete(ctx, holder))
	obs, err = f.mut.Observe(ctx, backend.NativeWorker, "held-0123")
	require.NoError(t, err)
	require.False(t, obs.Present, "deleted: the readback answers 10007")
	require.Empty(t, f.standin.ScriptNames(""))
	for _, r := range f.standin.Requests() {
		require.NotContains(t, r.Path, "force=true")
	}
}

func TestCloudflareErrorsMapToTheBackendsErrors(t *testing.T) {
	t.Parallel()
	f := setupWorkersDev(t)
	ctx := context.Background()
	bad := workerDesired(uuid.New(), "broken-0123", "x")
	bad.Bundle.Modules["index.js"] = "export default {"
	_, err := f.mut.Apply(ctx, bad)
	var refused *backend.RefusedError
	require.ErrorAs(t, err, &refused)
	require.NotEmpty(t, refused.Message)
	require.Empty(t, f.standin.ScriptNames(""))

	_, err = f.mut.Apply(ctx, workerDesired(uuid.New(), "ep-0123", "x"))
	require.NoError(t, err)
	// The endpoint half: the script's workers.dev route, read back enabled.
	obs, err := f.mut.Apply(ctx, backend.Desired{Kind: backend.NativeRoute, NativeName: "ep-0123.acme.workers.dev", ScriptName: "ep-0123"})
	require.NoError(t, err)
	require.True(t, obs.Present && obs.Ready && obs.AnyDeployment, "%+v", obs)
	_, err = f.mut.Apply(ctx, backend.Desired{Kind: backend.NativeRoute, NativeName: "ep-0123.elsewhere.workers.dev", ScriptName: "ep-0123"})
	require.Error(t, err, "a hostname that is not the script's workers.dev name is refused")
	require.True(t, backend.Supports(f.mut, backend.NativeRoute))
	require.True(t, backend.Supports(f.mut, backend.NativeWorker))
}

// A worker's vars, JSON vars and compatibility flags reach Cloudflare as plain_text and json
// bindings and compatibility_flags (issue 17): the worker running in the stand-in reads them, and
// needs the flag for the module it imports.
func TestWorkersDevUploadCarriesVarsJSONVarsAndFlags(t *testing.T) {
	t.Parallel()
	f := setupWorkersDev(t)
	d := workerDesired(uuid.New(), "conf-prod-0123", "v1")
	d.Bundle.Modules = map[string]string{"index.js": `import { Buffer } from "node:buffer";
export default { fetch(req, env) { return new Response([env.LOG_LEVEL, env.LIMITS.rps, Buffer.from("ok").toString("hex")].join(" ")); } };`}
	d.Bundle.Settings = workerconf.Settings{Vars: map[string]string{"LOG_LEVEL": "debug"}, JSONVars: map[string]string{"LIMITS": `{"rps": 5}`},
		CompatibilityFlags: []string{"nodejs_compat"}}
	_, err := f.mut.Apply(context.Background(), d)
	require.NoError(t, err)
	sc, ok := f.standin.Script("conf-prod-0123")
	require.True(t, ok)
	b, ok := sc.Current.Binding("LOG_LEVEL")
	require.True(t, ok)
	require.Equal(t, "plain_text", b.Type)
	b, ok = sc.Current.Binding("LIMITS")
	require.True(t, ok)
	require.Equal(t, "json", b.Type)
	require.Equal(t, "debug 5 6f6b", f.serve(t, "conf-prod-0123"))
}

// setupWFPManaged is a wfp-managed installation on the stand-in, its scripts in dispatch
// namespace ns (which the stand-in has only when exists).
func setupWFPManaged(t *testing.T, exists bool) cfFixture {
	t.Helper()
	// The routing KV namespace holds the scripts' entries (SPEC 8), deleted with them.
	cfg := cfstandin.Config{Token: cfToken, AccountID: cfAccount, Workerd: workerdtest.Binary(t), KVNamespaces: []string{"kv"}}
	if exists {
		cfg.DispatchNamespaces = []string{"tenants"}
	}
	s, err := cfstandin.New(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	private := filepath.Join(t.TempDir(), "private")
	require.NoError(t, safedir.Ensure(private, safedir.Current()))
	require.NoError(t, safedir.WriteFile(private, "cf-token", []byte(cfToken+"\n"), safedir.Current()))
	inst := catalog.Installation{Name: "wfp", Pack: catalog.PackWFPManaged, BaseDomain: "apps.example.test", AccountID: cfAccount,
		APITokenFile: filepath.Join(private, "cf-token"), APIBaseURL: s.BaseURL(), DispatchNamespace: "tenants",
		DispatchWorkerName: "dispatch", RoutingKVNamespaceID: "kv"}
	mut, err := packs.Registry().Mutator(inst)
	require.NoError(t, err)
	return cfFixture{standin: s, mut: mut}
}

func TestWFPManagedUploadsIntoTheDispatchNamespaceAndNeverAmongTheAccountsScripts(t *testing.T) {
	t.Parallel()
	f := setupWFPManaged(t, true)
	ctx := context.Background()
	uid := uuid.New()
	d := workerDesired(uid, "shop-prod-0123", "v1")
	obs, err := f.mut.Apply(ctx, d)
	require.NoError(t, err)
	require.Equal(t, d.DeploymentID, obs.DeploymentID)
	require.Empty(t, f.standin.ScriptNames(""))
	sc, ok := f.standin.NamespaceScript("tenants", "shop-prod-0123")
	require.True(t, ok)
	b, _ := sc.Current.Binding(cloudflare.BindingWorkerUID)
	require.Equal(t, uid.String(), b.Text)

	// A late delete from another worker UID leaves it; its own delete removes it.
	late := d
	late.ResourceUID = uuid.New()
	require.NoError(t, f.mut.Delete(ctx, late))
	require.Equal(t, []string{"shop-prod-0123"}, f.standin.ScriptNames("tenants"))
	require.NoError(t, f.mut.Delete(ctx, d))
	require.Empty(t, f.standin.ScriptNames("tenants"))
	require.True(t, backend.Supports(f.mut, backend.NativeRoute), "one mutator serves its workers and their routes")
}

func TestWFPManagedRefusesAnAccountWithoutItsDispatchNamespaceAsPlacementDrift(t *testing.T) {
	t.Parallel()
	f := setupWFPManaged(t, false)
	_, err := f.mut.Apply(context.Background(), workerDesired(uuid.New(), "shop-prod-0123", "v1"))
	require.ErrorIs(t, err, backend.ErrPlacementDrift)
	require.Contains(t, err.Error(), `dispatch namespace "tenants"`)
}

// The first call on an installation builds its SDK services and checks its placement over the
// network; a caller that comes meanwhile waits for that, but only as long as its own context
// allows: a stalled first call does not hold it past its deadline. The stalled call's answer is
// then kept for everyone (one placement check).
func TestAStalledFirstCallDoesNotHoldAnotherCallerPastItsDeadline(t *testing.T) {
	t.Parallel()
	f := setupWorkersDev(t)
	require.NoError(t, f.standin.Inject(cfstandin.Fault{Kind: cfstandin.FaultHold, Method: http.MethodGet, PathContains: "/workers/subdomain"}))
	t.Cleanup(f.standin.Release)
	first := make(chan error, 1)
	go func() {
		_, err := f.mut.Observe(context.Background(), backend.NativeWorker, "api")
		first <- err
	}()
	require.Eventually(t, func() bool { return f.standin.Held() == 1 }, 10*time.Second, 5*time.Millisecond, "the first call is in its placement check")

	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := f.mut.Observe(ctx, backend.NativeWorker, "api")
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.Less(t, time.Since(start), 1500*time.Millisecond, "the second caller returned at its deadline")

	f.standin.Release()
	select {
	case err := <-first:
		require.NoError(t, err, "the stalled call completes")
	case <-time.After(10 * time.Second):
		t.Fatal("the stalled call never completed")
	}
	_, err = f.mut.Observe(context.Background(), backend.NativeWorker, "api")
	require.NoError(t, err)
	checks := 0
	for _, r := range f.standin.Requests() {
		if r.Method == http.MethodGet && strings.HasSuffix(r.Path, "/workers/subdomain") {
			checks++
		}
	}
	require.Equal(t, 1, checks, "one placement check served every caller")
}

// A first call that gives up (its context ends) during the placement check does not fail the
// callers that waited for it: the next one checks again itself.
func TestACallerWaitingOnAFirstCallThatGaveUpChecksAgainItself(t *testing.T) {
	t.Parallel()
	f := setupWorkersDev(t)
	require.NoError(t, f.standin.Inject(cfstandin.Fault{Kind: cfstandin.FaultHold, Method: http.MethodGet, PathContains: "/workers/subdomain"}))
	t.Cleanup(f.standin.Release)
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	first := make(chan error, 1)
	go func() {
		_, err := f.mut.Observe(ctx, backend.NativeWorker, "api")
		first <- err
	}()
	require.Eventually(t, func() bool { return f.standin.Held() == 1 }, 10*time.Second, 5*time.Millisecond, "the first call is in its placement check")
	_, err := f.mut.Observe(context.Background(), backend.NativeWorker, "api")
	require.NoError(t, err, "the waiting caller checked again and got through")
	require.Error(t, <-first, "the first call gave up at its deadline")
}
