package runtime_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/runtime"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/adminapi"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/edge"
)

// loopingSource serves / normally and never returns from /loop.
const loopingSource = `let served = 0;
export default {
  async fetch(req) {
    served++;
    if (new URL(req.url).pathname === "/loop") { while (true) {} }
    return new Response("served=" + served + "\n");
  }
};`

// selfCallingSource calls itself at its own hostname, through the node's edge, and answers what it
// got: a chain of requests that only the edge's loop detection ends.
const selfCallingSource = `export default {
  async fetch(req) {
    const u = new URL(req.url);
    const depth = Number(u.searchParams.get("depth") || "0");
    const r = await fetch("http://" + u.host + "/?depth=" + (depth + 1));
    const h = new Headers(r.headers);
    if (!h.has("x-depth")) h.set("x-depth", String(depth + 1));
    return new Response(r.body, { status: r.status, headers: h });
  }
};`

func (f *fixture) putSource(name, uid, source string) {
	f.t.Helper()
	put := f.scriptPut(uid, 1, "x")
	put.Modules = map[string]string{"main.js": source}
	_, err := f.client.PutScript(f.ctx, name, put)
	require.NoError(f.t, err)
}

func TestLoopingWorkerIsUnresponsiveRestartedAndItsStuckRequestEndsWith5xx(t *testing.T) {
	t.Parallel()
	// Shortened timings (defaults: every 5 s, 2 s each, so ~15 s): 3 misses of 500 ms probes
	// every second; a restart backoff long enough to read the reason.
	f := setup(t, func(c *runtime.Config) {
		c.LivenessPeriod, c.LivenessTimeout = time.Second, 500*time.Millisecond
		c.RestartBackoff, c.MaxRestartBackoff = 2*time.Second, 2*time.Second
	})
	f.putSource("spin", "uid-spin", loopingSource)
	f.route("spin.workers.localhost", "spin", "ep-spin")
	first := f.waitReady("spin")
	f.answers("spin.workers.localhost", "served=1\n")

	began := time.Now()
	type answer struct {
		code int
		err  error
	}
	stuck := make(chan answer, 1)
	go func() {
		code, _, _, err := f.h.TryGet("spin.workers.localhost", "/loop")
		stuck <- answer{code, err}
	}()
	st := f.waitStatus("unresponsive", func(s adminapi.ScriptStatus) bool {
		return !s.Ready && s.Reason == adminapi.ReasonUnresponsive
	}, "spin")
	notReady := time.Since(began)
	require.Contains(t, st.Incarnation.Message, "missed 3 liveness probes")
	require.Less(t, notReady, 6*time.Second, "one period to the first probe, then three missed probes")
	select {
	case a := <-stuck:
		require.NoError(t, a.err)
		require.GreaterOrEqual(t, a.code, 500, "the request stuck on the looping worker ends with a 5xx")
	case <-time.After(10 * time.Second):
		t.Log(f.h.Logs.String())
		t.Fatal("the request stuck on the looping worker still hangs")
	}
	st = f.waitStatus("restarted", func(s adminapi.ScriptStatus) bool {
		return s.Ready && s.Incarnation.PID != first.Incarnation.PID
	}, "spin")
	require.Equal(t, first.Incarnation.ID, st.Incarnation.ID, "continuity restarts the same incarnation")
	require.Equal(t, 1, st.Incarnation.Restarts, "the kill counts toward an incident")
	f.answers("spin.workers.localhost", "served=1\n")
	t.Logf("not Ready %s after the looping request began", notReady.Round(time.Millisecond))
}

func TestWorkerCallingItselfThroughTheEdgeEndsWith508(t *testing.T) {
	t.Parallel()
	f := setup(t)
	f.putSource("echo", "uid-echo", selfCallingSource)
	f.route("echo.workers.localhost", "echo", "ep-echo")
	f.waitReady("echo")

	began := time.Now()
	req, err := http.NewRequest(http.MethodGet, "http://"+f.h.Info.EdgeAddr+"/", nil)
	require.NoError(t, err)
	req.Host = "echo.workers.localhost"
	resp, err := (&http.Client{Timeout: 20 * time.Second}).Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	took := time.Since(began)
	require.Equal(t, http.StatusLoopDetected, resp.StatusCode, "%s", body)
	var p adminapi.Problem
	require.NoError(t, json.Unmarshal(body, &p))
	require.Equal(t, adminapi.CodeLoopDetected, p.Code)
	require.Equal(t, fmt.Sprint(edge.MaxEgressLoop+1), resp.Header.Get("X-Depth"),
		"the edge let %d calls from this node's egress through, and refused the next", edge.MaxEgressLoop)
	require.Less(t, took, 5*time.Second, "fast")
	// The node serves the worker again at once: nothing stays counted.
	st, err := f.client.GetScript(f.ctx, "echo")
	require.NoError(t, err)
	require.True(t, st.Ready)
	t.Logf("a worker calling itself through the edge ended with 508 in %s", took.Round(time.Millisecond))
}

// TestABusyWorkerThatAnswersIsNotKilledForLateProbes: under load a probe can come back late while
// the worker keeps answering requests; those answers witness that it is not stuck, so it is not
// killed. Once it answers nothing either, the missed probes kill it as before. (Probes here can
// never succeed: each is allowed one nanosecond.)
func TestABusyWorkerThatAnswersIsNotKilledForLateProbes(t *testing.T) {
	t.Parallel()
	f := setup(t, func(c *runtime.Config) {
		// A period long enough that a loaded machine's pause between two requests never spans
		// one whole period.
		c.LivenessPeriod, c.LivenessTimeout = time.Second, time.Nanosecond
		c.RestartBackoff, c.MaxRestartBackoff = 5*time.Second, 5*time.Second
	})
	f.putSource("busy", "uid-busy", loopingSource)
	f.route("busy.workers.localhost", "busy", "ep-busy")
	first := f.waitReady("busy")

	// Answering: four probe periods pass with every probe late, and the worker stays.
	for end := time.Now().Add(4 * time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		code, _, _, err := f.h.TryGet("busy.workers.localhost", "/")
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, code)
	}
	st, err := f.client.GetScript(f.ctx, "busy")
	require.NoError(t, err)
	require.True(t, st.Ready, "%s: %s", st.Reason, st.Incarnation.Message)
	require.Equal(t, first.Incarnation.PID, st.Incarnation.PID, "a worker that answers is not killed for late probes")

	// Silent: three late probes in a row with no answer between them, and it is killed.
	f.waitStatus("killed for missed probes", func(s adminapi.ScriptStatus) bool {
		return s.Reason == adminapi.ReasonUnresponsive || (s.Incarnation != nil && s.Incarnation.Restarts > 0)
	}, "busy")
}
