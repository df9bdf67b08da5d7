package runtime_test

import (
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/runtime/adminapi"
)

// BenchmarkEdgeBesideAnotherTenantsDeploys measures organization A's requests through the edge
// while organization B deploys new code three times, on a node that also holds
// TAKOFORM_BENCH_SCRIPTS (default 30) other scripts of 512 KiB each: what other tenants hold and
// do should cost A's requests nothing (make bench-tenants; -benchtime 1x).
func BenchmarkEdgeBesideAnotherTenantsDeploys(b *testing.B) {
	x := setupTenantBench(b)
	pad := "\n// " + strings.Repeat("padding ", 512<<10/8)
	put := func(name, org string, gen int64) {
		source := fmt.Sprintf("export default { fetch() { return new Response(%q) } };", fmt.Sprintf("%s %d", name, gen)) + pad
		_, err := x.admin.PutScript(x.ctx, name, adminapi.ScriptPut{
			EffectID: fmt.Sprintf("script-%s-%d", name, gen), WorkerUID: "uid-" + name, DeploymentID: fmt.Sprintf("dep-%s-%d", name, gen), Generation: gen,
			Labels:  adminapi.Labels{Organization: org, Space: "prod", Worker: name},
			Modules: map[string]string{"main.js": source}, MainModule: "main.js", CompatibilityDate: "2024-09-23", BundleDigest: "sha256:" + sha(source),
		})
		require.NoError(b, err)
	}
	settled := func(name string, gen int64) {
		require.Eventually(b, func() bool {
			st, err := x.admin.GetScript(x.ctx, name)
			return err == nil && st.Ready && st.Incarnation.Generation == gen && st.Candidate == nil
		}, 2*time.Minute, 20*time.Millisecond, "%s never served generation %d alone", name, gen)
	}
	others := envInt("TAKOFORM_BENCH_SCRIPTS", 30)
	for i := range others {
		put(fmt.Sprintf("held-%02d", i), fmt.Sprintf("org-h%02d", i), 1)
	}
	put("deployer", "org-b", 1)
	for i := range others {
		settled(fmt.Sprintf("held-%02d", i), 1)
	}
	settled("deployer", 1)

	for b.Loop() {
		stop, done := make(chan struct{}), make(chan []time.Duration)
		failed := 0
		req, err := http.NewRequest(http.MethodGet, x.edge, nil)
		require.NoError(b, err)
		req.Host = hostOf("victim")
		go func() {
			var ds []time.Duration
			for {
				select {
				case <-stop:
					done <- ds
					return
				default:
				}
				start := time.Now()
				resp, err := x.victim.Do(req)
				if err == nil && resp.StatusCode == http.StatusOK {
					_, _ = io.Copy(io.Discard, resp.Body)
					ds = append(ds, time.Since(start))
				}
				if err == nil {
					resp.Body.Close()
				} else {
					failed++
				}
			}
		}()
		start := time.Now()
		for gen := int64(2); gen <= 4; gen++ {
			put("deployer", "org-b", gen)
			settled("deployer", gen)
		}
		deploys := time.Since(start)
		close(stop)
		ds := <-done
		require.Zero(b, failed, "requests of organization A failed")
		require.NotEmpty(b, ds)
		slices.Sort(ds)
		p := func(q float64) time.Duration { return ds[int(q*float64(len(ds)-1))] }
		b.ReportMetric(float64(p(0.5).Microseconds())/1000, "p50-ms")
		b.ReportMetric(float64(p(0.99).Microseconds())/1000, "p99-ms")
		b.ReportMetric(float64(ds[len(ds)-1].Microseconds())/1000, "max-ms")
		b.Logf("beside %d scripts of 512 KiB: three deploys of another organization took %v; organization A's %d requests: p50 %v, p99 %v, max %v",
			others, deploys.Round(time.Millisecond), len(ds), p(0.5), p(0.99), ds[len(ds)-1])
	}
}
