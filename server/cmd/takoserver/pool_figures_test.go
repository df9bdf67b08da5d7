package main_test

import (
	"fmt"
	"net/http"
	"os"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestPoolFigures measures a pool of runtime nodes on this machine (make bench-pool): a worker and
// its endpoint deployed until they answer on every node, on a pool of one and then of three; a
// node's join (nodes add to serving); a worker's destroy; and, once a node dies, how long until a
// deploy goes on without it (suspectAfterSeconds 2 here). It reports figures and asserts none: it
// runs only when TAKOFORM_BENCH_POOL is set.
func TestPoolFigures(t *testing.T) {
	if os.Getenv("TAKOFORM_BENCH_POOL") == "" {
		t.Skip("a measurement: make bench-pool runs it")
	}
	const workers = 10
	p := newPairOn(t, startPooledRuntime, `"suspectAfterSeconds": 2`, `"fenceSeconds": 1`)
	token := func(what string) string { return "token-figures-" + what + "-0000000000" }
	deploy := func(name string, nodes []node) (put, answered time.Duration) {
		start := time.Now()
		p.must(0, http.MethodPut, reservationsPath+"res-"+name, token("res-"+name), `{"space":"prod","workerName":"`+name+`"}`, http.StatusCreated)
		p.must(0, http.MethodPut, workerPath(name), token("worker-"+name), invariantWorker, http.StatusCreated)
		ep := p.must(1, http.MethodPut, endpointPath(name), token("endpoint-"+name), `{"worker":"`+name+`","originReservationId":"res-`+name+`"}`, http.StatusCreated)
		put = time.Since(start)
		for _, n := range nodes {
			require.Eventually(t, answers(t, n, ep["hostname"].(string), "ok"), 60*time.Second, 20*time.Millisecond)
		}
		return put, time.Since(start)
	}
	report := func(what string, ds []time.Duration) {
		slices.Sort(ds)
		t.Logf("%-58s n=%d  p50 %6.0f ms  max %6.0f ms", what, len(ds), float64(ds[len(ds)/2].Microseconds())/1000, float64(ds[len(ds)-1].Microseconds())/1000)
	}
	series := func(prefix string, nodes []node) {
		var puts, answers []time.Duration
		for i := range workers {
			put, answered := deploy(fmt.Sprintf("%s%d", prefix, i), nodes)
			puts, answers = append(puts, put), append(answers, answered)
		}
		report(fmt.Sprintf("pool of %d: reservation, worker, endpoint PUTs", len(nodes)), puts)
		report(fmt.Sprintf("pool of %d: ... until it answers on every node", len(nodes)), answers)
	}
	series("one", []node{p.node})

	nodeB, nodeC := p.member(t, "127.0.0.1:0"), p.member(t, "127.0.0.1:0")
	var joins []time.Duration
	for name, n := range map[string]node{"node-b": nodeB, "node-c": nodeC} {
		start := time.Now()
		run(t, p.dbURL, "nodes", "add", name, "--url", n.adminURL, "--config", p.catalog, "--installation", "selfhost")
		require.Eventually(t, func() bool {
			for _, m := range decodeJSON(t, run(t, p.dbURL, "nodes", "list", "--config", p.catalog, "--installation", "selfhost", "--output", "json"))["nodes"].([]any) {
				if m.(map[string]any)["name"] == name {
					return m.(map[string]any)["state"] == "serving"
				}
			}
			return false
		}, 120*time.Second, 100*time.Millisecond)
		joins = append(joins, time.Since(start))
	}
	report(fmt.Sprintf("nodes add to serving, holding %d workers", workers), joins)
	three := []node{p.node, nodeB, nodeC}
	series("three", three)

	var destroys []time.Duration
	for i := range workers {
		name := fmt.Sprintf("three%d", i)
		start := time.Now()
		p.must(0, http.MethodDelete, endpointPath(name), token("endpoint-"+name), "", http.StatusOK)
		p.must(0, http.MethodDelete, workerPath(name), token("worker-"+name), "", http.StatusOK)
		destroys = append(destroys, time.Since(start))
	}
	report("pool of 3: endpoint and worker DELETEs (absence on every node)", destroys)

	require.NoError(t, nodeC.cmd.Process.Signal(syscall.SIGKILL))
	_ = nodeC.cmd.Wait()
	start := time.Now()
	p.must(0, http.MethodPut, reservationsPath+"res-after", token("res-after"), `{"space":"prod","workerName":"after"}`, http.StatusCreated)
	tok := token("worker-after")
	require.Eventually(t, func() bool {
		a, err := p.send(0, http.MethodPut, workerPath("after"), tok, invariantWorker)
		return err == nil && (a.status == http.StatusCreated || a.status == http.StatusOK)
	}, 120*time.Second, 100*time.Millisecond)
	t.Logf("%-58s %6.0f ms", "a node killed: until a worker PUT goes on without it", float64(time.Since(start).Microseconds())/1000)
}
