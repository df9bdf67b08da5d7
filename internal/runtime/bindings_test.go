package runtime_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/runtime"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/adminapi"
	runtimeedge "github.com/takoform/terraform-provider-takoform/internal/runtime/edge"
	"github.com/takoform/terraform-provider-takoform/internal/workerconf"
)

const (
	calleeUID  = "0b9c6f1e-2f53-4d8e-9a3c-000000000001"
	callerUID  = "0b9c6f1e-2f53-4d8e-9a3c-000000000002"
	foreignUID = "0b9c6f1e-2f53-4d8e-9a3c-000000000003"
	spyUID     = "0b9c6f1e-2f53-4d8e-9a3c-000000000004"
	growUID    = "0b9c6f1e-2f53-4d8e-9a3c-000000000005"
)

// callerSource answers with what its AUTH binding answered.
const callerSource = `export default {
  async fetch(req, env) {
    const r = await env.AUTH.fetch("http://auth.internal/who");
    return new Response("via binding " + r.status + ": " + (await r.text()));
  }
};`

func (f *fixture) caller(name, uid, org string, generation int64, bindings map[string]string) adminapi.ScriptStatus {
	f.t.Helper()
	return f.callerOf(name, uid, org, generation, callerSource, bindings)
}

// callerOf deploys source as worker uid of org under name, with service bindings.
func (f *fixture) callerOf(name, uid, org string, generation int64, source string, bindings map[string]string) adminapi.ScriptStatus {
	f.t.Helper()
	p := f.scriptPut(uid, generation, "caller")
	p.Labels.Organization = org
	p.Modules = map[string]string{"main.js": source}
	p.Settings = workerconf.Settings{ServiceBindings: bindings}
	st, err := f.client.PutScript(f.ctx, name, p)
	require.NoError(f.t, err)
	return st
}

// A service binding reaches the callee's current Ready incarnation through the node (SPEC 3.6,
// 5.1): the callee's code update reaches the caller without restarting it, and a binding to
// another organization's worker reaches nothing.
func TestAServiceBindingReachesTheCalleesCurrentIncarnationWithoutRestartingTheCaller(t *testing.T) {
	t.Parallel()
	f := setup(t)
	f.script("callee", calleeUID, 1, "v1")
	f.waitReady("callee")
	f.caller("caller", callerUID, "org-1", 1, map[string]string{"AUTH": calleeUID})
	before := f.waitReady("caller")
	f.route("caller.test", "caller", "ep-caller")
	f.answers("caller.test", "via binding 200: "+expectReply("v1", ""))
	// Caller and callee are isolates of one process: the call ran there, never through the edge.
	metrics := f.metrics()
	require.Regexp(t, `takoform_runtime_binding_calls_total\{path="process"\} [1-9]`, metrics)
	require.Contains(t, metrics, "takoform_runtime_binding_calls_total{path=\"node\"} 0\n")

	f.script("callee", calleeUID, 2, "v2")
	f.waitStatus("callee at generation 2", func(s adminapi.ScriptStatus) bool { return s.Ready && s.Generation == 2 }, "callee")
	f.answers("caller.test", "via binding 200: "+expectReply("v2", ""))
	after, err := f.client.GetScript(f.ctx, "caller")
	require.NoError(t, err)
	require.Equal(t, before.Incarnation.ID, after.Incarnation.ID, "the caller runs the same incarnation")
	require.Equal(t, before.Incarnation.PID, after.Incarnation.PID, "the caller's process was not restarted")

	// Another organization's worker on the same node: the node will not route to it, whatever
	// the Host let through.
	foreign := f.scriptPut(foreignUID, 1, "secret")
	foreign.Labels.Organization = "org-2"
	_, err = f.client.PutScript(f.ctx, "foreign", foreign)
	require.NoError(t, err)
	f.waitReady("foreign")
	f.caller("spy", spyUID, "org-1", 1, map[string]string{"AUTH": foreignUID})
	f.waitReady("spy")
	f.route("spy.test", "spy", "ep-spy")
	code, body, _ := f.h.Get(t, "spy.test", "/")
	require.Equal(t, http.StatusOK, code)
	require.True(t, strings.HasPrefix(body, "via binding 503: "), "got %q", body)
	require.NotContains(t, body, "version=secret")

	// The binding changed to another worker is taken in place, and a binding whose callee is
	// gone answers 503 at once.
	f.caller("caller", callerUID, "org-1", 2, map[string]string{"AUTH": foreignUID})
	f.waitStatus("caller at generation 2", func(s adminapi.ScriptStatus) bool { return s.Ready && s.Generation == 2 }, "caller")
	code, body, _ = f.h.Get(t, "caller.test", "/")
	require.Equal(t, http.StatusOK, code)
	require.True(t, strings.HasPrefix(body, "via binding 503: "), "got %q", body)
}

// Each serving incarnation resolves its bindings with its own map (SPEC 3.6): a newer deployment
// that renames the binding and is held (it declares a secret not delivered yet) leaves the
// version still serving reaching its callee through the name it was built with.
func TestTheServingVersionKeepsItsOwnBindingsWhileANewerOneIsHeld(t *testing.T) {
	t.Parallel()
	f := setup(t)
	f.script("callee", calleeUID, 1, "v1")
	f.waitReady("callee")
	f.caller("caller", callerUID, "org-1", 1, map[string]string{"AUTH": calleeUID})
	v1 := f.waitReady("caller")
	f.route("caller.test", "caller", "ep-caller")
	f.answers("caller.test", "via binding 200: "+expectReply("v1", ""))

	p := f.scriptPut(callerUID, 2, "caller", "TOKEN")
	p.Modules = map[string]string{"main.js": strings.ReplaceAll(callerSource, "env.AUTH.", "env.AUTH2.")}
	p.Settings = workerconf.Settings{ServiceBindings: map[string]string{"AUTH2": calleeUID}}
	_, err := f.client.PutScript(f.ctx, "caller", p)
	require.NoError(t, err)
	st := f.waitStatus("caller's generation 2 held for its secret", func(s adminapi.ScriptStatus) bool {
		return s.Candidate != nil && s.Candidate.Generation == 2 && s.Candidate.State == adminapi.StateReady
	}, "caller")
	require.Equal(t, v1.Incarnation.ID, st.Incarnation.ID, "generation 1 still serves")
	code, body, _ := f.h.Get(t, "caller.test", "/")
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, "via binding 200: "+expectReply("v1", ""), body)
}

// A worker's limits.cpuMs bounds each request's wall time at the edge: past it, 504.
func TestAWorkersCPUMsLimitEndsItsRequestWith504(t *testing.T) {
	t.Parallel()
	f := setup(t)
	p := f.scriptPut(calleeUID, 1, "slow")
	p.Modules = map[string]string{"main.js": `export default {
  async fetch(req) {
    if (new URL(req.url).pathname === "/slow") await new Promise(r => setTimeout(r, 3000));
    return new Response("done");
  }
};`}
	p.Settings = workerconf.Settings{Limits: &workerconf.Limits{CPUMs: 500}}
	_, err := f.client.PutScript(f.ctx, "slow", p)
	require.NoError(t, err)
	f.waitReady("slow")
	f.route("slow.test", "slow", "ep-slow")
	f.answers("slow.test", "done")
	start := time.Now()
	code, body, _ := f.h.Get(t, "slow.test", "/slow")
	require.Equal(t, http.StatusGatewayTimeout, code, "body: %s", body)
	require.Less(t, time.Since(start), 2500*time.Millisecond)

	// Called through a service binding, in its caller's process, it is cut at the same limit.
	c := f.scriptPut(callerUID, 1, "caller")
	c.Modules = map[string]string{"main.js": `export default {
  async fetch(req, env) {
    const r = await env.SLOW.fetch("http://slow.internal/slow");
    return new Response("via binding " + r.status);
  }
};`}
	c.Settings = workerconf.Settings{ServiceBindings: map[string]string{"SLOW": calleeUID}}
	_, err = f.client.PutScript(f.ctx, "caller", c)
	require.NoError(t, err)
	f.waitReady("caller")
	f.route("caller.test", "caller", "ep-caller")
	start = time.Now()
	code, body, _ = f.h.Get(t, "caller.test", "/")
	require.Equal(t, http.StatusOK, code, "body: %s", body)
	require.Equal(t, "via binding 504", body)
	require.Less(t, time.Since(start), 2500*time.Millisecond)

	// Raised in place: the same request now finishes.
	p = f.scriptPut(calleeUID, 2, "slow")
	p.Modules["main.js"] = `export default {
  async fetch(req) {
    if (new URL(req.url).pathname === "/slow") await new Promise(r => setTimeout(r, 3000));
    return new Response("done");
  }
};`
	p.Settings = workerconf.Settings{Limits: &workerconf.Limits{CPUMs: 10000}}
	_, err = f.client.PutScript(f.ctx, "slow", p)
	require.NoError(t, err)
	f.waitStatus("slow at generation 2", func(s adminapi.ScriptStatus) bool { return s.Ready && s.Generation == 2 }, "slow")
	code, body, _ = f.h.Get(t, "slow.test", "/slow")
	require.Equal(t, http.StatusOK, code, "body: %s", body)
	require.Equal(t, "done", body)
}

// selfSource calls itself through its SELF binding: /once answers at once; /many makes 120 calls
// one after another; any other path goes one level deeper on each call, and the level where a
// call is refused says how and why.
const selfSource = `export default {
  async fetch(req, env) {
    const url = new URL(req.url);
    if (url.pathname === "/once") return new Response("once");
    if (url.pathname === "/many") {
      for (let i = 0; i < 120; i++) {
        const r = await env.SELF.fetch("http://self.internal/once");
        const text = await r.text();
        if (r.status !== 200 || text !== "once") return new Response("call " + i + ": " + r.status + " " + text);
      }
      return new Response("120 calls");
    }
    if (url.pathname === "/refused") {
      for (let i = 0; i < 60; i++) {
        const r = await env.GONE.fetch("http://gone.internal/");
        await r.text();
        if (r.status !== 503) return new Response("call " + i + " to a gone worker: " + r.status);
      }
      return new Response("60 refused");
    }
    const depth = Number(url.searchParams.get("depth") || 0);
    const r = await env.SELF.fetch("http://self.internal/?depth=" + (depth + 1));
    if (r.status === 200) return r;
    return new Response("refused at depth " + depth + ": " + r.status + " " + (await r.json()).code);
  }
};`

// A chain of binding calls run in the caller's process is counted as the edge counts its own
// (SPEC 5.1: call depth 16, then 508), and every call, once ended, is counted no longer: more
// calls one after another than a worker may have in flight all pass.
func TestBindingCallsInTheCallersProcessAreCountedUntilTheyEnd(t *testing.T) {
	t.Parallel()
	f := setup(t)
	p := f.scriptPut(callerUID, 1, "self")
	p.Modules = map[string]string{"main.js": selfSource}
	p.Settings = workerconf.Settings{ServiceBindings: map[string]string{"SELF": callerUID, "GONE": foreignUID}}
	_, err := f.client.PutScript(f.ctx, "self", p)
	require.NoError(t, err)
	f.waitReady("self")
	f.route("self.test", "self", "ep-self")
	refused := fmt.Sprintf("refused at depth %d: 508 %s", runtimeedge.MaxEgressLoop, adminapi.CodeLoopDetected)
	f.answers("self.test", refused)

	// Calls refused before they ran (their callee is gone) count no longer either: more of them
	// than a worker may have in flight, and then the worker calls itself as before.
	code, body, _ := f.h.Get(t, "self.test", "/refused")
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, "60 refused", body)

	// The chain's calls all ended: the worker calls itself again, more times one after another
	// than it may have calls in flight, and then loops into the same refusal.
	for range 2 {
		code, body, _ := f.h.Get(t, "self.test", "/many")
		require.Equal(t, http.StatusOK, code)
		require.Equal(t, "120 calls", body)
		code, body, _ = f.h.Get(t, "self.test", "/")
		require.Equal(t, http.StatusOK, code)
		require.Equal(t, refused, body)
	}
	require.Contains(t, f.metrics(), "takoform_runtime_binding_calls_total{path=\"node\"} 0\n")
}

// heapSource grows its JavaScript heap without end on /grow, and answers at once otherwise.
const heapSource = `const kept = [];
export default {
  async fetch(req) {
    if (new URL(req.url).pathname !== "/grow") return new Response("small");
    for (;;) kept.push(new Array(100000).fill({ x: Math.random() }));
  }
};`

// A worker past V8's heap limit ends its whole process (workerd aborts it), never another
// organization's: its organization's other workers come back at once, and it, implicated twice,
// runs alone from then on, so that only it pays for its next abort (SPEC 5.1).
func TestAWorkerPastTheHeapLimitEndsItsOrganizationsProcessAndThenRunsAlone(t *testing.T) {
	t.Parallel()
	f := setup(t, func(c *runtime.Config) { c.HeapLimitMB = 64 })
	f.orgScript("grow", "grower", growUID, heapSource)
	f.orgScript("sibling", "grower", "uid-sib", workerSource("sib"))
	f.orgScript("outsider", "other", "uid-out", workerSource("out"))
	f.caller("front", "uid-front", "grower", 1, map[string]string{"AUTH": growUID})
	f.servedAt("grow", "sibling", "outsider", "front")
	f.answers("grow.test", "small")

	// Another organization is served all the while.
	outsider := f.poll("outsider.test")
	for round := 1; round <= 2; round++ {
		code, body, _ := f.h.Get(t, "grow.test", "/grow")
		require.GreaterOrEqual(t, code, 500, "round %d: %d %s", round, code, body)
		f.waitStatus("grow back", func(s adminapi.ScriptStatus) bool {
			return s.Ready && s.Incarnation.Restarts >= round
		}, "grow")
		f.answers("sibling.test", expectReply("sib", ""))
	}
	st := f.waitReady("grow")
	require.True(t, st.Quarantined, "implicated twice within an hour")
	sibling := f.waitReady("sibling")
	require.NotEqual(t, st.Incarnation.PID, sibling.Incarnation.PID, "it runs in a process of its own")
	// Its organization's workers still reach it through their bindings, carried by the node to
	// its process.
	require.Contains(t, f.metrics(), "takoform_runtime_binding_calls_total{path=\"node\"} 0\n")
	f.answers("front.test", "via binding 200: small")
	require.Regexp(t, `takoform_runtime_binding_calls_total\{path="node"\} [1-9]`, f.metrics())

	// Now its abort is its own process's alone: its sibling keeps answering throughout.
	siblingPolls := f.poll("sibling.test")
	code, body, _ := f.h.Get(t, "grow.test", "/grow")
	require.GreaterOrEqual(t, code, 500, "%d %s", code, body)
	siblingCalls, outsiderCalls := siblingPolls.finish(), outsider.finish()
	require.NotEmpty(t, siblingCalls)
	require.Empty(t, failures(siblingCalls, time.Time{}), "a quarantined worker's abort stalls its organization no more")
	require.Empty(t, failures(outsiderCalls, time.Time{}), "another organization's worker failed")
	after, err := f.client.GetScript(f.ctx, "sibling")
	require.NoError(t, err)
	require.Equal(t, sibling.Incarnation.PID, after.Incarnation.PID, "the organization's process was not restarted")
}
