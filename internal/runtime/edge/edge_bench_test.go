package edge_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/backend/selfhost"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/adminapi"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/edge"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/runtimetest"
)

func TestHostname(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"Hello.Workers.Localhost:8787": "hello.workers.localhost",
		"hello.workers.localhost.":     "hello.workers.localhost",
		"hello.workers.localhost":      "hello.workers.localhost",
		"[::1]:8787":                   "::1",
	} {
		require.Equal(t, want, edge.Hostname(in), in)
	}
}

const benchHost = "bench.workers.localhost"

type bench struct {
	h      *runtimetest.Harness
	c      *selfhost.Client
	ctx    context.Context
	client *http.Client
	gen    int64
}

func setupBench(b *testing.B) *bench {
	h := runtimetest.Start(b)
	c, err := selfhost.New(h.Info.AdminURL, h.Info.TokenFile)
	require.NoError(b, err)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	b.Cleanup(cancel)
	x := &bench{h: h, c: c, ctx: ctx, client: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}, Timeout: 10 * time.Second}}
	x.deploy(b)
	_, err = c.PutRoute(ctx, benchHost, adminapi.RoutePut{EffectID: "route", ScriptName: "bench", EndpointUID: "ep", DeploymentID: "d"})
	require.NoError(b, err)
	return x
}

// deploy PUTs the next generation and waits until it serves.
func (x *bench) deploy(b *testing.B) adminapi.ScriptStatus {
	x.gen++
	gen := x.gen
	_, err := x.c.PutScript(x.ctx, "bench", adminapi.ScriptPut{
		EffectID: fmt.Sprintf("deploy-%d", gen), WorkerUID: "uid-bench", DeploymentID: fmt.Sprintf("d%d", gen), Generation: gen,
		Modules:    map[string]string{"main.js": fmt.Sprintf(`export default { fetch() { return new Response("generation %d\n"); } };`, gen)},
		MainModule: "main.js", CompatibilityDate: "2024-09-23",
	})
	require.NoError(b, err)
	var st adminapi.ScriptStatus
	require.Eventually(b, func() bool {
		got, err := x.c.GetScript(x.ctx, "bench")
		if err != nil {
			return false // a failed read is retried; the deadline reports it
		}
		st = got
		return st.Ready && st.Incarnation.Generation == gen
	}, time.Minute, 10*time.Millisecond, "generation %d never Ready", gen)
	return st
}

// load sends requests from workers goroutines for d and counts answers that are 200 and the
// rest.
func (x *bench) load(url, host string, workers int, d time.Duration) (ok, failed int64) {
	var okN, failedN atomic.Int64
	deadline := time.Now().Add(d)
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(deadline) {
				req, _ := http.NewRequest(http.MethodGet, url, nil)
				if host != "" {
					req.Host = host
				}
				resp, err := x.client.Do(req)
				if err != nil {
					failedN.Add(1)
					continue
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					okN.Add(1)
				} else {
					failedN.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	return okN.Load(), failedN.Load()
}

func window() time.Duration {
	if d, err := time.ParseDuration(os.Getenv("TAKOFORM_BENCH_WINDOW")); err == nil && d > 0 {
		return d
	}
	return 3 * time.Second
}

// BenchmarkEdgeVersusDirect measures requests per second through the edge and straight to the
// incarnation's workerd socket, for the same worker, and reports their ratio (target ≥ 0.8).
// Each run is one measurement of two fixed windows (TAKOFORM_BENCH_WINDOW, default 3s) with
// TAKOFORM_BENCH_CONCURRENCY requests in flight (default 4). The load generator runs in this process,
// on the same cores as the edge and workerd, so on a small machine it competes with what it measures.
func BenchmarkEdgeVersusDirect(b *testing.B) {
	x := setupBench(b)
	st, err := x.c.GetScript(x.ctx, "bench")
	require.NoError(b, err)
	direct := "http://" + st.Incarnation.Address + "/"
	viaEdge := "http://" + x.h.Info.EdgeAddr + "/"
	workers := 4
	if n, err := strconv.Atoi(os.Getenv("TAKOFORM_BENCH_CONCURRENCY")); err == nil && n > 0 {
		workers = n
	}
	for b.Loop() {
		x.load(direct, benchHost, workers, 300*time.Millisecond) // warm both paths' connections
		x.load(viaEdge, benchHost, workers, 300*time.Millisecond)
		d := window()
		directOK, directFailed := x.load(direct, benchHost, workers, d)
		edgeOK, edgeFailed := x.load(viaEdge, benchHost, workers, d)
		require.Zero(b, directFailed+edgeFailed)
		directRate, edgeRate := float64(directOK)/d.Seconds(), float64(edgeOK)/d.Seconds()
		b.ReportMetric(directRate, "direct-req/s")
		b.ReportMetric(edgeRate, "edge-req/s")
		b.ReportMetric(edgeRate/directRate, "edge/direct")
		b.Logf("%d concurrent: direct %.0f req/s, through the edge %.0f req/s: ratio %.2f", workers, directRate, edgeRate, edgeRate/directRate)
	}
}

// BenchmarkUpdateUnderLoad keeps a steady load on the edge while the worker is updated several
// times (candidate, Ready, switch, drain) and reports failed requests (target 0).
func BenchmarkUpdateUnderLoad(b *testing.B) {
	x := setupBench(b)
	viaEdge := "http://" + x.h.Info.EdgeAddr + "/"
	const updates = 5
	for b.Loop() {
		done := make(chan struct{})
		var ok, failed int64
		go func() {
			defer close(done)
			ok, failed = x.load(viaEdge, benchHost, 2, time.Duration(updates+1)*window()/2+2*time.Second)
		}()
		time.Sleep(500 * time.Millisecond)
		for range updates {
			x.deploy(b)
			time.Sleep(window() / 2)
		}
		<-done
		b.ReportMetric(float64(failed), "failed-requests")
		b.ReportMetric(float64(ok), "ok-requests")
		b.ReportMetric(updates, "updates")
		b.Logf("%d updates under load: %d requests answered, %d failed", updates, ok, failed)
	}
}
