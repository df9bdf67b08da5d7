package runtime_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/backend/selfhost"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/adminapi"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/runtimetest"
	"github.com/takoform/terraform-provider-takoform/internal/workerconf"
)

// BenchmarkServiceBindingCall measures what a service binding call costs: closed-loop requests
// to a trivial worker at its own URL, and to a worker that answers with what its binding to the
// same trivial worker answered (both of one organization, so isolates of one process).
func BenchmarkServiceBindingCall(b *testing.B) {
	h := runtimetest.Start(b)
	admin, err := selfhost.New(h.Info.AdminURL, h.Info.TokenFile)
	require.NoError(b, err)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	b.Cleanup(cancel)
	deploy := func(name, uid, source string, bindings map[string]string) {
		_, err := admin.PutScript(ctx, name, adminapi.ScriptPut{
			EffectID: "script-" + name, WorkerUID: uid, DeploymentID: "dep-" + name, Generation: 1,
			Labels:     adminapi.Labels{Organization: "org-a", Space: "prod", Worker: name},
			Modules:    map[string]string{"main.js": source},
			MainModule: "main.js", CompatibilityDate: "2024-09-23", BundleDigest: "sha256:" + sha(source),
			Settings: workerconf.Settings{ServiceBindings: bindings},
		})
		require.NoError(b, err)
		_, err = admin.PutRoute(ctx, hostOf(name), adminapi.RoutePut{EffectID: "route-" + name, ScriptName: name, EndpointUID: "ep-" + name, DeploymentID: "dep-" + name})
		require.NoError(b, err)
		require.Eventually(b, func() bool {
			st, err := admin.GetScript(ctx, name)
			return err == nil && st.Ready
		}, time.Minute, 20*time.Millisecond, "%s never became Ready", name)
	}
	deploy("hello", calleeUID, `export default { fetch() { return new Response("hello"); } };`, nil)
	deploy("front", callerUID, `export default { async fetch(req, env) { return new Response(await (await env.HELLO.fetch("http://hello.internal/")).text()); } };`,
		map[string]string{"HELLO": calleeUID})

	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}, Timeout: 30 * time.Second}
	rate := func(name string, d time.Duration) (float64, int64) {
		var ok, failed atomic.Int64
		deadline := time.Now().Add(d)
		var wg sync.WaitGroup
		for range 8 {
			wg.Go(func() {
				for time.Now().Before(deadline) {
					req, _ := http.NewRequest(http.MethodGet, "http://"+h.Info.EdgeAddr+"/", nil)
					req.Host = hostOf(name)
					resp, err := client.Do(req)
					if err != nil {
						failed.Add(1)
						continue
					}
					body, err := io.ReadAll(resp.Body)
					resp.Body.Close()
					if err != nil || resp.StatusCode != http.StatusOK || string(body) != "hello" {
						failed.Add(1)
						continue
					}
					ok.Add(1)
				}
			})
		}
		wg.Wait()
		return float64(ok.Load()) / d.Seconds(), failed.Load()
	}
	rate("front", 2*time.Second) // warm both
	window := tenantWindow()
	for b.Loop() {
		direct, f1 := rate("hello", window)
		bound, f2 := rate("front", window)
		require.Zero(b, f1+f2, "failed requests")
		b.ReportMetric(direct, "direct-req/s")
		b.ReportMetric(bound, "binding-req/s")
		b.ReportMetric(bound/direct, "ratio")
		fmt.Printf("direct %.0f req/s, through a binding %.0f req/s (%.2fx)\n", direct, bound, bound/direct)
	}
}
