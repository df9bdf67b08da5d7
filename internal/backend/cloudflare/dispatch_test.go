package cloudflare_test

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/cloudflare/cloudflare-go/v6/workers_for_platforms"
	"github.com/stretchr/testify/require"

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
