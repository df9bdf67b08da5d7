package main_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/cloudflare/cloudflare-go/v6/kv"
	"github.com/cloudflare/cloudflare-go/v6/shared"
	"github.com/cloudflare/cloudflare-go/v6/workers"
	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/backend/cloudflare"
	"github.com/takoform/terraform-provider-takoform/internal/backend/cloudflare/dispatch"
	"github.com/takoform/terraform-provider-takoform/internal/cloudflare/cfstandin"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/workerd/workerdtest"
	"github.com/takoform/terraform-provider-takoform/internal/safedir"
	"github.com/takoform/terraform-provider-takoform/internal/vocab"
)

const (
	dispatchAccount = "0123456789abcdef0123456789abcdef"
	dispatchToken   = "cf-dispatch-canary-token-5eed"
	dispatchKV      = "5e1f2ac74b498b48028cb68387c421e2"
	dispatchNS      = "tenants"
	dispatchName    = "takoform-dispatch"
)

// dispatchCatalog writes a catalog file with a wfp-managed installation "wfp" (and a workers-dev
// one, "wd") on the stand-in, whose token file holds token, and returns its path.
func dispatchCatalog(t *testing.T, s *cfstandin.Server, token string, propagation int) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "conf")
	require.NoError(t, safedir.Ensure(dir, safedir.Current()))
	require.NoError(t, safedir.WriteFile(dir, "cf-token", []byte(token+"\n"), safedir.Current()))
	tokenFile := filepath.Join(dir, "cf-token")
	body, err := json.Marshal(map[string]any{
		"installations": []any{
			map[string]any{"name": "wfp", "pack": "wfp-managed", "baseDomain": "apps.example.com", "dispatchNamespace": dispatchNS,
				"dispatchWorkerName": dispatchName, "routingKvNamespaceId": dispatchKV, "accountId": dispatchAccount,
				"apiTokenFile": tokenFile, "apiBaseUrl": s.BaseURL(), "routePropagationSeconds": propagation},
			map[string]any{"name": "wd", "pack": "workers-dev", "accountSubdomain": "acme", "accountId": dispatchAccount,
				"apiTokenFile": tokenFile, "apiBaseUrl": s.BaseURL()},
		},
		"offerings": []any{
			map[string]any{"id": "wfp-worker", "kind": "module-worker", "installation": "wfp", "soldTo": []string{"*"}},
		},
	})
	require.NoError(t, err)
	path := filepath.Join(dir, "catalog.json")
	require.NoError(t, os.WriteFile(path, body, 0o600))
	return path
}

func dispatchStandin(t *testing.T) *cfstandin.Server {
	t.Helper()
	s, err := cfstandin.New(cfstandin.Config{Token: dispatchToken, AccountID: dispatchAccount, AccountSubdomain: "acme",
		Workerd: workerdtest.Binary(t), DispatchNamespaces: []string{dispatchNS}, KVNamespaces: []string{dispatchKV}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func TestInstallDispatchUploadsTheDispatchWorkerWithItsBindingsOnceAndItRoutes(t *testing.T) {
	t.Parallel()
	s := dispatchStandin(t)
	config := dispatchCatalog(t, s, dispatchToken, 90)

	out := run(t, "", "cloudflare", "install-dispatch", "--installation", "wfp", "--config", config)
	require.Contains(t, out, "installation wfp: dispatch worker "+dispatchName+" created")
	require.NotContains(t, out, dispatchToken)
	sc, ok := s.Script(dispatchName)
	require.True(t, ok, "the dispatch worker is an account script")
	routes, _ := sc.Current.Binding(dispatch.RoutesBinding)
	require.Equal(t, cfstandin.Binding{Name: dispatch.RoutesBinding, Type: "kv_namespace", Namespace: dispatchKV}, routes)
	dispatcher, _ := sc.Current.Binding(dispatch.DispatcherBinding)
	require.Equal(t, cfstandin.Binding{Name: dispatch.DispatcherBinding, Type: "dispatch_namespace", Namespace: dispatchNS}, dispatcher)
	ttl, _ := sc.Current.Binding(dispatch.CacheTTLBinding)
	require.Equal(t, "60", ttl.Text)
	contract, _ := sc.Current.Binding(dispatch.ContractBinding)
	require.Equal(t, strconv.Itoa(dispatch.Contract), contract.Text, "what a caller's binding upload reads back first")
	require.Equal(t, string(dispatch.Source), string(sc.Current.Modules[0].Content))

	// Idempotent: a second run finds it up to date and uploads nothing.
	out = run(t, "", "cloudflare", "install-dispatch", "--installation", "wfp", "--config", config, "--output", "json")
	var done cloudflare.DispatchInstall
	require.NoError(t, json.Unmarshal([]byte(out), &done))
	require.Equal(t, "unchanged", done.Action)
	puts := 0
	for _, r := range s.Requests() {
		if r.Method == http.MethodPut && strings.HasSuffix(r.Path, "/workers/scripts/"+dispatchName) {
			puts++
		}
	}
	require.Equal(t, 1, puts)

	// What was installed really routes: a tenant script in the namespace, a routing entry for the
	// dispatch worker's own workers.dev name, and a request through it reaches the tenant.
	ctx := context.Background()
	sdk, err := cloudflare.New(cloudflare.Options{BaseURL: s.BaseURL(), Token: vocab.NewSecret(dispatchToken)})
	require.NoError(t, err)
	tenant := cloudflare.Upload{MainModule: "index.js", CompatibilityDate: "2025-01-01",
		Modules: []cloudflare.Module{{Name: "index.js", Content: []byte(`export default { fetch() { return new Response("tenant-answer") } }`)}}}
	_, err = sdk.DispatchNamespaces.Scripts.Update(ctx, dispatchNS, "tenant-a", tenant.DispatchScriptParams(dispatchAccount))
	require.NoError(t, err)
	host := dispatchName + ".acme.workers.dev"
	entry, err := json.Marshal(dispatch.RouteEntry{ScriptName: "tenant-a", EndpointUID: "ep-1"})
	require.NoError(t, err)
	var put kv.NamespaceValueUpdateParams
	put.AccountID.Value, put.AccountID.Present = dispatchAccount, true
	put.Value.Value, put.Value.Present = shared.UnionString(string(entry)), true
	_, err = sdk.KVValues.Update(ctx, dispatchKV, host, put)
	require.NoError(t, err)
	var enable workers.ScriptSubdomainNewParams
	enable.AccountID.Value, enable.AccountID.Present = dispatchAccount, true
	enable.Enabled.Value, enable.Enabled.Present = true, true
	_, err = sdk.Scripts.Subdomain.New(ctx, dispatchName, enable)
	require.NoError(t, err)
	res, err := s.EdgeClient().Get("https://" + host + "/")
	require.NoError(t, err)
	body, _ := io.ReadAll(res.Body)
	_ = res.Body.Close()
	require.Equal(t, http.StatusOK, res.StatusCode, "body: %s", body)
	require.Equal(t, "tenant-answer", string(body))

	// An older dispatch worker is updated in place.
	stale := cloudflare.Upload{MainModule: dispatch.MainModule, CompatibilityDate: dispatch.CompatibilityDate,
		Modules: []cloudflare.Module{{Name: dispatch.MainModule, Content: []byte(`export default { fetch() { return new Response("old") } }`)}}}
	_, err = sdk.Scripts.Update(ctx, dispatchName, stale.ScriptParams(dispatchAccount))
	require.NoError(t, err)
	out = run(t, "", "cloudflare", "install-dispatch", "--installation", "wfp", "--config", config)
	require.Contains(t, out, "dispatch worker "+dispatchName+" updated")
	sc, _ = s.Script(dispatchName)
	require.Equal(t, string(dispatch.Source), string(sc.Current.Modules[0].Content))
}

func TestInstallDispatchErrorsNameTheInstallationNeverTheToken(t *testing.T) {
	t.Parallel()
	s := dispatchStandin(t)
	const wrong = "cf-wrong-dispatch-token-canary-4242"
	config := dispatchCatalog(t, s, wrong, 90)
	_, errOut, err := runRaw("", "cloudflare", "install-dispatch", "--installation", "wfp", "--config", config)
	require.Error(t, err)
	require.Contains(t, errOut, "installation wfp")
	require.NotContains(t, errOut, wrong)
	require.True(t, s.SawCredential(wrong))

	_, errOut, err = runRaw("", "cloudflare", "install-dispatch", "--installation", "wd", "--config", config)
	require.Error(t, err)
	require.Contains(t, errOut, "only wfp-managed ones have a dispatch worker")

	// A tenant's worker that happens to hold the name is never overwritten.
	sdk, err := cloudflare.New(cloudflare.Options{BaseURL: s.BaseURL(), Token: vocab.NewSecret(dispatchToken)})
	require.NoError(t, err)
	tenant := cloudflare.Upload{MainModule: "index.js", CompatibilityDate: "2025-01-01", PlainText: map[string]string{cloudflare.BindingWorkerUID: "7d1c2f0e-0000-4000-8000-000000000001"},
		Modules: []cloudflare.Module{{Name: "index.js", Content: []byte(`export default { fetch() { return new Response("tenant") } }`)}}}
	_, err = sdk.Scripts.Update(context.Background(), dispatchName, tenant.ScriptParams(dispatchAccount))
	require.NoError(t, err)
	good := dispatchCatalog(t, s, dispatchToken, 90)
	_, errOut, err = runRaw("", "cloudflare", "install-dispatch", "--installation", "wfp", "--config", good)
	require.Error(t, err)
	require.Contains(t, errOut, "is a tenant's worker")
	sc, _ := s.Script(dispatchName)
	require.Equal(t, 1, sc.Uploads, "the tenant's script is untouched")
	var del workers.ScriptDeleteParams
	del.AccountID.Value, del.AccountID.Present = dispatchAccount, true
	_, err = sdk.Scripts.Delete(context.Background(), dispatchName, del)
	require.NoError(t, err)

	short := dispatchCatalog(t, s, dispatchToken, 30)
	_, errOut, err = runRaw("", "cloudflare", "install-dispatch", "--installation", "wfp", "--config", short)
	require.Error(t, err)
	require.Contains(t, errOut, "routePropagationSeconds (30) is shorter than the dispatch worker's routing cache")
	require.Empty(t, s.ScriptNames(""), "nothing was uploaded")
}

// The check after the upload is the same as the one before it: a dispatch worker that differs
// only in its routing cache's TTL and whose upload did not land is not reported updated.
func TestInstallDispatchFailsWhenItsUploadDidNotLandEvenIfOnlyTheCacheTTLDiffered(t *testing.T) {
	t.Parallel()
	s := dispatchStandin(t)
	config := dispatchCatalog(t, s, dispatchToken, 90)
	require.Contains(t, run(t, "", "cloudflare", "install-dispatch", "--installation", "wfp", "--config", config), "created")

	sc, _ := s.Script(dispatchName)
	source, ok := sc.Current.Binding(cloudflare.BindingDispatchSource)
	require.True(t, ok)
	sdk, err := cloudflare.New(cloudflare.Options{BaseURL: s.BaseURL(), Token: vocab.NewSecret(dispatchToken)})
	require.NoError(t, err)
	shorter := cloudflare.Upload{MainModule: dispatch.MainModule, CompatibilityDate: dispatch.CompatibilityDate,
		Modules:            []cloudflare.Module{{Name: dispatch.MainModule, Content: dispatch.Source}},
		PlainText:          map[string]string{dispatch.CacheTTLBinding: "30", cloudflare.BindingDispatchSource: source.Text},
		KVNamespaces:       map[string]string{dispatch.RoutesBinding: dispatchKV},
		DispatchNamespaces: map[string]string{dispatch.DispatcherBinding: dispatchNS}}
	require.NoError(t, cloudflare.Account{ID: dispatchAccount}.Upload(context.Background(), sdk, dispatchName, shorter))

	require.NoError(t, s.Inject(cfstandin.Fault{Kind: cfstandin.FaultServerError, Method: http.MethodPut, PathContains: "/workers/scripts/" + dispatchName}))
	out, errOut, err := runRaw("", "cloudflare", "install-dispatch", "--installation", "wfp", "--config", config)
	require.Error(t, err, "stdout: %s", out)
	require.Contains(t, errOut, "installation wfp")
	sc, _ = s.Script(dispatchName)
	ttl, _ := sc.Current.Binding(dispatch.CacheTTLBinding)
	require.Equal(t, "30", ttl.Text, "the failed upload changed nothing")

	require.Contains(t, run(t, "", "cloudflare", "install-dispatch", "--installation", "wfp", "--config", config), "updated")
	sc, _ = s.Script(dispatchName)
	ttl, _ = sc.Current.Binding(dispatch.CacheTTLBinding)
	require.Equal(t, "60", ttl.Text)
}
