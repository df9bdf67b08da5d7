package cloudflare_test

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/cloudflare/cloudflare-go/v6/workers_for_platforms"
	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/backend/cloudflare"
	"github.com/takoform/terraform-provider-takoform/internal/cloudflare/cfstandin"
)

func TestDispatchNamespaceUploadServedThroughTheRoutingKVEntry(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	ctx := context.Background()
	const script, host = "tsw-tenant", "tsw-abc123." + baseDomain

	res, err := f.sdk.DispatchNamespaces.Scripts.Update(ctx, dispatchNS, script, firstUpload("wfp").DispatchScriptParams(account))
	require.NoError(t, err)
	require.Equal(t, script, res.ID)
	_, inAccount := f.standin.Script(script)
	require.False(t, inAccount, "the upload went into the namespace, not the account's scripts")

	got, err := f.sdk.DispatchNamespaces.Scripts.Get(ctx, dispatchNS, script, params[workers_for_platforms.DispatchNamespaceScriptGetParams]())
	require.NoError(t, err)
	require.Equal(t, dispatchNS, got.DispatchNamespace)
	require.Equal(t, script, got.Script.ID)

	settings, err := f.sdk.DispatchNamespaces.Scripts.Settings.Get(ctx, dispatchNS, script, params[workers_for_platforms.DispatchNamespaceScriptSettingGetParams]())
	require.NoError(t, err)
	require.NotContains(t, settings.JSON.RawJSON(), "s3cr3t-value")
	names := map[string]string{}
	for _, b := range settings.Bindings {
		names[b.Name] = string(b.Type)
	}
	require.Equal(t, "secret_text", names["API_KEY"])

	// No routing entry yet: the dispatch path answers a 404 problem.
	status, _ := fetch(t, f, "https://"+host+"/", nil)
	require.Equal(t, http.StatusNotFound, status)

	entry, err := json.Marshal(cfstandin.RouteEntry{ScriptName: script, EndpointUID: "ep-1", CPUMs: 50})
	require.NoError(t, err)
	p := params[kvUpdateParams]()
	p.Value.Value, p.Value.Present = kvString(string(entry)), true
	_, err = f.sdk.KVValues.Update(ctx, routingKV, host, p)
	require.NoError(t, err)

	status, _ = fetch(t, f, "https://"+host+"/", nil)
	require.Equal(t, http.StatusNotFound, status, "the edge has not seen the new entry yet")
	f.clock.Advance(61 * time.Second)

	a := fetchAnswer(t, f, "https://"+host+"/")
	require.Equal(t, "wfp", a.Marker)
	require.Equal(t, "s3cr3t-value", *a.APIKey)

	// The probe header is answered by the lookup alone: no user code runs.
	status, body := fetch(t, f, "https://"+host+"/", http.Header{cfstandin.DispatchProbeHeader: {"1"}})
	require.Equal(t, http.StatusOK, status)
	var probe map[string]any
	require.NoError(t, json.Unmarshal(body, &probe))
	require.Equal(t, "ep-1", probe["endpointUid"])
	require.NotContains(t, probe, "marker")

	// Deleting the entry: the API reads 404 at once, the edge keeps routing for the stale window.
	_, err = f.sdk.KVValues.Delete(ctx, routingKV, host, params[kvDeleteParams]())
	require.NoError(t, err)
	a = fetchAnswer(t, f, "https://"+host+"/")
	require.Equal(t, "wfp", a.Marker, "stale KV keeps the route alive")
	f.clock.Advance(61 * time.Second)
	status, _ = fetch(t, f, "https://"+host+"/", nil)
	require.Equal(t, http.StatusNotFound, status)

	_, err = f.sdk.DispatchNamespaces.Scripts.Delete(ctx, dispatchNS, script, params[workers_for_platforms.DispatchNamespaceScriptDeleteParams]())
	require.NoError(t, err)
	_, err = f.sdk.DispatchNamespaces.Scripts.Get(ctx, dispatchNS, script, params[workers_for_platforms.DispatchNamespaceScriptGetParams]())
	require.True(t, apiError(t, err).IsNotFound())
	require.Empty(t, f.standin.ScriptNames(dispatchNS))

	_, err = f.sdk.DispatchNamespaces.Scripts.Update(ctx, "no-such-namespace", script, firstUpload("wfp").DispatchScriptParams(account))
	require.True(t, apiError(t, err).IsNotFound())
}

// Cloudflare resolves a namespace script's `service` binding at account scope only: a sibling in
// the namespace is refused (10143), an account script's entrypoint is bound with its props.
func TestANamespaceScriptsServiceBindingResolvesAccountScriptsOnly(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	ctx := context.Background()
	_, err := f.sdk.DispatchNamespaces.Scripts.Update(ctx, dispatchNS, "sibling", firstUpload("sibling").DispatchScriptParams(account))
	require.NoError(t, err)

	caller := firstUpload("caller")
	caller.Services = map[string]string{"SIB": "sibling"}
	_, err = f.sdk.DispatchNamespaces.Scripts.Update(ctx, dispatchNS, "caller", caller.DispatchScriptParams(account))
	require.True(t, apiError(t, err).HasCode(cfstandin.CodeServiceBindingUnresolved), "a sibling is not an account script")
	_, ok := f.standin.NamespaceScript(dispatchNS, "caller")
	require.False(t, ok, "nothing landed")

	target := cloudflare.Upload{MainModule: "t.js", CompatibilityDate: "2025-01-01", Modules: []cloudflare.Module{{Name: "t.js", Content: []byte(
		`import { WorkerEntrypoint } from "cloudflare:workers";
export class Binding extends WorkerEntrypoint { fetch() { return Response.json(this.ctx.props); } }
export default { fetch() { return new Response("account"); } };`)}}}
	require.NoError(t, cloudflare.Account{ID: account}.Upload(ctx, f.sdk, "account-target", target))
	caller = firstUpload("caller")
	caller.Entrypoints = map[string]cloudflare.EntrypointBinding{"SIB": {Service: "account-target", Entrypoint: "Binding", Props: map[string]string{"calleeScript": "sibling"}}}
	_, err = f.sdk.DispatchNamespaces.Scripts.Update(ctx, dispatchNS, "caller", caller.DispatchScriptParams(account))
	require.NoError(t, err)
	sc, ok := f.standin.NamespaceScript(dispatchNS, "caller")
	require.True(t, ok)
	var got cfstandin.Binding
	for _, b := range sc.Current.Bindings {
		if b.Name == "SIB" {
			got = b
		}
	}
	require.Equal(t, "account-target", got.Service)
	require.Equal(t, "Binding", got.Entrypoint)
	require.JSONEq(t, `{"calleeScript":"sibling"}`, string(got.Props))
}
